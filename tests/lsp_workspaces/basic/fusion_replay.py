"""Replays recorded fusion events through the worker's event sink, the same
path the fuselens compiler's scheduler reports through, so the language
server's fusion diagnostics are tested without a 15 s compile. The program
itself is compiled with the eager backend; the kernels below are what the
fuselens backend recorded for `body` (plus one Inductor-named kernel)."""
import torch

from fuselens import sink
from fuselens.events import FusionDecision, Kernel, SourceLocation


def line_of(marker):
    with open(__file__, encoding="utf-8") as f:
        for number, text in enumerate(f, 1):
            if text.rstrip().endswith(marker) and "line_of" not in text:
                return SourceLocation(file=__file__, line=number, function="body", code=text.strip())
    raise LookupError(marker)


@torch.compile(backend="eager")
def body(x, w):
    a = x * 2  # A
    b = a + 1  # B
    c = b @ w  # C
    return c.relu().sin()  # D


body(torch.randn(4, 4), torch.randn(4, 4))
A, B, C, D = (line_of(f"# {m}") for m in "ABCD")
sink.emit(Kernel(name="cpp_fused_add_mul_0", kind="cpp", backend="fuselens", graph_id="0/0:aot_inference",
                 ops=["aten.mul.Tensor", "aten.add.Tensor"], nodes=["mul", "add"], source_lines=[A, B],
                 source="extern \"C\" void cpp_fused_add_mul_0(const float* in_ptr0, float* out_ptr0) { /* ... */ }",
                 language="cpp", calls=1, total_time_us=12.5))
sink.emit(Kernel(name="extern_mm", kind="extern", backend="fuselens", graph_id="0/0:aot_inference",
                 ops=["aten.mm.default"], source_lines=[C], calls=1, total_time_us=30.0))
sink.emit(Kernel(name="triton_poi_fused_relu_sin_1", kind="triton", backend="inductor", graph_id="0/0:aot_inference",
                 source_lines=[D], source="@triton.jit\ndef triton_poi_fused_relu_sin_1(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr): ...",
                 language="python", calls=1, total_time_us=4.0))
sink.emit(FusionDecision(decision="not_fused", nodes=["add", "mm"], graph_id="0/0:aot_inference",
                         reason="mm is a library call; pointwise producers are not fused into it", rule="extern",
                         locations=[B, C]))
sink.emit(FusionDecision(decision="not_fused", nodes=["mm", "relu"], graph_id="0/0:aot_inference",
                         reason="the group would exceed max_fusion_size", rule="max-fusion-size",
                         locations=[C, D], option="max_fusion_size=128"))
