import { test } from "node:test";
import * as assert from "node:assert/strict";
import { commandLine, profilerArgv, quoteArg, shellKind } from "../src/logic/shell";

test("the shell kind follows the terminal's shell path", () => {
  assert.equal(shellKind("/bin/bash", "linux"), "posix");
  assert.equal(shellKind("C:\\Program Files\\PowerShell\\7\\pwsh.exe", "win32"), "powershell");
  assert.equal(shellKind("C:\\Windows\\System32\\cmd.exe", "win32"), "cmd");
  assert.equal(shellKind(undefined, "win32"), "powershell");
  assert.equal(shellKind(undefined, "darwin"), "posix");
});

test("posix quoting leaves plain words alone and survives quotes and spaces", () => {
  assert.equal(quoteArg("/usr/bin/python3", "posix"), "/usr/bin/python3");
  assert.equal(quoteArg("my model.py", "posix"), "'my model.py'");
  assert.equal(quoteArg("it's.py", "posix"), "'it'\\''s.py'");
  assert.equal(quoteArg("$(rm -rf ~).py", "posix"), "'$(rm -rf ~).py'");
  assert.equal(quoteArg("", "posix"), "''");
});

test("powershell needs the call operator for a quoted executable", () => {
  assert.equal(commandLine(["C:\\py\\python.exe", "-m", "fuselens"], "powershell"), "& 'C:\\py\\python.exe' '-m' 'fuselens'");
  assert.equal(quoteArg("it's", "powershell"), "'it''s'");
});

test("cmd quotes only what needs it", () => {
  assert.equal(quoteArg("C:\\My Files\\a.py", "cmd"), '"C:\\My Files\\a.py"');
  assert.equal(quoteArg("a.py", "cmd"), "a.py");
});

test("the profiler runs fuselens tui on the file with the server's interpreter", () => {
  assert.deepEqual(profilerArgv(["/venv/bin/python"], "/w/train.py"), ["/venv/bin/python", "-m", "fuselens", "tui", "/w/train.py"]);
  assert.equal(commandLine(profilerArgv(["python3"], "/w/my train.py"), "posix"), "python3 -m fuselens tui '/w/my train.py'");
});
