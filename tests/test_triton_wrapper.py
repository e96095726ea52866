"""The Triton target's host path: the generated straight-line wrapper
(fuselens/compiler/wrapper_codegen.py) and the launcher's direct-launch cache
(`Launcher.fast_launcher` in runtime/triton_launcher.py).

End to end, every interpreter test of test_triton_codegen.py/test_triton_models.py
runs through the generated wrapper. Here: the wrapper against the plan
interpreter it replaces on a hand-built plan, and the direct-launch cache against
a fake compiled kernel: Triton's `CompiledKernel.run` needs a GPU (the edge we
cannot run here; benchmarks/gpu_check.py covers the real one on the device).
"""

from __future__ import annotations

import types
from typing import Any

import pytest
import sympy
import torch

from compiled_helpers import AddLauncher

from fuselens.compiler.runtime.interpreter import ExternCall, Free, GraphRunner, KernelCall

aten = torch.ops.aten


def _runner() -> GraphRunner:
    k = AddLauncher()
    plan = [
        ExternCall("mm", aten.mm.default, (("buf", "x"), ("buf", "w")), {}, "mm"),
        ExternCall("view", aten.view.default, (("buf", "mm"), [16]), {}, "view"),
        Free(["w"]),
        KernelCall("k0", k, ["view", "b", "out"], ["out"], [("out", 0, 1, torch.float32)], [], takes_tensors=True),
        Free(["mm", "view", "b"]),
    ]
    slots = [[16], [1]]
    return GraphRunner(plan, ["x", "w", "b"], {}, lambda env: slots, [("buf", "out")], set())


def test_generated_wrapper_matches_the_plan_interpreter_and_frees_at_last_use() -> None:
    from fuselens.compiler.runtime.wrapper_codegen import wrap

    x, w, b = torch.randn(4, 3), torch.randn(3, 4), torch.randn(16)
    runner = _runner()
    ref = runner([x, w, b])[0]
    wrapped = wrap(runner, fast=False)
    assert wrapped is not None
    args = [x, w, b]
    out = wrapped(args)[0]
    assert args == []  # boxed convention: the inputs list is cleared
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(out, (x @ w).view(16) + b)
    src = wrapped.source
    assert "del b_w" in src and "del b_mm, b_view, b_b" in src
    assert src.index("del b_w") < src.index("_k")  # w dies before the kernel runs
    assert "torch.mm" not in src and "_e0(b_x, b_w)" in src  # direct call to a global, args spelled out


class _FakeCompiled:
    """What JITFunction.run returns on a GPU: records direct launches."""

    def __init__(self, log: list) -> None:
        self.function, self.packed_metadata = "fn-handle", "md"
        self.log = log

    def run(self, *a: Any) -> None:
        self.log.append(("direct", a))


class _FakeJIT:
    arg_names = ["in_a", "out_b", "XBLOCK"]

    def __init__(self) -> None:
        self.log: list = []

    def run(self, *args: Any, grid: Any, warmup: bool, **kw: Any) -> _FakeCompiled:
        self.log.append(("jit", grid, kw["XBLOCK"], kw["num_warps"]))
        return _FakeCompiled(self.log)


def _pointwise_launcher(fn: Any, tmp_path: Any) -> Any:
    """A Launcher for a 4096-element pointwise kernel of buffers a, b around `fn`."""
    from fuselens.compiler.runtime import triton_launcher as tr

    ks = types.SimpleNamespace(name="k", kernel_kind="pointwise", buffers=["a", "b"], symbols=[],
                               xnumel=sympy.Integer(4096), rnumel=sympy.Integer(1), numel_args=[], elem_bytes=4,
                               column_reduction=False)
    opts = types.SimpleNamespace(autotune=False, time_kernels=False, resolved_cache_dir=lambda: str(tmp_path))
    return tr.Launcher(ks, fn, opts, "src")


def test_fast_launcher_binds_the_compiled_kernel_once_per_alignment(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from fuselens.compiler.runtime import triton_launcher as tr

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(tr, "_launch_hooks", lambda: False)
    fn = _FakeJIT()
    la = _pointwise_launcher(fn, tmp_path)
    launch = la.fast_launcher()
    a, out = torch.randn(4100), torch.empty(4096)
    launch(7, a[:4096], out)  # first: through JITFunction.run (compiles), binds the direct call
    launch(7, a[:4096], out)  # then: straight to CompiledKernel.run with the bound grid and constexprs
    assert [e[0] for e in fn.log] == ["jit", "direct"]
    _, direct = fn.log[1]
    assert direct[:9] == (4, 1, 1, 7, "fn-handle", "md", None, None, None)
    assert direct[9:] == (a.data_ptr(), out.data_ptr(), 1024)  # pointers, then XBLOCK (4096 / 1024 programs)
    launch(7, a[1:4097], out)  # a 4-byte offset pointer: Triton specialized on 16-byte alignment, so not the same binary
    assert fn.log[2][0] == "jit"


def test_an_empty_triton_hook_chain_is_not_a_launch_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    # Triton >= 3.5 always has a HookChain object; only a chain with calls is a hook
    # (mistaking the empty chain kept every launch on the slow path).
    knobs = pytest.importorskip("triton.knobs")
    from fuselens.compiler.runtime import triton_launcher as tr

    chain = knobs.runtime.launch_enter_hook
    if not hasattr(chain, "calls"):
        pytest.skip("this Triton keeps plain callables as hooks")
    assert not tr._launch_hooks()

    def hook(*args: Any) -> None:
        pass

    monkeypatch.setattr(chain, "calls", [hook])
    assert tr._launch_hooks()


# -- torch's static CUDA launcher (fuselens/compiler/static_launch.py) ------------------------
# The launcher itself (torch._C._StaticCudaLauncher) needs a GPU: a fake API records the calls
# here; benchmarks/gpu_check.py runs every model through the real one on the device.
class _FakeStaticAPI:
    def __init__(self, load_result: tuple = (11, 4242, 32, 0)) -> None:
        self.loads: list = []
        self.launches: list = []
        self.load_result = load_result

    def _load_kernel(self, path: str, name: str, shared: int, device: int) -> tuple:
        with open(path, "rb") as f:
            self.loads.append((f.read(), name, shared, device))
        return self.load_result

    def _launch_kernel(self, *a: Any) -> None:
        self.launches.append(a)


def _static_kernel(signature: dict, constants: Any = None, **md: Any) -> Any:
    meta = dict(name="k", num_warps=4, shared=128, num_ctas=1, global_scratch_size=0, profile_scratch_size=0)
    meta.update(md)
    src = types.SimpleNamespace(signature=signature, constants=constants or {})
    return types.SimpleNamespace(metadata=types.SimpleNamespace(**meta), asm={"cubin": b"CUBIN"}, src=src)


def test_static_launch_passes_only_runtime_arguments_and_null_scratch(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from fuselens.compiler.runtime import static_launch as sl

    api = _FakeStaticAPI()
    monkeypatch.setattr(sl, "launcher_api", lambda: api)
    names = ["in_a", "out_b", "n", "one", "XBLOCK"]
    # `one` was specialized to a constant (an int equal to 1), XBLOCK is declared constexpr
    kernel = _static_kernel({"in_a": "*fp32", "out_b": "*bf16", "n": "i32", "one": "constexpr", "XBLOCK": "constexpr"})
    st = sl.StaticKernel.make(kernel, names, [100, 200, 4096, 1, 1024], 0, str(tmp_path))
    assert st is not None and st.function == 4242  # torch 2.13: (module, function, n_regs, n_spills)
    assert api.loads == [(b"CUBIN", "k", 128, 0)]
    st.launch((4,), 7, [100, 200, 4096, 1, 1024])
    assert api.launches[-1] == (4242, 4, 1, 1, 4, 128, "OOiOO", (100, 200, 4096, None, None), 7)
    go = st.bound((4,), 2, [4096, 1, 1024])  # the wrapper passes pointers; the rest is bound
    go(9, 300, 400)
    assert api.launches[-1] == (4242, 4, 1, 1, 4, 128, "OOiOO", (300, 400, 4096, None, None), 9)
    api.load_result = (777, 32, 0)  # torch 2.11: (function, n_regs, n_spills)
    assert sl.StaticKernel.make(kernel, names, [1, 2, 3, 1, 8], 0, str(tmp_path)).function == 777
    assert len(list((tmp_path / "cubin").iterdir())) == 1  # one file per cubin, written once


@pytest.mark.parametrize("why,kernel", [
    ("two CTAs", _static_kernel({"a": "*fp32"}, num_ctas=2)),
    ("scratch memory", _static_kernel({"a": "*fp32"}, global_scratch_size=64)),
    ("an argument type it does not know", _static_kernel({"a": "nvTmaDesc"})),
    ("PDL launch", _static_kernel({"a": "*fp32"}, launch_pdl=True)),
])
def test_static_launch_declines_what_it_cannot_launch(monkeypatch: pytest.MonkeyPatch, tmp_path, why: str,
                                                      kernel: Any) -> None:
    from fuselens.compiler.runtime import static_launch as sl

    monkeypatch.setattr(sl, "launcher_api", lambda: _FakeStaticAPI())
    assert sl.StaticKernel.make(kernel, ["a"], [1], 0, str(tmp_path)) is None, why


def test_static_launch_declines_when_loading_fails(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from fuselens.compiler.runtime import static_launch as sl

    api = _FakeStaticAPI()

    def broken(*a: Any) -> tuple:
        raise RuntimeError("CUDA driver error: invalid image")

    api._load_kernel = broken
    monkeypatch.setattr(sl, "launcher_api", lambda: api)
    assert sl.StaticKernel.make(_static_kernel({"a": "*fp32"}), ["a"], [1], 0, str(tmp_path)) is None


def test_launcher_uses_the_static_launcher_and_binds_it_for_the_fast_path(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path) -> None:
    from fuselens.compiler.runtime import static_launch as sl
    from fuselens.compiler.runtime import triton_launcher as tr

    api = _FakeStaticAPI()
    monkeypatch.setattr(sl, "launcher_api", lambda: api)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(tr, "_launch_hooks", lambda: False)
    # CPU tensors stand in for CUDA ones (the edge: no GPU here)
    monkeypatch.setattr(tr.Launcher, "_static_allowed", lambda self, args: True)
    monkeypatch.setattr(tr.Launcher, "_stream", staticmethod(lambda dev: 5))
    kernel = _static_kernel({"in_a": "*fp32", "out_b": "*fp32", "XBLOCK": "constexpr"})

    class JIT:
        arg_names = ["in_a", "out_b", "XBLOCK"]
        calls: list = []

        def run(self, *args: Any, grid: Any, warmup: bool, **kw: Any) -> Any:
            self.calls.append(warmup)
            return kernel

    fn = JIT()
    la = _pointwise_launcher(fn, tmp_path)
    launch = la.fast_launcher()
    a, out = torch.randn(4096), torch.empty(4096)
    launch(7, a, out)  # compile only (warmup=True), then the static launch with the current stream
    launch(7, a, out)  # the bound static launch: no JITFunction.run at all
    assert fn.calls == [True]  # Triton's own launcher (warmup=False) is never asked for
    assert api.launches[0] == (4242, 4, 1, 1, 4, 128, "OOOO", (a.data_ptr(), out.data_ptr(), None, None), 5)
    assert api.launches[1] == (4242, 4, 1, 1, 4, 128, "OOOO", (a.data_ptr(), out.data_ptr(), None, None), 7)
    assert len(api.loads) == 1  # loaded once per compiled kernel


@pytest.mark.parametrize("nbuf,nsym", [(0, 0), (1, 0), (0, 2), (3, 2)])
def test_direct_launcher_source_is_valid_python_for_kernels_without_arguments(nbuf, nsym):
    # A kernel over `torch.tensor([])` (HF Llama and GPT-2 copy one) has no buffer and no
    # size: its launcher once printed `key = (,)`, and on CUDA the whole graph ran eagerly.
    from fuselens.compiler.runtime.triton_launcher import launcher_source

    ns: dict = {"cache": {}, "slow": lambda key, *args: ("slow", key, args)}
    exec(compile(launcher_source(nbuf, nsym), "launcher", "exec"), ns)  # noqa: S102
    tensors = [torch.empty(4) for _ in range(nbuf)]
    kind, key, args = ns["launch"](None, *tensors, *range(nsym))
    assert kind == "slow" and len(key) == nbuf + nsym and len(args) == nbuf + nsym
