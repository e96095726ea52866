import { test } from "node:test";
import * as assert from "node:assert/strict";
import { makeNonce, reportCsp, withCsp } from "../src/logic/csp";

const REPORT = "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>r</title><style>body{}</style></head>" +
  "<body><main>x</main></body></html>";

test("the policy allows no script, no remote or local load, only the nonced style sheet", () => {
  const csp = reportCsp("N0nce");
  assert.match(csp, /default-src 'none'/);
  assert.match(csp, /script-src 'none'/);
  assert.match(csp, /style-src 'nonce-N0nce'/);
  assert.doesNotMatch(csp, /https?:|vscode-resource|unsafe-eval|\*/);
});

test("the policy is the head's first element and the report's style sheet carries the nonce", () => {
  const out = withCsp(REPORT, "abc");
  assert.ok(out.includes('<head><meta http-equiv="Content-Security-Policy" content="default-src \'none\''));
  assert.ok(out.includes('<style nonce="abc">body{}</style>'));
});

test("a style element injected into the body gets no nonce", () => {
  const out = withCsp(REPORT.replace("<main>x</main>", "<main><style>*{background:url(//evil)}</style></main>"), "abc");
  assert.equal(out.split('nonce="abc"').length, 2);
  assert.ok(out.includes("<main><style>*{background"));
});

test("a policy already in the file is replaced by ours", () => {
  const planted = REPORT.replace("<title>", "<meta http-equiv=\"Content-Security-Policy\" content=\"script-src *\"><title>");
  const out = withCsp(planted, "abc");
  assert.doesNotMatch(out, /script-src \*/);
});

test("nonces are fresh and long", () => {
  const a = makeNonce();
  assert.notEqual(a, makeNonce());
  assert.ok(Buffer.from(a, "base64").length >= 16);
});
