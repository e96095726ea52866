import { test } from "node:test";
import * as assert from "node:assert/strict";
import { documentUriArg, isNotebookCellUri, reportPathFromResult } from "../src/logic/commandArgs";

test("the document URI is found as a string, a {uri} object or a textDocument", () => {
  assert.equal(documentUriArg(["file:///w/a.py"]), "file:///w/a.py");
  assert.equal(documentUriArg([{ uri: "file:///w/b.py", line: 3 }]), "file:///w/b.py");
  assert.equal(documentUriArg([{ textDocument: { uri: "file:///w/c.py" } }]), "file:///w/c.py");
  assert.equal(documentUriArg(["not a uri", 3]), undefined);
  assert.equal(documentUriArg([]), undefined);
});

test("a vscode.Uri-like argument is turned into its string", () => {
  const uriLike = { scheme: "file", toString: () => "file:///w/d.py" };
  assert.equal(documentUriArg([uriLike]), "file:///w/d.py");
});

test("writeReport may answer with a path, a file URI or {path}", () => {
  assert.equal(reportPathFromResult("/tmp/r.html"), "/tmp/r.html");
  assert.equal(reportPathFromResult("file:///tmp/my%20r.html"), "/tmp/my r.html");
  assert.equal(reportPathFromResult({ path: "/tmp/x.html" }), "/tmp/x.html");
  assert.throws(() => reportPathFromResult(null), /no report/);
});

test("notebook cell URIs are recognised", () => {
  assert.equal(isNotebookCellUri("vscode-notebook-cell:/w/nb.ipynb#W0sZmlsZQ%3D%3D"), true);
  assert.equal(isNotebookCellUri("file:///w/nb.ipynb"), false);
});
