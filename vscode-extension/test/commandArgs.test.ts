import { test } from "node:test";
import * as assert from "node:assert/strict";
import { documentUriArg, isNotebookCellUri, reportFromResult, uriForServer } from "../src/logic/commandArgs";

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

test("writeReport's {path, format} answer is read, JSON reports are recognised", () => {
  assert.deepEqual(reportFromResult({ path: "/tmp/s/a-report.html", uri: "file:///tmp/s/a-report.html", format: "html" }), {
    path: "/tmp/s/a-report.html",
    format: "html",
  });
  assert.deepEqual(reportFromResult({ path: "/tmp/s/a-report.json", format: "json" }).format, "json");
  assert.deepEqual(reportFromResult("file:///tmp/my%20r.html"), { path: "/tmp/my r.html", format: "html" });
  assert.deepEqual(reportFromResult({ uri: "file:///tmp/x.json" }), { path: "/tmp/x.json", format: "json" });
});

test("writeReport's error is passed on to the user", () => {
  assert.throws(() => reportFromResult({ error: "no analysis for this document yet" }), /no analysis for this document yet/);
  assert.throws(() => reportFromResult(null), /no report/);
});

test("notebook cell URIs are recognised", () => {
  assert.equal(isNotebookCellUri("vscode-notebook-cell:/w/nb.ipynb#W0sZmlsZQ%3D%3D"), true);
  assert.equal(isNotebookCellUri("file:///w/nb.ipynb"), false);
});

test("cell URIs reach the server with their base64 fragment decoded, others unchanged", () => {
  assert.equal(
    uriForServer("vscode-notebook-cell:/w/my%20nb.ipynb#W0sZmlsZQ%3D%3D"),
    "vscode-notebook-cell:/w/my%20nb.ipynb#W0sZmlsZQ==",
  );
  assert.equal(uriForServer("vscode-notebook-cell:/w/nb.ipynb#W1sZmlsZQ"), "vscode-notebook-cell:/w/nb.ipynb#W1sZmlsZQ");
  assert.equal(uriForServer("vscode-notebook-cell:/w/nb.ipynb#a%20b"), "vscode-notebook-cell:/w/nb.ipynb#a%20b");
  assert.equal(uriForServer("file:///w/a%3Db.py"), "file:///w/a%3Db.py");
});
