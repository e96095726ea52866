import { test } from "node:test";
import * as assert from "node:assert/strict";
import {
  DEFAULT_SETTINGS,
  initializationOptions,
  normaliseInterpreter,
  readSettings,
  enforceTrust,
  settingsChangeAction,
} from "../src/logic/settings";

test("missing settings fall back to the documented defaults", () => {
  assert.deepEqual(readSettings(() => undefined), DEFAULT_SETTINGS);
});

test("ill-typed settings from a hand-edited settings.json become defaults", () => {
  const raw: Record<string, unknown> = { runOn: "sometimes", timeout: "10", maxCalls: 2.5, inlayHints: "no", backend: 3 };
  const s = readSettings((k) => raw[k]);
  assert.equal(s.runOn, "save");
  assert.equal(s.timeout, 120);
  assert.equal(s.maxCalls, 3);
  assert.equal(s.inlayHints, true);
  assert.equal(s.backend, "");
});

test("valid settings pass through trimmed", () => {
  const raw: Record<string, unknown> = {
    interpreter: ["/venv/bin/python ", "-X", ""],
    runOn: "manual",
    entry: " train.py ",
    backend: "eager",
    timeout: 30,
    maxCalls: 0,
    inlayHints: false,
  };
  assert.deepEqual(readSettings((k) => raw[k]), {
    interpreter: ["/venv/bin/python", "-X"],
    runOn: "manual",
    entry: "train.py",
    backend: "eager",
    timeout: 30,
    maxCalls: 0,
    inlayHints: false,
  });
});

test("a single interpreter string is accepted like a one-element list", () => {
  assert.deepEqual(normaliseInterpreter("/usr/bin/python3"), ["/usr/bin/python3"]);
  assert.deepEqual(normaliseInterpreter("  "), []);
  assert.deepEqual(normaliseInterpreter(42), []);
});

test("initialization options carry workspace trust beside every setting", () => {
  const opts = initializationOptions({ ...DEFAULT_SETTINGS, backend: "eager" }, false, "/ws");
  assert.equal(opts.trusted, false);
  assert.equal(opts.backend, "eager");
  assert.equal(opts.workspaceFolder, "/ws");
  assert.deepEqual(Object.keys(opts).sort(), [...Object.keys(DEFAULT_SETTINGS), "trusted", "workspaceFolder"].sort());
});

test("changing a server setting restarts the server, other sections do not", () => {
  assert.equal(settingsChangeAction((s) => s === "fuselens.backend"), "restart");
  assert.equal(settingsChangeAction((s) => s === "fuselens.interpreter"), "restart");
  assert.equal(settingsChangeAction((s) => s === "fuselens.trace.server"), "none");
  assert.equal(settingsChangeAction((s) => s === "editor.fontSize"), "none");
});

test("a workspace's own fuselens.trusted cannot override workspace trust", () => {
  assert.deepEqual(enforceTrust("fuselens", { trusted: true, backend: "eager" }, false), { trusted: false, backend: "eager" });
  assert.deepEqual(enforceTrust("fuselens", { backend: "" }, true), { backend: "", trusted: true });
  assert.equal(enforceTrust("fuselens.trusted", true, false), false);
  assert.deepEqual(enforceTrust(undefined, { "fuselens.trusted": true, fuselens: { trusted: true } }, false), {
    fuselens: { trusted: false },
  });
});

test("other sections pass through unchanged", () => {
  const editor = { fontSize: 12 };
  assert.equal(enforceTrust("editor", editor, false), editor);
  assert.equal(enforceTrust("fuselens", null, false), null);
});
