// A strict Content-Security-Policy for the report webview. The report is one
// self-contained file with no script (fuselens/report/html.py): the webview
// runs with scripts off, loads nothing remote or local, and applies only the
// report's own <style> element, marked with a fresh nonce per load. An
// escaping bug in the report could then inject neither script nor a style
// sheet that fetches anything.
import { randomBytes } from "node:crypto";

/** A fresh, unguessable nonce (base64 of 16 random bytes). */
export function makeNonce(): string {
  return randomBytes(16).toString("base64");
}

/** The policy: nothing by default; the nonced style sheet; data: images. Style
 * attributes (colour swatches) stay allowed: they can load nothing here. */
export function reportCsp(nonce: string): string {
  return [
    "default-src 'none'",
    `style-src 'nonce-${nonce}'`,
    "style-src-attr 'unsafe-inline'",
    "img-src data:",
    "script-src 'none'",
    "frame-src 'none'",
    "form-action 'none'",
    "base-uri 'none'",
  ].join("; ");
}

const META_CSP = /<meta\s+http-equiv\s*=\s*["']?content-security-policy["']?[^>]*>/gi;

/**
 * `html` with the policy as its first <head> element and the nonce on the
 * first <style> element of <head> only (the report's own; a <style> in the
 * body would be injected content and stays without one). A policy already in
 * the file is removed: ours is the one that holds.
 */
export function withCsp(html: string, nonce: string): string {
  const meta = `<meta http-equiv="Content-Security-Policy" content="${reportCsp(nonce)}">`;
  let out = html.replace(META_CSP, "");
  const headEnd = out.search(/<\/head>/i);
  const head = out.search(/<head(\s[^>]*)?>/i);
  if (head >= 0) {
    const close = out.indexOf(">", head) + 1;
    out = out.slice(0, close) + meta + out.slice(close);
  } else {
    out = meta + out;
  }
  const styleLimit = headEnd >= 0 ? out.search(/<\/head>/i) : -1;
  const style = out.search(/<style(\s[^>]*)?>/i);
  if (style >= 0 && (styleLimit < 0 || style < styleLimit)) {
    out = out.slice(0, style + "<style".length) + ` nonce="${nonce}"` + out.slice(style + "<style".length);
  }
  return out;
}
