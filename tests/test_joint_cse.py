"""joint_cse.py: the joint graph's common subexpressions, merged as functorch's
`fx_graph_cse` merges them, without importing Inductor."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fuselens.compiler.joint_cse import cse

ROOT = Path(__file__).resolve().parents[1]
aten = torch.ops.aten


def _count(graph: torch.fx.Graph, packet) -> int:
    return sum(1 for n in graph.nodes if n.op == "call_function" and getattr(n.target, "overloadpacket", None) is packet)


def _torch_cse(graph: torch.fx.Graph) -> torch.fx.Graph:
    from torch._functorch.compile_utils import fx_graph_cse

    out = fx_graph_cse(graph)
    for n in graph.nodes:
        n.meta.pop("mutation_region_id", None)
    return out


def _both(fn, *args) -> tuple[torch.fx.Graph, torch.fx.Graph]:
    g = make_fx(fn, tracing_mode="fake")(*args).graph
    return cse(g), _torch_cse(g)


def test_repeated_pure_ops_merge_and_random_draws_do_not() -> None:
    def f(x):
        return x.sin() + x.sin() + torch.rand_like(x) + torch.rand_like(x)

    mine, theirs = _both(f, torch.randn(4))
    assert _count(mine, aten.sin) == 1 and _count(mine, aten.rand_like) == 2
    assert mine.python_code("self").src == theirs.python_code("self").src


def test_values_on_either_side_of_a_mutation_do_not_merge() -> None:
    def f(x, y):
        a = y.cos()
        y.add_(1)
        return a + y.cos()

    mine, theirs = _both(f, torch.randn(4), torch.randn(4))
    assert _count(mine, aten.cos) == 2
    assert mine.python_code("self").src == theirs.python_code("self").src


def test_uninitialised_allocations_stay_separate_buffers() -> None:
    """Two layers' inverse permutations each fill an `empty_like` buffer: merged, the
    first could no longer be filled in place (runtime/plan.py `_externs_in_place`)."""
    def f(p, q):
        a, b = torch.empty_like(p), torch.empty_like(p)
        a[p] = torch.arange(p.numel())
        b[q] = torch.arange(q.numel())
        return a + b

    g = make_fx(f, tracing_mode="fake")(torch.randperm(16), torch.randperm(16)).graph
    allocations = {n.target for n in g.nodes if "empty" in str(n.target)}
    merged = cse(g)
    assert sum(1 for n in merged.nodes if n.target in allocations) == 2, merged


def test_outputs_that_eager_returns_as_separate_tensors_stay_separate() -> None:
    def f(x):
        return x.clone(), x.clone(), x.exp() * x.exp()

    mine, theirs = _both(f, torch.randn(4))
    assert _count(mine, aten.clone) == 2 and _count(mine, aten.exp) == 1
    assert mine.python_code("self").src == theirs.python_code("self").src


def test_a_training_compile_with_fuselens_alone_does_not_import_inductors_pattern_matcher() -> None:
    # functorch's own CSE imports torch._inductor.pattern_matcher and most of Inductor with it
    code = textwrap.dedent("""
        import sys, torch
        import fuselens.compiler
        fuselens.compiler.register()
        m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
        x = torch.randn(4, 8)
        ref = m(x).sum()
        ref.backward()
        grads = [p.grad.clone() for p in m.parameters()]
        m.zero_grad()
        torch.compile(m, backend="fuselens")(x).sum().backward()
        assert all(torch.allclose(p.grad, g, atol=1e-6) for p, g in zip(m.parameters(), grads))
        print("pattern_matcher" if "torch._inductor.pattern_matcher" in sys.modules else "not imported")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=str(ROOT))
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "not imported"
