import { test } from "node:test";
import * as assert from "node:assert/strict";
import {
  kernelArgsFromQuery,
  kernelChoices,
  kernelSourceText,
  kernelUriParts,
  vscodeLanguageId,
} from "../src/logic/kernelUri";

test("the server's lens arguments give the document and every kernel, its own first", () => {
  const choices = kernelChoices(["file:///w/a.py", "cpp_fused_sin_1", ["cpp_fused_cos_0", "cpp_fused_sin_1"]]);
  assert.deepEqual(choices, { uri: "file:///w/a.py", names: ["cpp_fused_sin_1", "cpp_fused_cos_0"] });
});

test("an object argument is accepted too", () => {
  assert.deepEqual(kernelChoices([{ uri: "file:///w/b.py", name: "triton_poi_0" }]), {
    uri: "file:///w/b.py",
    names: ["triton_poi_0"],
  });
});

test("kernel URI round-trips document and kernel through its query", () => {
  const parts = kernelUriParts("file:///w/a b.py", "cpp_fused_add_sin_0");
  assert.equal(parts.path, "/cpp_fused_add_sin_0");
  assert.deepEqual(kernelArgsFromQuery(parts.query), ["file:///w/a b.py", "cpp_fused_add_sin_0"]);
});

test("kernel names cannot escape the virtual path", () => {
  const p = kernelUriParts("file:///w/a.py", "../../etc/passwd").path;
  assert.ok(!p.includes("/../") && !p.slice(1).includes("/"), p);
});

test("a query that is not [uri, name] is rejected", () => {
  assert.throws(() => kernelArgsFromQuery(encodeURIComponent(JSON.stringify({ a: 1 }))), /documentUri, kernelName/);
  assert.throws(() => kernelArgsFromQuery(encodeURIComponent(JSON.stringify(["u", 3]))), /documentUri, kernelName/);
});

test("the server's answer gives text and a VS Code language; its error is shown", () => {
  assert.deepEqual(kernelSourceText("void k() {}"), { text: "void k() {}" });
  assert.deepEqual(kernelSourceText({ name: "k", source: "@triton.jit", language: "python", kind: "triton" }), {
    text: "@triton.jit",
    language: "python",
  });
  assert.deepEqual(kernelSourceText({ source: "extern void k();", language: "", kind: "cpp" }), {
    text: "extern void k();",
    language: "cpp",
  });
  assert.throws(() => kernelSourceText({ name: "x", source: "", error: "no such kernel in the latest analysis" }), /no such kernel/);
  assert.throws(() => kernelSourceText(null), /no kernel source/);
  assert.equal(vscodeLanguageId("C++"), "cpp");
  assert.equal(vscodeLanguageId("extern"), undefined);
});
