import { test } from "node:test";
import * as assert from "node:assert/strict";
import { chooseInterpreter, isInside, serverCommandLine, startFailure } from "../src/logic/interpreter";

const base = { setting: [], trusted: true, workspaceFolders: ["/home/u/proj"], platform: "linux" as NodeJS.Platform };

test("the fuselens.interpreter setting wins over the Python extension", () => {
  const c = chooseInterpreter({ ...base, setting: ["/opt/py/bin/python", "-X", "dev"], pythonExtension: "/usr/bin/python3.11" });
  assert.deepEqual(c, { command: ["/opt/py/bin/python", "-X", "dev"], source: "setting" });
});

test("without a setting the Python extension's environment is used", () => {
  const c = chooseInterpreter({ ...base, pythonExtension: "/home/u/proj/.venv/bin/python" });
  assert.deepEqual(c.command, ["/home/u/proj/.venv/bin/python"]);
  assert.equal(c.source, "python-extension");
});

test("a virtualenv inside a restricted workspace is never started", () => {
  const c = chooseInterpreter({ ...base, trusted: false, pythonExtension: "/home/u/proj/.venv/bin/python" });
  assert.deepEqual(c.command, ["python3"]);
  assert.equal(c.source, "default");
  assert.match(c.note ?? "", /restricted workspace/);
});

test("an interpreter outside a restricted workspace is still fine", () => {
  const c = chooseInterpreter({ ...base, trusted: false, pythonExtension: "/usr/bin/python3.11" });
  assert.deepEqual(c.command, ["/usr/bin/python3.11"]);
});

test("without setting or Python extension it is python3, python on Windows", () => {
  assert.deepEqual(chooseInterpreter(base).command, ["python3"]);
  assert.deepEqual(chooseInterpreter({ ...base, platform: "win32" }).command, ["python"]);
});

test("the server runs as <python> -m fuselens server, keeping interpreter arguments", () => {
  assert.deepEqual(serverCommandLine(["py", "-3.11"]), { command: "py", args: ["-3.11", "-m", "fuselens", "server"] });
});

test("isInside compares whole path components", () => {
  assert.equal(isInside("/a/b/c", "/a/b"), true);
  assert.equal(isInside("/a/b", "/a/b"), true);
  assert.equal(isInside("/a/bc/d", "/a/b"), false);
  assert.equal(isInside("/a", "/a/b"), false);
});

test("restricted mode with the workspace venv skipped says analysis waits for trust, not to set a setting", () => {
  const c = chooseInterpreter({ ...base, trusted: false, pythonExtension: "/home/u/proj/.venv/bin/python" });
  const failure = startFailure(c, false);
  assert.match(failure.message, /Restricted Mode/);
  assert.match(failure.message, /waits until you trust this folder/);
  assert.doesNotMatch(failure.message, /fuselens\.interpreter/);
  assert.deepEqual(failure.actions, { "Manage Workspace Trust": "workbench.trust.manage" });
});

test("once trusted, the same workspace venv is chosen and a failure points at the interpreter setting", () => {
  const c = chooseInterpreter({ ...base, trusted: true, pythonExtension: "/home/u/proj/.venv/bin/python" });
  assert.deepEqual(c.command, ["/home/u/proj/.venv/bin/python"]);
  assert.equal(c.waitsForTrust, undefined);
  assert.match(startFailure(c, true).message, /Set fuselens\.interpreter/);
});
