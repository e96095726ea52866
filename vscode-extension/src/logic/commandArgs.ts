// Reading arguments that code lenses pass to client commands and results
// that server commands return. Pure: both sides are JSON.

/**
 * The document URI among command arguments: a string URI, an object with a
 * `uri` (or `textDocument.uri`) field, or a vscode.Uri-like object with
 * `toString()` and a `scheme`. Undefined when there is none (the palette).
 */
export function documentUriArg(args: readonly unknown[]): string | undefined {
  for (const a of args) {
    if (typeof a === "string" && /^[a-z][a-z0-9+.-]*:/i.test(a)) {
      return a;
    }
    if (a && typeof a === "object") {
      const o = a as { uri?: unknown; textDocument?: { uri?: unknown }; scheme?: unknown };
      if (typeof o.uri === "string") {
        return o.uri;
      }
      if (o.textDocument && typeof o.textDocument.uri === "string") {
        return o.textDocument.uri;
      }
      if (typeof o.scheme === "string" && typeof (a as object).toString === "function") {
        return String(a);
      }
    }
  }
  return undefined;
}

/** A report file written by `fuselens.writeReport`. */
export interface ReportFile {
  path: string;
  /** "html", or "json" when the server could not render HTML. */
  format: string;
}

/**
 * Reads `fuselens.writeReport`'s answer: `{path, uri, format}`, `{error}`, or
 * a bare path / file URI. Throws with the server's message when it wrote none.
 */
export function reportFromResult(result: unknown): ReportFile {
  const fromPath = (p: string): ReportFile => ({ path: p, format: p.toLowerCase().endsWith(".json") ? "json" : "html" });
  if (typeof result === "string" && result) {
    return fromPath(result.startsWith("file://") ? decodeURIComponent(result.slice("file://".length)) : result);
  }
  if (result && typeof result === "object") {
    const r = result as { path?: unknown; uri?: unknown; format?: unknown; error?: unknown };
    let file: ReportFile | undefined;
    if (typeof r.path === "string" && r.path) {
      file = fromPath(r.path);
    } else if (typeof r.uri === "string" && r.uri.startsWith("file://")) {
      file = fromPath(decodeURIComponent(r.uri.slice("file://".length)));
    }
    if (file) {
      return typeof r.format === "string" && r.format ? { ...file, format: r.format } : file;
    }
    if (typeof r.error === "string" && r.error) {
      throw new Error(r.error);
    }
  }
  throw new Error("the server wrote no report (run an analysis of this file first)");
}

/**
 * Cell documents of a notebook have `vscode-notebook-cell:` URIs; the server
 * analyses the notebook file, so commands send the notebook's URI.
 */
export function isNotebookCellUri(uri: string): boolean {
  return uri.startsWith("vscode-notebook-cell:");
}

/**
 * The form of a URI sent to the server. VS Code percent-encodes the `=` of
 * a cell URI's base64 fragment (`#W0sZmlsZQ%3D%3D`); pygls keys its documents
 * by a normalised URI (`#W0sZmlsZQ==`) while a notebook's cell list keeps the
 * string as sent, so a server looking cells up by that string finds none.
 * Sending the fragment decoded makes both forms one. Other URIs are unchanged.
 */
export function uriForServer(encoded: string): string {
  if (!isNotebookCellUri(encoded)) {
    return encoded;
  }
  const hash = encoded.indexOf("#");
  if (hash < 0) {
    return encoded;
  }
  let fragment: string;
  try {
    fragment = decodeURIComponent(encoded.slice(hash + 1));
  } catch {
    return encoded;
  }
  // Only base64-like fragments are safe to send undecoded.
  return /^[A-Za-z0-9+/=_-]*$/.test(fragment) ? `${encoded.slice(0, hash)}#${fragment}` : encoded;
}
