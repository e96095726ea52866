import { test } from "node:test";
import * as assert from "node:assert/strict";
import { statusView, summarizeDiagnostics, summaryFromAnalyzeAnswer, summaryFromNotification } from "../src/logic/status";

test("only fuselens diagnostics are counted, by their code", () => {
  const s = summarizeDiagnostics([
    { source: "fuselens", code: "graph-break", message: "Graph break: Tensor.item()" },
    { source: "fuselens", code: { value: "graph-break" }, message: "Graph break: print" },
    { source: "fuselens", code: "recompile", message: "Recompiled: x.size()[0] changed" },
    { source: "fuselens", code: "error", message: "program raised" },
    { source: "fuselens", code: "fusion", message: "3 kernels" },
    { source: "Pylance", code: "graph-break", message: "not ours" },
  ]);
  assert.deepEqual(s, { graphBreaks: 2, recompiles: 1, errors: 1 });
});

test("an analysisFinished notification gives its counts; a cancelled one, without counts, gives none", () => {
  assert.deepEqual(
    summaryFromNotification({ uri: "file:///a.py", status: "ok", cached: false, graphBreaks: 2, recompiles: 1, errors: 0, seconds: 3.5 }),
    { graphBreaks: 2, recompiles: 1, errors: 0, seconds: 3.5 },
  );
  assert.equal(summaryFromNotification({ uri: "file:///a.py", status: "cancelled", cached: false }), undefined);
});

test("the fuselens.analyze answer counts its error kinds; an answer without counts gives none", () => {
  assert.deepEqual(
    summaryFromAnalyzeAnswer({ status: "ok", cached: false, graph_breaks: 3, recompiles: 0, errors: ["timeout"], wall_s: 1.5 }),
    { graphBreaks: 3, recompiles: 0, errors: 1, seconds: 1.5 },
  );
  assert.equal(summaryFromAnalyzeAnswer({ status: "untrusted" }), undefined);
  assert.equal(summaryFromAnalyzeAnswer(null), undefined);
});

test("the status text names breaks and recompiles with singular and plural", () => {
  const v = statusView({ kind: "result", summary: { graphBreaks: 1, recompiles: 2, errors: 0 }, file: "a.py" });
  assert.equal(v.text, "$(warning) FuseLens: 1 break, 2 recompiles");
  assert.equal(v.severity, "warning");
});

test("a clean result shows a check and no background", () => {
  const v = statusView({ kind: "result", summary: { graphBreaks: 0, recompiles: 0, errors: 0, seconds: 1.25 } });
  assert.equal(v.text, "$(check) FuseLens: 0 breaks, 0 recompiles");
  assert.equal(v.severity, undefined);
  assert.match(v.tooltip, /in 1\.3 s|in 1\.2 s/);
});

test("errors turn the item red; a running analysis spins; restricted mode says why", () => {
  assert.equal(statusView({ kind: "result", summary: { graphBreaks: 0, recompiles: 0, errors: 1 } }).severity, "error");
  assert.match(statusView({ kind: "running", file: "t.py" }).text, /sync~spin/);
  assert.match(statusView({ kind: "restricted" }).tooltip, /Trust this folder/);
  assert.equal(statusView({ kind: "stopped", reason: "failed to start" }).severity, "error");
});
