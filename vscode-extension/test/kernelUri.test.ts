import { test } from "node:test";
import * as assert from "node:assert/strict";
import { kernelArgsFromQuery, kernelSourceText, kernelUriParts, vscodeLanguageId } from "../src/logic/kernelUri";

test("kernel URI round-trips the code lens arguments through its query", () => {
  const args = [{ name: "cpp_fused_add_sin_0", graph_id: "0/0:aot_inference", language: "cpp", uri: "file:///w/a b.py" }];
  const parts = kernelUriParts(args);
  assert.equal(parts.path, "/0_0:aot_inference/cpp_fused_add_sin_0.cpp");
  assert.deepEqual(kernelArgsFromQuery(parts.query), args);
});

test("a Triton kernel opens as Python, an unknown language without extension", () => {
  assert.equal(kernelUriParts([{ name: "triton_poi_0", kind: "triton" }]).path, "/triton_poi_0.py");
  assert.equal(kernelUriParts(["extern_mm"]).path, "/extern_mm");
});

test("kernel names cannot escape the virtual path", () => {
  const p = kernelUriParts([{ name: "../../etc/passwd" }]).path;
  assert.ok(!p.includes("/../"), p);
  assert.ok(!p.includes("/etc/"), p);
});

test("a query that is not an argument list is rejected", () => {
  assert.throws(() => kernelArgsFromQuery(encodeURIComponent(JSON.stringify({ a: 1 }))), /argument list/);
});

test("the server may answer with a string or with source and language", () => {
  assert.deepEqual(kernelSourceText("void k() {}"), { text: "void k() {}" });
  assert.deepEqual(kernelSourceText({ source: "@triton.jit", language: "triton" }), { text: "@triton.jit", language: "python" });
  assert.throws(() => kernelSourceText(null), /no kernel source/);
  assert.equal(vscodeLanguageId("C++"), "cpp");
  assert.equal(vscodeLanguageId("extern"), undefined);
});
