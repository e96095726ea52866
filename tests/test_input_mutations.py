"""Input mutations AOTAutograd keeps in the graph (BatchNorm's running statistics,
an optimizer's parameters and state) are written by our kernels: stored straight
into the input when the kernel computing the new value reads no other element of
it and nothing after that kernel reads the old value (plan.py `_mutate_inputs`),
else copied into it after the graph's last step. Both paths must leave the inputs
as eager does; C++ in-process, Triton in its CPU interpreter (subprocess)."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import torch
from triton_worker import interpreted_worker_records

import fuselens.compiler  # noqa: F401  (backend="fuselens" itself comes from the entry point)

ROOT = Path(__file__).resolve().parents[1]


def _conv_bn(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                               torch.nn.Conv2d(8, 4, 3), torch.nn.BatchNorm2d(4))


def _add_own_sum(x: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
    # the new value of each element reads every element's old value: not in place
    buf.add_(buf.sum() * x[0])
    return buf * 2


def _scaled_update(x: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
    buf.mul_(0.9).add_(x.mean(0) * 0.1)
    return x * 2


def _train_bn(opts: dict) -> list[str]:
    """Three training steps of conv+BatchNorm; the mismatches against eager."""
    model, ref = _conv_bn(), _conv_bn()
    torch.manual_seed(1)
    x = torch.randn(4, 3, 12, 12)
    weight = torch.randn(4, 4, 8, 8)
    compiled = torch.compile(model, backend="fuselens", options=opts)
    for _ in range(3):
        (compiled(x) * weight).sum().backward()
        (ref(x) * weight).sum().backward()
    bad = [n for (n, a), (_, b) in zip(model.named_buffers(), ref.named_buffers())
           if not torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-6)]
    # all gradients as one vector: a conv bias before BatchNorm has a zero gradient in
    # exact arithmetic, so its own relative error is noise on both sides
    mine = torch.cat([p.grad.flatten() for p in model.parameters()])
    theirs = torch.cat([p.grad.flatten() for p in ref.parameters()])
    if float((mine - theirs).norm() / theirs.norm()) > 1e-5:
        bad.append("gradients")
    return bad


def _functions(opts: dict) -> list[str]:
    """Each function twice on an input it mutates; the mismatches against eager."""
    bad = []
    for fn in (_add_own_sum, _scaled_update):
        torch._dynamo.reset()
        torch.manual_seed(2)
        x, buf = torch.randn(6, 5), torch.randn(5)
        mine, theirs = buf.clone(), buf.clone()
        compiled = torch.compile(fn, backend="fuselens", options=opts)
        for _ in range(2):
            out, want = compiled(x, mine), fn(x, theirs)
            if not (torch.allclose(mine, theirs, rtol=1e-5, atol=1e-5) and torch.allclose(out, want, rtol=1e-5, atol=1e-5)):
                bad.append(fn.__name__)
                break
    return bad


def _sgd_momentum(opts: dict) -> list[str]:
    torch.manual_seed(3)
    params = [torch.randn(64, 32), torch.randn(32)]
    grads = [torch.randn_like(p) for p in params]
    mine = [p.clone() for p in params]
    theirs = [p.clone() for p in params]
    for ps in (mine, theirs):
        for p, g in zip(ps, grads):
            p.grad = g.clone()
    opt_m = torch.optim.SGD(mine, lr=0.1, momentum=0.9)
    opt_t = torch.optim.SGD(theirs, lr=0.1, momentum=0.9)
    step = torch.compile(opt_m.step, backend="fuselens", options=opts)
    for _ in range(3):
        step()
        opt_t.step()
    return [f"param {i}" for i, (a, b) in enumerate(zip(mine, theirs)) if not torch.allclose(a, b, rtol=1e-5, atol=1e-6)]


CPP = {"target": "cpp", "fallback_on_error": False}


def test_batchnorm_running_stats_written_by_kernels_match_eager_over_training_steps() -> None:
    from fuselens import sink
    from fuselens.events import ErrorEntry, Kernel

    torch._dynamo.reset()
    with sink.collect() as events:
        assert _train_bn(CPP) == []
    stores = [e for e in events if isinstance(e, Kernel) and "aten.copy_.default" in e.ops]
    assert stores and all(e.kind == "cpp" for e in stores)  # inside generated kernels, not ATen
    assert not [e for e in events if isinstance(e, ErrorEntry)]


def test_mutation_reading_other_elements_of_its_input_is_copied_after_the_graph() -> None:
    assert _functions(CPP) == []


def test_compiled_optimizer_step_updates_parameters_and_momentum_in_place_like_eager() -> None:
    torch._dynamo.reset()
    assert _sgd_momentum(CPP) == []


def test_input_mutations_in_the_triton_interpreter_match_eager(tmp_path: Path) -> None:
    records = interpreted_worker_records(__file__, tmp_path / "records.json", 900, "input-mutation worker")
    assert records == {"bn": [], "functions": [], "sgd": []}


def _worker(out: str) -> None:  # pragma: no cover - runs under TRITON_INTERPRET=1
    import tempfile

    opts = {"target": "triton", "fallback_on_error": False, "cache_dir": tempfile.mkdtemp(prefix="fl_mut_")}
    records: dict[str, Any] = {}
    for name, fn in (("bn", _train_bn), ("functions", _functions), ("sgd", _sgd_momentum)):
        torch._dynamo.reset()
        try:
            records[name] = fn(opts)
        except Exception as e:  # noqa: BLE001 - recorded for the test to show
            records[name] = [f"{type(e).__name__}: {e}"[:2000]]
    Path(out).write_text(json.dumps(records))


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--worker":
    sys.path.insert(0, str(ROOT / "tests"))
    _worker(sys.argv[2])
