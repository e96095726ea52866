"""The Triton code generator, run on CPU in Triton's interpreter.

Every kernel kind (1-D and 2-D pointwise, persistent, looped and online-softmax
reductions, multi-reduction layernorm), the math mapping, bfloat16, dynamic
shapes, integer semantics, events, autotuning and timing go through
`backend="fuselens"` with `target="triton"` and are compared to eager.

TRITON_INTERPRET must be set before triton is first imported, and another test
module may already have imported it in this pytest process, so the cases run
in ONE subprocess (this file executed as a script writes a JSON record per
case); the tests below read those records. No GPU here: the CUDA-only paths
(CUDA graphs, CUDA-event timing) are exercised by benchmarks/gpu_check.py on
the device; the autotuner's timer is replaced by a deterministic fake (the edge
we cannot run here) to prove the choice and its on-disk cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
from triton_worker import interpreted_worker_records

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------------
# the worker (runs in a subprocess with TRITON_INTERPRET=1)
# --------------------------------------------------------------------------------------------
def _worker(out_path: str) -> None:  # pragma: no cover - runs in the subprocess
    import math
    import tempfile

    import torch

    import fuselens.compiler  # noqa: F401
    from fuselens import sink
    from fuselens.events import FusionDecision, Kernel, KernelTiming

    torch.manual_seed(0)
    records: dict[str, Any] = {}
    cache = tempfile.mkdtemp(prefix="fl_triton_test_")

    def compile_run(fn: Callable, args: tuple, target: str = "triton", dynamic: Any = None, **opts: Any):
        torch._dynamo.reset()
        options = {"target": target, "fallback_on_error": False, "cache_dir": cache, **opts}
        c = torch.compile(fn, backend="fuselens", options=options, dynamic=dynamic)
        with sink.collect() as events:
            out = c(*args)
        return c, out, events

    def case(name: str, fn: Callable, args: tuple, rtol: float = 1e-5, atol: float = 1e-5, **kw: Any) -> None:
        try:
            _, out, events = compile_run(fn, args, **kw)
            ref = fn(*args)
            outs = out if isinstance(out, (tuple, list)) else [out]
            refs = ref if isinstance(ref, (tuple, list)) else [ref]
            err = ""
            for o, r in zip(outs, refs):
                try:
                    torch.testing.assert_close(o, r, rtol=rtol, atol=atol, equal_nan=True)
                except AssertionError as e:
                    err = str(e)[:500]
            ks = [e for e in events if isinstance(e, Kernel) and e.kind == "triton"]
            records[name] = {
                "ok": not err, "err": err,
                "kinds": [k.source.split('"""')[1].split(":")[0] for k in ks],
                "sources": [k.source for k in ks], "languages": [k.language for k in ks],
                "fallbacks": [e.message for e in events if type(e).__name__ == "ErrorEntry"],
                "externs": [k.ops[0] for k in events if isinstance(k, Kernel) and k.kind == "extern"],
                "epilogues": [d.reason for d in events if isinstance(d, FusionDecision) and d.rule == "extern-epilogue"],
                "once": [d.nodes[0] for d in events if isinstance(d, FusionDecision)
                         and d.rule == "module-state-prologue"],
            }
        except Exception as e:  # noqa: BLE001 - record, the test reports it
            import traceback

            records[name] = {"ok": False, "err": f"{type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}",
                             "kinds": [], "sources": [], "languages": [], "fallbacks": []}

    F = torch.nn.functional
    x1k = torch.randn(1000)
    case("pointwise_1d", lambda x: torch.sin(x) ** 2 + torch.cos(x) ** 2, (x1k,))
    case("pointwise_2d_transpose", lambda x: (x.t() * 2).contiguous(), (torch.randn(40, 50),))
    xcl = torch.randn(2, 16, 5, 6).to(memory_format=torch.channels_last)
    case("pointwise_channels_last", lambda x: torch.relu(x * 2 + 1), (xcl,))
    case("persistent_softmax", lambda x: torch.softmax(x, -1), (torch.randn(8, 100),))
    case("looped_sum", lambda x: x.sum(-1), (torch.randn(3, 20000),), rtol=1e-4, atol=1e-3)
    case("online_softmax", lambda x: torch.softmax(x, -1), (torch.randn(3, 20000),))

    def softmax_masked_by_ones(x):  # a Hugging Face model without an attention mask: folded to one number
        ones = torch.ones(x.shape[0], x.shape[-1], dtype=x.dtype)
        keep = (ones[:, None, :] * ones[:, :, None]) != 0
        return torch.softmax(x.masked_fill(~keep[:, None], torch.finfo(x.dtype).min), -1)

    def causal_and_ones(x):  # BioGPT's mask: a causal test and a mask of float ones made bool
        n = x.shape[-1]
        keep = (torch.arange(n)[None, :] <= torch.arange(n)[:, None]) & torch.ones(n, n).bool()
        return torch.where(keep, x, float("-inf")).softmax(-1)

    def kv_cache_update(cache, pos, k):  # a static KV cache's write at the decoded position
        return cache.index_copy(2, pos, k) * 2

    edges = torch.tensor([-1.0, 0.0, 0.0, 1.0])  # bucketize's binary search starts at an index of constants alone
    case("bucketize_both_sides", lambda v: torch.bucketize(v, edges) * 10 + torch.bucketize(v, edges, right=True),
         (torch.randn(4, 10).round(),))
    case("index_put_kv_cache", kv_cache_update, (torch.randn(1, 2, 16, 8), torch.tensor([5]), torch.randn(1, 2, 1, 8)))
    case("softmax_masked_by_ones", softmax_masked_by_ones, (torch.randn(2, 4, 16, 16).to(torch.bfloat16),),
         rtol=1e-2, atol=1e-2)
    case("causal_mask_of_ones", causal_and_ones, (torch.randn(2, 16, 16),))
    case("layernorm", lambda x, w, b: F.layer_norm(x, (64,), w, b), (torch.randn(6, 64), torch.randn(64), torch.randn(64)),
         rtol=1e-4, atol=1e-4)
    # rows far from zero: E[x^2] - E[x]^2 in the GPU's float32 accumulators would cancel
    # (0.6 off at mean 1000); the Triton path takes the two-pass variance
    xo, wo, bo = torch.randn(6, 256) + 1000, torch.randn(256), torch.randn(256)
    case("layernorm_offset_rows", lambda x, w, b: F.layer_norm(x, (256,), w, b), (xo, wo, bo), rtol=1e-4, atol=2e-3)
    case("looped_var_offset_rows", lambda x: x.var(-1), (torch.randn(3, 20000) + 1000,), rtol=1e-3, atol=1e-3)
    # two BatchNorm-like moments over other tensors in one kernel (horizontally fused): one Welford loop for both
    case("welford_two_tensors_one_loop", lambda a, b: (a.var(-1), b.var(-1), a.mean(-1)),
         (torch.randn(3, 20000) + 1000, torch.randn(3, 20000) - 50), rtol=1e-3, atol=1e-3)
    # float32 rows of 4096-8191 elements, many of them: layernorm's moments in one Welford loop, then
    # the normalising loop (the row-count threshold is lowered here to keep the interpreter fast)
    from fuselens.compiler.codegen import triton as tg

    saved, tg.WELFORD_MIN_XNUMEL = tg.WELFORD_MIN_XNUMEL, 2
    try:
        xw, ww, bw = torch.randn(4, 4096) + 1000, torch.randn(4096), torch.randn(4096)
        case("welford_layernorm", lambda x, w, b: F.layer_norm(x, (4096,), w, b), (xw, ww, bw), rtol=1e-4, atol=2e-3)
        xr, wr, br = torch.randn(3, 5000), torch.randn(5000), torch.randn(5000)
        case("welford_layernorm_ragged", lambda x, w, b: F.layer_norm(x, (5000,), w, b), (xr, wr, br),
             rtol=1e-4, atol=1e-4)
        case("softmax_4096_rows", lambda x: torch.softmax(x, -1), (torch.randn(2, 4096),))

        def stored_then_normed(x, w, b):  # y is written by the first pass: that pass needs its own loop
            y = x * 2 + 1
            return y, F.layer_norm(y, (4096,), w, b)

        case("welford_not_when_a_pass_stores", stored_then_normed, (torch.randn(4, 4096), ww, bw), rtol=1e-4, atol=1e-4)
    finally:
        tg.WELFORD_MIN_XNUMEL = saved
    # with the real threshold, few rows stay persistent (faster there: 256x4096 0.0067 vs 0.0086 ms)
    case("layernorm_4096_few_rows", lambda x, w, b: F.layer_norm(x, (4096,), w, b),
         (torch.randn(4, 4096), torch.randn(4096), torch.randn(4096)), rtol=1e-4, atol=1e-4)
    # library epilogues (library_epilogues.py), inference only. On CPU tensors ATen's
    # _addmm_activation applies erf-GELU, so only ReLU is rewritten here; cuDNN's fused
    # convolution runs on the GPU (benchmarks/gpu_check.py), ATen's conv+add+relu here.
    lin, lin2 = torch.nn.Linear(24, 40), torch.nn.Linear(40, 8)

    def mlp(x):
        return lin2(torch.relu(lin(x))), F.gelu(lin(x), approximate="tanh")

    with torch.no_grad():
        case("linear_relu_epilogue", mlp, (torch.randn(3, 5, 24),), rtol=1e-5, atol=1e-5)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):  # the matmul's dtype changes: no rewrite
        case("linear_relu_autocast_untouched", lambda x: torch.relu(lin(x)), (torch.randn(3, 24),),
             rtol=1.6e-2, atol=1e-2)
    sys.path.insert(0, str(ROOT / "tests"))
    from models import BasicBlock, seeded

    block = seeded(lambda: BasicBlock(8)).eval()
    for bn in (block.bn1, block.bn2):  # non-trivial running statistics, so a wrong fold shows
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.data.uniform_(0.5, 1.5)
        bn.bias.data.uniform_(-0.5, 0.5)
    with torch.no_grad():
        # the fold's kernels over the weights at every call, as with CUDA graphs
        case("conv_bn_relu_folded", block, (torch.randn(2, 8, 10, 10).to(memory_format=torch.channels_last),),
             rtol=1e-4, atol=1e-4, module_state_once="never")
        case("conv_bn_relu_folded_once", block, (torch.randn(2, 8, 10, 10).to(memory_format=torch.channels_last),),
             rtol=1e-4, atol=1e-4)
    case("conv_bn_relu_with_grad_untouched", block, (torch.randn(2, 8, 10, 10),), rtol=1e-4, atol=1e-4)
    case("full_reduction_scalar", lambda x: x.mean(), (torch.randn(37, 11),), rtol=1e-4, atol=1e-5)
    case("column_reduction", lambda x: x.sum(0), (torch.randn(300, 17),), rtol=1e-4, atol=1e-4)

    def cat_heads_bias_grad(q, k, v):  # GPT-2's c_attn backward: q,k,v gradients joined, summed over tokens
        x = torch.cat([t.transpose(1, 2).reshape(2, 40, 96) for t in (q, k * 2, v + 1)], -1)
        return x, x.sum((0, 1))

    case("column_reduction_of_a_cat", cat_heads_bias_grad, tuple(torch.randn(2, 3, 40, 32) for _ in range(3)),
         rtol=1e-4, atol=1e-4)

    def experts_combined(proj, perm, resid):  # Mixtral: expert rows back in token order, summed per token
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.numel())
        t, h = resid.shape
        return resid + proj[inv].view(t, -1, h).sum(1)

    # a gather at indices loaded one element each (the sum over two rows unrolled to one
    # element): the pointer is 0-d, so the load takes no block mask
    case("gather_of_one_element_loads", lambda x, t: x.gather(1, t[:, None]).sum(0) * 2,
         (torch.randn(2, 7), torch.tensor([3, 5])))
    for k in (2, 16):
        case(f"experts_combined_{k}", experts_combined, (torch.randn(32 * k, 64), torch.randperm(32 * k),
                                                          torch.randn(32, 64)), rtol=1e-4, atol=1e-4)
    # each part of a cat, a select's backward and a padding is read only where it is taken (masked loads)
    case("cat_parts_masked", lambda a, b, c: torch.cat([a, b * 2, c], 1) + 1,
         (torch.randn(5, 3), torch.randn(5, 4), torch.randn(5, 2)))
    case("cat_eight_parts_masked", lambda *xs: torch.cat([x * 2 for x in xs], 1) + 1,
         tuple(torch.randn(5, 2 + i) for i in range(8)))

    def stacked_grads(q, k, v):  # ViT's q, k, v gradients: select_backward of each into zeros, summed
        z = torch.zeros(3, *q.shape)
        return torch.select_scatter(z, q, 0, 0) + torch.select_scatter(z, k, 0, 1) + torch.select_scatter(z, v, 0, 2)

    case("select_scatters_masked", stacked_grads, tuple(torch.randn(7, 16) for _ in range(3)))
    case("pad_masked", lambda x: F.pad(x, (2, 1, 0, 3), value=-1.5) * 2, (torch.randn(4, 6),))
    case("where_on_data_unmasked", lambda x, g: torch.where(x > 0, g, 0.0) * 2, (torch.randn(64), torch.randn(64)))
    case("slice_scatter_stepped_masked", lambda y, s: torch.slice_scatter(y, s, 1, 1, None, 2) * 2,
         (torch.randn(3, 9), torch.randn(3, 4)))
    case("as_strided_scatter_masked", lambda y, s: torch.as_strided_scatter(y * 1, s, (2, 3), (1, 5), 2) + 1,
         (torch.randn(16), torch.randn(2, 3)))
    # looped, few columns: narrow blocks of long row chunks, with the last chunk masked
    case("column_reduction_looped_narrow", lambda x: x.sum(0), (torch.randn(4100, 40),), rtol=1e-4, atol=1e-3)
    case("bf16_gelu", lambda x, b: F.gelu(x + b), (torch.randn(16, 48, dtype=torch.bfloat16),
                                                   torch.randn(48, dtype=torch.bfloat16)), rtol=1.6e-2, atol=1e-2)
    # a kernel writing only 16-bit floats takes the short erf (_fl_erf_16bit); specials included
    xe = torch.cat([torch.linspace(-7, 7, 997), torch.tensor([0.0, -0.0, 1e-30, 30.0, -30.0, float("inf"),
                                                              float("-inf"), float("nan")])]).to(torch.bfloat16)
    case("bf16_erf", lambda x: torch.erf(x), (xe,), rtol=0, atol=4e-3)
    # ... and GELU's decomposition there becomes one _fl_gelu_16bit call (no +inf: eager's
    # CPU GELU gives nan there, CUDA's x * normcdf(x) and ours inf)
    xg = torch.cat([torch.linspace(-12, 12, 1999), torch.tensor([0.0, -0.0, 1e-30, 30.0, -30.0, float("-inf"),
                                                                 float("nan")])]).to(torch.bfloat16)
    case("bf16_gelu_range", lambda x: F.gelu(x), (xg,), rtol=1.6e-2, atol=1e-5)
    case("fp32_gelu", lambda x: F.gelu(x), (torch.randn(64, 33),))
    case("bf16_softmax", lambda x: torch.softmax(x, -1), (torch.randn(8, 96, dtype=torch.bfloat16),), rtol=1.6e-2, atol=1e-2)
    xm = torch.randn(4, 33)
    xm[1, 3] = float("nan")
    case("max_propagates_nan", lambda x: x.amax(-1), (xm,))
    xi, yi = torch.randint(-20, 20, (64,)), torch.randint(1, 7, (64,)) * torch.tensor([1, -1]).repeat(32)
    case("int_floordiv_remainder", lambda a, b: (torch.div(a, b, rounding_mode="floor"), a % b,
                                                torch.div(a, b, rounding_mode="trunc")), (xi, yi))
    case("bool_any_all", lambda x: ((x > 0.5).any(-1), (x > -3).all(-1)), (torch.randn(5, 40),))
    xs = torch.randn(257) * 3
    case("math_mapping", lambda x: (torch.tanh(x), torch.expm1(x * 0.1), torch.log1p(x.abs()), torch.atan(x),
                                    torch.sigmoid(x), torch.erf(x), torch.round(x), torch.trunc(x),
                                    torch.pow(x.abs() + 0.5, x * 0.3), torch.asinh(x), torch.sinh(x * 0.5),
                                    torch.remainder(x, 1.7)), (xs,), rtol=2e-5, atol=2e-5)
    # sin and cos of one value share one range reduction (_fl_sincos): small and large
    # arguments (fast path up to 8192), blocks with |x| > 8192, inf and nan (_fl_reduce_large)
    g = torch.Generator().manual_seed(1)
    xt = torch.cat([torch.randn(2048, generator=g) * 10, torch.rand(2048, generator=g) * 16384 - 8192,
                    torch.tensor([0.0, -0.0, 1e-30, 3.1415927, 1.5707964, -8192.0] * 4),
                    torch.tensor([1e6, -3e4, float("inf"), float("nan"), 2.0] * 300)])
    case("sincos_shared", lambda x: (torch.sin(x) ** 2 + torch.cos(x) ** 2, torch.sin(x), torch.cos(x) * 3), (xt,),
         rtol=1.3e-6, atol=1e-6)
    # lone sin / cos of float32 (`_fl_sin`/`_fl_cos`), over the whole float range: the
    # large-argument reduction (|x| up to 3.4e38) against eager's full-range sinf/cosf
    huge = torch.exp(torch.rand(4096, generator=g) * 88) * (torch.randint(0, 2, (4096,), generator=g) * 2 - 1)
    huge = torch.cat([huge, torch.tensor([3.4028235e38, -3.4028235e38, 8192.0, 8192.001, 105615.0, 2.0 ** 24])])
    case("sin_cos_lone_huge_args", lambda x, y: (torch.sin(x) * 2, torch.cos(y) + 1), (huge, huge.flip(0) * 0.5),
         rtol=1.3e-6, atol=1e-6)
    # nextafter from the bits, exact: signs, zeros, towards itself, infinities, nan, subnormals
    for dt in (torch.float32, torch.float64):
        fi = torch.finfo(dt)
        edge = torch.tensor([0.0, -0.0, 1.0, -1.0, fi.max, -fi.max, float("inf"), float("-inf"), float("nan"), 2.0,
                             fi.tiny, -fi.smallest_normal / 4, 3.0, 1e-30], dtype=dt)
        toward = torch.tensor([1.0, -1.0, 2.0, 0.0, float("inf"), float("-inf"), 0.0, 0.0, 1.0, float("nan"),
                               0.0, 1.0, 3.0, -1.0], dtype=dt)
        xa = torch.cat([edge, torch.randn(500, dtype=dt) * 100])
        xb = torch.cat([toward, torch.randn(500, dtype=dt) * 100])
        case(f"nextafter_{str(dt)[6:]}", lambda a, b: torch.nextafter(a, b), (xa, xb), rtol=0, atol=0)
    # lgamma (a formula of the prelude in the interpreter): poles, the reflection below 0.5,
    # near its zeros at 1 and 2, large arguments, infinities and nan
    xl = torch.cat([torch.tensor([0.0, -1.0, -2.0, 1.0, 2.0, 0.5, -0.5, -2.5, 1e-3, -1e-3, 1e30, 3e38,
                                  float("inf"), float("-inf"), float("nan")]),
                    torch.rand(500) * 40 - 20, torch.rand(200) * 3])
    case("lgamma", lambda x: torch.lgamma(x), (xl,), rtol=1e-5, atol=1e-5)
    case("dynamic_shapes", lambda x: torch.softmax(x * 2, -1), (torch.randn(5, 37),), dynamic=True)
    # dynamic: the same compiled function on another size (no recompile needed, symbolic args)
    try:
        c, _, _ = compile_run(lambda x: torch.relu(x) + 1, (torch.randn(10, 7),), dynamic=True)
        y = torch.randn(13, 9)
        records["dynamic_second_size"] = {"ok": bool(torch.allclose(c(y), torch.relu(y) + 1))}
    except Exception as e:  # noqa: BLE001
        records["dynamic_second_size"] = {"ok": False, "err": repr(e)}
    # repeated layers: identical kernels are defined once in the module and share one JITFunction
    try:
        import re

        from fuselens.compiler.runtime import triton_module

        class Block(torch.nn.Module):
            def __init__(self, d: int) -> None:
                super().__init__()
                self.ln, self.fc = torch.nn.LayerNorm(d), torch.nn.Linear(d, d)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return x + torch.nn.functional.gelu(self.fc(self.ln(x)))

        torch.manual_seed(0)
        blocks = torch.nn.Sequential(*[Block(32) for _ in range(4)]).eval()
        xb = torch.randn(8, 32)
        with torch.no_grad():
            _, out, events = compile_run(blocks, (xb,))
            ref = blocks(xb)
        lib = triton_module.recent_libraries[-1]
        text = open(lib.path).read()
        records["repeated_layers"] = {
            "ok": bool(torch.allclose(out, ref, atol=1e-5, rtol=1e-5)),
            "kernels": len([e for e in events if isinstance(e, Kernel) and e.kind == "triton"]),
            "defs": text.count("@triton.jit\ndef triton_fused"),
            "aliases": len(re.findall(r"^triton_fused\w+ = triton_fused\w+$", text, re.M)),
            "functions": len({id(la.fn) for la in lib.launchers.values()}),
            "launchers": len(lib.launchers),
        }
    except Exception as e:  # noqa: BLE001
        records["repeated_layers"] = {"ok": False, "err": repr(e)}

    # events: same fusion decisions as the C++ generator on the same graph
    def chain(x, w):
        h = torch.softmax(x @ w, -1)
        return F.layer_norm(h + 1, (h.shape[-1],)) * 2

    args = (torch.randn(8, 32), torch.randn(32, 32))
    dec = {}
    for tgt in ("cpp", "triton"):
        _, _, events = compile_run(chain, args, target=tgt)
        # The reasons of "fused" decisions list the IR nodes of each FX node, and var's
        # differ on purpose (one pass over double accumulators in C++, two passes in
        # Triton's float32 ones): which nodes fuse, and why others do not, must match.
        dec[tgt] = sorted((d.decision, tuple(d.nodes), "" if d.decision == "fused" else
                           d.reason.replace("cpp_fused", "K").replace("triton_fused", "K"))
                          for d in events if isinstance(d, FusionDecision))
        kinds = {(k.kind, k.language, k.device) for k in events if isinstance(k, Kernel) and k.kind != "extern"}
        records[f"events_{tgt}"] = {"ok": True, "kinds": sorted(map(list, kinds))}
    records["same_decisions"] = {"ok": dec["cpp"] == dec["triton"], "n": len(dec["cpp"])}

    # kernel timing in the interpreter (host clock; CUDA events on the GPU)
    try:
        c, _, _ = compile_run(lambda x: x.exp() + 1, (torch.randn(64),), time_kernels=True)
        c(torch.randn(64))
        with sink.collect() as events:
            sink.flush()
        t = [e for e in events if isinstance(e, KernelTiming)]
        records["timing"] = {"ok": bool(t) and all(e.calls >= 1 and e.total_time_us > 0 for e in t),
                             "calls": sum(e.calls for e in t)}
    except Exception as e:  # noqa: BLE001
        records["timing"] = {"ok": False, "err": repr(e)}

    # a row reduction's chunk is sized by the rows it streams, not by a value read once a row
    try:
        from fuselens.compiler.runtime.launch_config import heuristic_config

        lab = torch.tensor([3, 19999, 7, 0])
        compile_run(lambda x, t: (x.float() * (torch.arange(20000) == t[:, None])).sum(-1),
                    (torch.randn(4, 20000).to(torch.bfloat16), lab))
        la = _find_launcher("sum")
        cfg = heuristic_config(la.ks, 4, 20000)
        records["row_labels_chunk"] = {"ok": True, "elem_bytes": la.ks.elem_bytes, "kind": la.ks.kernel_kind,
                                       "rblock": cfg.rblock, "warps": cfg.num_warps}
    except Exception:  # noqa: BLE001
        import traceback

        records["row_labels_chunk"] = {"ok": False, "err": traceback.format_exc()[-1500:]}

    # autotuning: a fake timer (no GPU here) prefers one candidate; the choice is cached on disk
    try:
        from fuselens.compiler.runtime.launch_config import candidate_configs, size_class
        from fuselens.compiler.runtime.triton_launcher import Launcher

        compile_run(lambda x: torch.softmax(x, -1), (torch.randn(4, 20000),))
        launcher = _find_launcher("amax")
        opts = fuselens.compiler.resolve({"target": "triton", "cache_dir": cache, "autotune": True})
        cands = candidate_configs(launcher.ks, 4, 20000)
        want = cands[-1]
        calls: list = []

        def fake_timer(run: Callable[[], None]) -> float:
            calls.append(1)
            run()
            return 0.5 if len(calls) == len(cands) else 1.0  # the last candidate is "fastest"

        la = Launcher(launcher.ks, launcher.fn, opts, launcher.source)
        la.timer = fake_timer
        x = torch.randn(4, 20000)
        out = torch.empty_like(x)
        la(x, out)
        ok1 = la.configs[size_class(4, 20000)] == want and torch.allclose(out, torch.softmax(x, -1), atol=1e-6)

        def never(run: Callable[[], None]) -> float:
            raise AssertionError("tuned again despite the disk cache")

        la2 = Launcher(launcher.ks, launcher.fn, opts, launcher.source)
        la2.timer = never
        la2(x, out)
        ok2 = la2.configs[size_class(4, 20000)] == want
        records["autotune_cache"] = {"ok": bool(ok1 and ok2), "ncand": len(cands), "timer_calls": len(calls)}
    except Exception:  # noqa: BLE001
        import traceback

        records["autotune_cache"] = {"ok": False, "err": traceback.format_exc()[-1500:]}

    Path(out_path).write_text(json.dumps(records))


def _find_launcher(needle: str) -> Any:  # pragma: no cover - subprocess helper
    from fuselens.compiler.runtime.triton_module import recent_libraries

    return [la for la in recent_libraries[-1].launchers.values() if needle in la.name][-1]


# --------------------------------------------------------------------------------------------
# the tests
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> dict:
    pytest.importorskip("triton")
    out = tmp_path_factory.mktemp("triton") / "records.json"
    return interpreted_worker_records(__file__, out, 900, "triton worker")


def _ok(records: dict, name: str) -> dict:
    rec = records[name]
    assert rec["ok"], f"{name}: {rec.get('err')}"
    return rec


@pytest.mark.parametrize("name", [
    "pointwise_1d", "pointwise_2d_transpose", "pointwise_channels_last", "persistent_softmax", "looped_sum",
    "linear_relu_epilogue", "conv_bn_relu_folded", "conv_bn_relu_with_grad_untouched",
    "online_softmax", "layernorm", "layernorm_offset_rows", "looped_var_offset_rows", "full_reduction_scalar",
    "welford_layernorm", "welford_layernorm_ragged", "softmax_4096_rows", "layernorm_4096_few_rows",
    "column_reduction", "column_reduction_looped_narrow", "bf16_gelu", "bf16_gelu_range", "bf16_erf", "fp32_gelu", "bf16_softmax", "max_propagates_nan",
    "int_floordiv_remainder", "bool_any_all", "welford_not_when_a_pass_stores",
    "math_mapping", "sincos_shared", "sin_cos_lone_huge_args", "nextafter_float32", "nextafter_float64",
    "lgamma", "dynamic_shapes", "softmax_masked_by_ones", "causal_mask_of_ones", "index_put_kv_cache",
    "bucketize_both_sides", "gather_of_one_element_loads",
])
def test_triton_kernel_matches_eager_in_interpreter(records: dict, name: str) -> None:
    rec = _ok(records, name)
    assert rec["kinds"], f"{name}: no Triton kernel was generated (fallbacks: {rec['fallbacks']})"
    assert not rec["fallbacks"], rec["fallbacks"]
    assert set(rec["languages"]) == {"python"}
    for src in rec["sources"]:
        assert "libdevice" not in src  # the interpreter build prints the tl.* forms


def test_pointwise_is_one_dimensional_and_contiguous(records: dict) -> None:
    rec = _ok(records, "pointwise_1d")
    assert rec["kinds"] == ["pointwise"]
    assert "tl.load(in_arg0_1 + (xindex)" in rec["sources"][0]


def test_transposed_read_uses_a_2d_tile(records: dict) -> None:
    assert _ok(records, "pointwise_2d_transpose")["kinds"] == ["pointwise2d"]


def test_channels_last_walks_memory_order_without_div_mod(records: dict) -> None:
    src = _ok(records, "pointwise_channels_last")["sources"][0]
    assert "xindex %" not in src and "xindex //" not in src, src


def test_short_rows_stay_in_registers_long_rows_loop(records: dict) -> None:
    assert _ok(records, "persistent_softmax")["kinds"] == ["persistent_reduction"]
    src = _ok(records, "looped_sum")["sources"][0]
    assert "for roffset in range(0, rnumel, RBLOCK)" in src


def test_softmax_max_and_sum_share_one_online_pass(records: dict) -> None:
    rec = _ok(records, "online_softmax")
    assert rec["kinds"] == ["looped_reduction"]
    src = rec["sources"][0]
    # max+sum in one loop (running max, rescaled sum), then the normalising loop: 2 passes, not 3
    assert src.count("for roffset") == 2, src
    assert "tl.exp(accm" in src


def test_layernorm_mean_and_variance_in_one_kernel(records: dict) -> None:
    rec = _ok(records, "layernorm")
    assert rec["kinds"] == ["persistent_reduction"]
    assert rec["sources"][0].count("tl.sum(") >= 2


def test_long_row_moments_take_one_welford_loop_with_l2_hints(records: dict) -> None:
    for name in ("welford_layernorm", "welford_layernorm_ragged", "looped_var_offset_rows"):
        rec = _ok(records, name)
        assert rec["kinds"] == ["looped_reduction"], name
        src = rec["sources"][0]
        assert "accwm" in src, src  # the per-lane Welford mean
    src = _ok(records, "welford_layernorm")["sources"][0]
    # sum and squared deviations in one loop, then the normalising loop: 2 passes over the row, not 3
    assert src.count("for roffset") == 2, src
    assert "eviction_policy='evict_last'" in src and "eviction_policy='evict_first'" in src
    assert "rmask" in _ok(records, "welford_layernorm_ragged")["sources"][0]
    # a softmax row of the same length is no Welford pattern: it stays in registers, without hints
    rec = _ok(records, "softmax_4096_rows")
    assert rec["kinds"] == ["persistent_reduction"] and "eviction_policy" not in rec["sources"][0]
    assert _ok(records, "layernorm_4096_few_rows")["kinds"] == ["persistent_reduction"]
    assert _ok(records, "welford_not_when_a_pass_stores")["kinds"] == ["persistent_reduction"]
    (src,) = _ok(records, "welford_two_tensors_one_loop")["sources"]
    assert src.count("for roffset") == 1 and src.count("= tl.full([XBLOCK, RBLOCK], 0.0") == 8, src


def test_linear_relu_runs_in_the_matmul_epilogue_and_erf_safe_gelu_stays_a_kernel(records: dict) -> None:
    rec = _ok(records, "linear_relu_epilogue")
    assert rec["externs"].count("aten._addmm_activation.default") == 1, rec["externs"]
    assert any("ReLU in one library call" in r for r in rec["epilogues"]), rec["epilogues"]
    assert not any("GELU" in r for r in rec["epilogues"])  # CPU tensors: ATen's kernel is erf-GELU
    assert "aten._addmm_activation.default" not in _ok(records, "linear_relu_autocast_untouched")["externs"]


def test_inference_batch_norm_folds_into_the_convolution_with_relu_and_residual(records: dict) -> None:
    rec = _ok(records, "conv_bn_relu_folded")
    assert rec["externs"] == ["fuselens.conv2d_bias_relu.default"] * 2, rec["externs"]
    assert sum("residual add" in r for r in rec["epilogues"]) == 1, rec["epilogues"]
    # with gradients enabled nothing is rewritten: the custom op has no derivative
    assert "fuselens.conv2d_bias_relu.default" not in _ok(records, "conv_bn_relu_with_grad_untouched")["externs"]


def test_the_folded_weights_and_biases_are_computed_once_not_at_every_call(records: dict) -> None:
    """The fold reads parameters and buffers alone: its kernels leave the graph for the
    module-state prologue (module_state_prologue.py), and the graph is its two library calls."""
    rec = _ok(records, "conv_bn_relu_folded_once")
    assert rec["externs"] == ["fuselens.conv2d_bias_relu.default"] * 2, rec["externs"]
    assert not rec["kinds"] and len(rec["once"]) == 4, rec["once"]  # each convolution's weight and bias
    assert _ok(records, "conv_bn_relu_folded")["kinds"] and not _ok(records, "conv_bn_relu_folded")["once"]


def test_a_per_row_int64_read_does_not_halve_a_bf16_row_reductions_chunk(records: dict) -> None:
    """Phi's cross-entropy backward reads each row's int64 label once: sized by it, the loop
    ran 1024-wide chunks, 0.50 ms against 0.17 at 2048 (H200)."""
    rec = _ok(records, "row_labels_chunk")
    assert rec["kind"] == "looped_reduction" and rec["elem_bytes"] == 2, rec
    assert rec["rblock"] == 2048 and rec["warps"] == 16, rec


def test_sin_and_cos_of_one_value_share_one_range_reduction(records: dict) -> None:
    src = _ok(records, "sincos_shared")["sources"][0]
    assert src.count("_fl_sincos(") == 1 and "tl.sin(" not in src and "tl.cos(" not in src, src
    from fuselens.compiler.codegen.triton import _LONG_MATH

    assert _LONG_MATH.search(src)  # what marks the kernel `long_math` for its launch heuristic


def test_short_erf_only_where_every_output_is_16_bit(records: dict) -> None:
    assert "_fl_erf_16bit(" in "".join(_ok(records, "bf16_erf")["sources"])
    assert "_fl_erf_16bit(" not in "".join(_ok(records, "fp32_gelu")["sources"])  # float32 out: full-precision erf
    assert "_fl_gelu_16bit(" not in "".join(_ok(records, "fp32_gelu")["sources"])


def test_16_bit_gelu_is_one_helper_call_with_its_decomposition_dropped(records: dict) -> None:
    for name in ("bf16_gelu", "bf16_gelu_range"):
        src = "".join(_ok(records, name)["sources"])
        assert src.count("_fl_gelu_16bit(") == 1, src
        assert "_fl_erf_16bit(" not in src and "0.7071067811865476" not in src, src


def test_drop_dead_removes_unread_temporaries_transitively_and_keeps_stores() -> None:
    from fuselens.compiler.codegen.triton_patterns import drop_dead

    lines = ["    tmp1 = tl.load(a + x)", "    tmp2 = (tmp1 * 2.0)", "    tmp3 = _f(tmp2)", "    tmp11 = (tmp1 + 1.0)",
             "    tl.store(b + x, tmp11)"]
    assert drop_dead(lines) == [lines[0], lines[3], lines[4]]


def test_identical_kernels_of_repeated_layers_share_one_definition_and_one_compile(records: dict) -> None:
    rec = _ok(records, "repeated_layers")
    assert rec["kernels"] == rec["launchers"] >= 4, rec
    assert rec["aliases"] >= 2 and rec["defs"] + rec["aliases"] == rec["kernels"], rec
    assert rec["functions"] == rec["defs"], rec


def test_dynamic_sizes_are_kernel_arguments(records: dict) -> None:
    rec = _ok(records, "dynamic_shapes")
    header = rec["sources"][0].splitlines()[1]
    assert "xnumel" in header or "rnumel" in header, header
    assert "int64 indexing" in rec["sources"][0]
    assert records["dynamic_second_size"]["ok"], records["dynamic_second_size"]


def test_triton_kernel_events_and_same_fusion_decisions_as_cpp(records: dict) -> None:
    assert records["events_triton"]["kinds"] == [["triton", "python", "cpu"]]
    assert records["events_cpp"]["kinds"] == [["cpp", "cpp", "cpu"]]
    rec = records["same_decisions"]
    assert rec["n"] > 0 and rec["ok"]


def test_kernel_timing_streams_kernel_timing_events(records: dict) -> None:
    _ok(records, "timing")


def test_autotune_picks_the_fastest_and_caches_it_on_disk(records: dict) -> None:
    rec = _ok(records, "autotune_cache")
    assert rec["ncand"] >= 2 and rec["timer_calls"] == rec["ncand"]


def test_target_auto_picks_cpp_for_cpu_and_refuses_triton_without_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from fuselens.compiler.targets.registry import resolve_target

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert resolve_target("auto", [torch.zeros(2)]) == "cpp"
    assert resolve_target("cpp", [torch.zeros(2)]) == "cpp"
    with pytest.raises(RuntimeError, match="needs CUDA tensors"):
        resolve_target("triton", [torch.zeros(2)])
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert resolve_target("triton", [torch.zeros(2)]) == "triton"


def test_a_graph_whose_first_input_is_a_cpu_step_count_runs_on_its_cuda_inputs_device() -> None:
    """AOTAutograd put a compiled bias correction's CPU step count before the CUDA parameter;
    taking the first tensor's device allocated the outputs on the CPU (found on the H200)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fuselens.compiler.targets.base import cuda_device, runs_on_cuda
    from fuselens.compiler.targets.registry import resolve_target

    with FakeTensorMode(allow_non_fake_inputs=True):
        p = torch.empty(64, device="cuda:0")
    inputs = [torch.tensor(3.0), p]
    assert cuda_device(inputs) == torch.device("cuda:0") and runs_on_cuda(inputs)
    assert resolve_target("auto", inputs) == "triton"
    assert cuda_device([torch.tensor(3.0), torch.zeros(2)]) is None


def test_a_graph_that_reads_no_cuda_tensor_but_computes_on_cuda_is_compiled_for_cuda() -> None:
    """A graph that builds a CUDA mask from shapes alone reads no CUDA tensor, as Hugging
    Face's mask code can after a graph break. The device decisions read only the inputs,
    so such a graph was compiled for the CPU and its mask came out there: the likely cause
    of BART's and Mixtral's failures on the H200, where a CPU mask reached the next graph's
    attention. The decisions now read the values it computes too. (Fake CUDA tensors:
    this machine has no GPU.)"""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    from fuselens.compiler import options as options_mod
    from fuselens.compiler.ir import ComputeNode
    from fuselens.compiler.lowering import lower
    from fuselens.compiler.lowering.lowerer import Lowerer
    from fuselens.compiler.targets.base import cuda_device, with_graph_device
    from fuselens.compiler.targets.registry import resolve_target

    def mask(x):
        return (torch.zeros(8, 8, device="cuda") + 1 >= 0).expand(2, 8, 8)

    gm = make_fx(mask, tracing_mode="fake")(torch.ones(1))
    x = torch.ones(1)
    assert cuda_device([x]) is None
    devices = with_graph_device(gm, [x])
    assert devices[0] is x and cuda_device(devices) == torch.device("cuda:0")
    assert resolve_target("auto", devices) == "triton"
    assert Lowerer(gm, options_mod.resolve({"target": "triton"})).on_cuda
    g, _ = lower(gm, options_mod.resolve({"target": "triton"}))
    assert all(isinstance(s, ComputeNode) for s in g.steps)
    cpu_only = make_fx(lambda t: (t + 1 >= 0).expand(2, 1), tracing_mode="fake")(torch.ones(1))
    assert resolve_target("auto", with_graph_device(cpu_only, [x])) == "cpp"


def test_cpu_work_in_a_cuda_graph_runs_in_aten_and_its_cuda_work_in_kernels() -> None:
    """An optimizer's CPU step count, updated in place and read by the parameters' update:
    a Triton kernel cannot write host memory (its CPU arguments are copied to the device),
    so the count's update and everything computed from it on the CPU stay ATen's."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from fuselens.compiler import options as options_mod
    from fuselens.compiler.ir import ComputeNode, ExternNode
    from fuselens.compiler.lowering import lower

    def bias_corrected(p, step):
        new = step + 1
        step.copy_(new)
        return p * (1 - 0.9 ** new)

    with FakeTensorMode(allow_non_fake_inputs=True):
        p = torch.empty(16, device="cuda")
    gm = make_fx(bias_corrected, tracing_mode="fake")(p, torch.tensor(3.0))
    g, _ = lower(gm, options_mod.resolve({"target": "triton"}))
    on_cpu = {s.name: s.kind for s in g.steps if isinstance(s, ExternNode)}
    assert on_cpu == dict.fromkeys(["add", "copy_", "pow_1", "rsub"], "extern")
    assert [s.name for s in g.steps if isinstance(s, ComputeNode)] == ["mul"]
    assert g.input_mutations == {}


def test_launch_heuristics_fit_the_kernel_kind() -> None:
    from types import SimpleNamespace

    from fuselens.compiler.runtime.launch_config import candidate_configs, heuristic_config

    pw = SimpleNamespace(kernel_kind="pointwise", elem_bytes=4, column_reduction=False)
    assert heuristic_config(pw, 1 << 26, 1).xblock == 1024
    # a long helper per element (sin/cos): one 16-byte vector a thread, same 4 warps
    for nbytes, xblock in ((4, 512), (2, 1024)):
        c = heuristic_config(SimpleNamespace(kernel_kind="pointwise", elem_bytes=nbytes, long_math=True), 1 << 26, 1)
        assert (c.xblock, c.num_warps) == (xblock, 4)
    assert heuristic_config(SimpleNamespace(kernel_kind="pointwise", elem_bytes=2, column_reduction=False),
                            1 << 26, 1).xblock == 2048
    assert heuristic_config(pw, 100, 1).xblock == 128
    pr = SimpleNamespace(kernel_kind="persistent_reduction", elem_bytes=4, column_reduction=False)
    c = heuristic_config(pr, 8192, 8192)
    assert (c.xblock, c.rblock, c.num_warps) == (1, 8192, 16)
    c = heuristic_config(pr, 100, 100)
    assert c.rblock == 128 and c.xblock * c.rblock <= 1024
    lr = SimpleNamespace(kernel_kind="looped_reduction", elem_bytes=4, column_reduction=False)
    c = heuristic_config(lr, 4, 100000)
    assert (c.rblock, c.num_warps) == (2048, 16)
    # column sums: ~2 programs an SM, so 768 columns (a norm-weight gradient) get 8-wide blocks
    col = SimpleNamespace(kernel_kind="looped_reduction", elem_bytes=4, column_reduction=True)
    c = heuristic_config(col, 768, 4096)
    assert (c.xblock, c.rblock) == (8, 512) and -(-768 // c.xblock) >= 96
    assert (heuristic_config(col, 30522, 4096).xblock, heuristic_config(col, 30522, 4096).rblock) == (64, 64)
    # many short columns (a BatchNorm's partial sums, split over the batch): small tiles of 4 warps
    big = heuristic_config(col, 32768, 784)
    assert (big.xblock, big.rblock, big.num_warps) == (32, 32, 4)
    assert big in candidate_configs(col, 32768, 784) and len(candidate_configs(col, 32768, 784)) >= 4
    cat = SimpleNamespace(kernel_kind="looped_reduction", elem_bytes=2, column_reduction=True, clamped_loads=True)
    assert heuristic_config(cat, 36864, 256) != big  # a summed cat keeps the wide tile
    for ks, xn, rn in ((pw, 1 << 20, 1), (pr, 16384, 4096), (lr, 8, 1 << 20)):
        cands = candidate_configs(ks, xn, rn)
        assert 2 <= len(cands) <= 8 and cands[0] == heuristic_config(ks, xn, rn)


def test_a_column_sum_of_a_cat_is_planned_as_a_column_reduction(records: dict) -> None:
    # the cat's reads are clamped along the joined dim, not linear: the loop order comes from its store
    rec = _ok(records, "column_reduction_of_a_cat")
    red = [s for s in rec["sources"] if "reduction" in s.split('"""')[1]]
    assert red and all("(columns: contiguous along x)" in s.split('"""')[1] for s in red), rec["sources"]


def test_a_sum_of_two_gathered_rows_is_pointwise_and_of_sixteen_a_column_reduction_over_them(records: dict) -> None:
    # the rows' tokens pick the row through the loaded index: as dims of the row's stride they
    # are outer, and the hidden dim, contiguous in every read and write, is innermost
    two = _ok(records, "experts_combined_2")
    assert two["kinds"] and set(two["kinds"]) == {"pointwise"}, two["sources"]
    sixteen = _ok(records, "experts_combined_16")
    red = [s for s in sixteen["sources"] if "reduction" in s.split('"""')[1]]
    assert len(red) == 1 and "x=32x64 r=16 (columns: contiguous along x)" in red[0], sixteen["sources"]
    stores = [ln for ln in red[0].splitlines() if "tl.store(" in ln]
    assert stores and all("(xindex)" in ln for ln in stores), red[0]


@pytest.mark.parametrize("name,masked_loads", [("cat_parts_masked", 3), ("select_scatters_masked", 3),
                                               ("pad_masked", 1), ("slice_scatter_stepped_masked", 2),
                                               ("as_strided_scatter_masked", 2)])
def test_each_branch_of_a_cat_scatter_or_pad_is_loaded_only_where_taken(records: dict, name: str,
                                                                                 masked_loads: int) -> None:
    src = "".join(_ok(records, name)["sources"])
    loads = [ln for ln in src.splitlines() if "tl.load(" in ln]
    assert len(loads) == masked_loads and all(", other=0" in ln for ln in loads), src


@pytest.mark.parametrize("name", ["cat_parts_masked", "cat_eight_parts_masked", "pad_masked"])
def test_a_masked_branch_reads_its_index_unclamped_so_its_loads_stay_contiguous(records: dict, name: str) -> None:
    # the mask keeps the index in range; a clamp (tl.minimum / tl.maximum) would hide its
    # contiguity from Triton, which then loads element by element
    src = "".join(_ok(records, name)["sources"])
    loads = [ln for ln in src.splitlines() if "tl.load(" in ln]
    assert loads and not [ln for ln in loads if "tl.minimum" in ln or "tl.maximum" in ln], src


def test_a_cat_branch_mask_is_one_and_with_the_enclosing_mask_not_one_per_enclosing_branch(records: dict) -> None:
    # the last of eight parts is read under the conditions of the seven branches around it:
    # and-ed at each load one by one with the block mask, the eight parts cost 35 ands,
    # quadratic in the parts; once per branch, three a part
    src = "".join(_ok(records, "cat_eight_parts_masked")["sources"])
    assert src.count(" & ") <= 3 * 8, src


def test_a_where_on_loaded_data_reads_its_branch_unmasked_keeping_vector_loads(records: dict) -> None:
    src = "".join(_ok(records, "where_on_data_unmasked")["sources"])
    loads = [ln for ln in src.splitlines() if "tl.load(" in ln]
    assert len(loads) == 2 and all(", xmask, other=0)" in ln or "other" not in ln for ln in loads), src


def test_lone_sin_and_cos_take_the_full_range_reduction_not_libdevice(records: dict) -> None:
    srcs = "".join(_ok(records, "sin_cos_lone_huge_args")["sources"])
    assert "_fl_sin(" in srcs and "_fl_cos(" in srcs and "tl.sin(" not in srcs and "tl.cos(" not in srcs, srcs


def test_sincos_pairs_only_within_one_block() -> None:
    from fuselens.compiler.codegen.triton_patterns import share_sincos

    lines = ["    tmp1 = tl.load(x)", "    tmp2 = tl.cos(tmp1)", "    tmp3 = tl.sin(tmp1)",
             "    for roffset in range(0, 8, 4):", "        tmp4 = tl.sin(tmp1)", "    tmp5 = tl.cos(tmp1)"]
    out = share_sincos(lines)
    assert out[:2] == ["    tmp1 = tl.load(x)", "    tmp3, tmp2 = _fl_sincos(tmp1)"]
    # the loop body's sin and the cos after the loop stay apart: tmp4 is not visible there
    assert out[2:] == ["    for roffset in range(0, 8, 4):", "        tmp4 = _fl_sin(tmp1)", "    tmp5 = _fl_cos(tmp1)"]


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--worker":
    sys.path.insert(0, str(ROOT))
    _worker(sys.argv[2])



def test_bfloat16_casts_round_to_nearest_even_in_every_triton_target():
    # Triton's interpreter truncates float32 -> bfloat16 (-8.4784 became -8.4375, eager
    # gives -8.5): the kernels round through the prelude's _fl_to_bf16 on every target
    code = r'''
import torch, fuselens.compiler
g = torch.Generator().manual_seed(0)
x = torch.randn(4096, generator=g) * 10
x[:4] = torch.tensor([-8.4784, float("nan"), float("inf"), 3.3895e38])
f = lambda x: (x.bfloat16(), (x * 3).bfloat16() + 1)
out = torch.compile(f, backend="fuselens", options={"target": "triton", "compile_workers": 0})(x)
for a, b in zip(out, f(x)):
    assert torch.equal(a.nan_to_num(), b.nan_to_num()), (a[:4], b[:4])
print("ok")
'''
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-2000:]
