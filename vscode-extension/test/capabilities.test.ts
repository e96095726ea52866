import { test } from "node:test";
import * as assert from "node:assert/strict";
import { preferPushDiagnostics } from "../src/logic/capabilities";

test("pull diagnostics are not offered, so notebook cells get pushed diagnostics", () => {
  const caps = {
    textDocument: { diagnostic: { dynamicRegistration: true }, codeLens: { dynamicRegistration: true } },
    workspace: { diagnostics: { refreshSupport: true }, codeLens: { refreshSupport: true } },
  };
  preferPushDiagnostics(caps);
  assert.deepEqual(caps, {
    textDocument: { codeLens: { dynamicRegistration: true } },
    workspace: { codeLens: { refreshSupport: true } },
  });
});

test("capabilities without those sections are left alone", () => {
  assert.deepEqual(preferPushDiagnostics({}), {});
});
