"""Training correctness on any device: `backend="fuselens"` gradients against eager.

    python -m benchmarks.training_check --device cuda --out DIR    # fp32 (TF32 off) and bf16 autocast
    python -m benchmarks.training_check --device cpu --precisions fp32 --size cpu

Cases (issue 16 items 3-4, the GPU half of what tests/test_training_gradients.py proves
on the CPU in CI): scaled_dot_product_attention forward+backward under each SDPA backend
the device has; a forward+backward of each real model of benchmarks/real_models.py (every
parameter's gradient); compiled SGD-momentum / Adam / AdamW steps (parameters after 5
steps); a 20-step AdamW loop on GPT-2 (every loss).

Criteria, stated once here. The reference is eager in float64 (same inputs, same weights);
eager and fuselens in the precision under test are both measured against it, so a gradient
that is ill-conditioned (a bias under a following normalization, zero in exact arithmetic
and rounding noise in practice) is judged by how well eager itself computes it:
- error = relative norm distance to the float64 reference, per tensor and over all tensors
  together;
- fuselens passes when its error over all tensors is at most FACTOR x eager's + SLACK and no
  single tensor's error exceeds FACTOR x max(eager's error on it, eager's overall error) +
  TENSOR_SLACK, with (FACTOR, SLACK, TENSOR_SLACK) per precision in TOLERANCES. fp32 runs
  with TF32 off on both sides; bf16 is autocast for models and bf16 tensors for SDPA.
The direct distance between fuselens and eager in the same precision is reported too.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import fuselens.compiler  # noqa: E402
fuselens.compiler.register()  # a source checkout (the GPU machine) has no entry point
from benchmarks.real_models import MODELS, build  # noqa: E402

TOLERANCES = {"fp32": (1.5, 1e-5, 1e-4), "bf16": (1.5, 1e-3, 1e-2)}  # FACTOR, SLACK, TENSOR_SLACK


@dataclass
class CaseResult:
    case: str
    precision: str
    passed: bool
    error: float  # fuselens against the float64 reference, all tensors together
    eager_error: float  # eager in the same precision against the float64 reference
    vs_eager: float  # fuselens against eager in the same precision
    worst: str = ""  # the tensor furthest over its bound (or nearest to it)
    seconds: float = 0.0
    note: str = ""


def relnorm(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    denom = b.norm().item()
    diff = (a - b).norm().item()
    return diff / denom if denom > 0 else diff


def joint(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().double().flatten() for t in tensors])


@dataclass
class Outcome:
    """What one run of a case produced: named tensors to compare."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)


def judge(case: str, precision: str, got: Outcome, eager: Outcome, ref: Outcome) -> CaseResult:
    factor, slack, tensor_slack = TOLERANCES[precision]
    keys = list(ref.tensors)
    everything = joint([ref.tensors[k] for k in keys])
    total = relnorm(joint([got.tensors[k] for k in keys]), everything)
    total_eager = relnorm(joint([eager.tensors[k] for k in keys]), everything)
    direct = relnorm(joint([got.tensors[k] for k in keys]), joint([eager.tensors[k] for k in keys]))
    bound = {k: factor * max(relnorm(eager.tensors[k], ref.tensors[k]), total_eager) + tensor_slack for k in keys}
    over = {k: relnorm(got.tensors[k], ref.tensors[k]) - bound[k] for k in keys}
    worst = max(keys, key=over.get)
    ok = total <= factor * total_eager + slack and over[worst] <= 0
    return CaseResult(case, precision, ok, total, total_eager, direct, worst)


@contextlib.contextmanager
def exact_fp32() -> Iterator[None]:
    """TF32 off for matmuls and convolutions, restored afterwards."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def fresh() -> None:
    torch._dynamo.reset()


# -- SDPA -----------------------------------------------------------------------------

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp64": torch.float64}


def sdpa_backends(device: str, precision: str) -> list[Any]:
    from torch.nn.attention import SDPBackend

    if device != "cuda":
        return [None]
    if precision == "fp32":
        return [SDPBackend.MATH, SDPBackend.EFFICIENT_ATTENTION]
    return [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH]


def sdpa_run(fn: Callable, device: str, precision: str, backend: Any, causal: bool) -> Outcome:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if precision == "fp64" and device == "cuda":
        backend = SDPBackend.MATH  # the fused kernels have no float64
    g = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(2, 8, 128, 64, generator=g).to(device, DTYPES[precision]) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext(), exact_fp32():
        out = fn(q, k, v, causal)
        out.backward(dout)
    return Outcome({"out": out, "dq": q.grad, "dk": k.grad, "dv": v.grad})


def sdpa_cases(device: str, precision: str) -> list[CaseResult]:
    def attention(q, k, v, causal):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    results = []
    for backend in sdpa_backends(device, precision):
        for causal in (False, True):
            name = f"sdpa {getattr(backend, 'name', 'default').lower()}{' causal' if causal else ''}"
            t0 = time.perf_counter()
            fresh()
            try:
                got = sdpa_run(torch.compile(attention, backend="fuselens"), device, precision, backend, causal)
                eager = sdpa_run(attention, device, precision, backend, causal)
                res = judge(name, precision, got, eager, sdpa_run(attention, device, "fp64", None, causal))
            except RuntimeError as exc:  # a backend this device or shape does not have
                if "No available kernel" not in str(exc):
                    raise
                res = CaseResult(name, precision, True, 0.0, 0.0, 0.0, note="backend unavailable here: skipped")
            res.seconds = time.perf_counter() - t0
            results.append(res)
    return results


# -- real models ----------------------------------------------------------------------


def model_step(module: torch.nn.Module, run: Callable, inputs: dict, loss_of: Callable,
               precision: str, device: str) -> Outcome:
    if precision == "fp64":
        inputs = {k: v.double() if v.is_floating_point() else v for k, v in inputs.items()}
    autocast = torch.autocast(device, dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
    with autocast, exact_fp32():
        loss = loss_of(run(**inputs), inputs)
        loss.backward()
    grads = {n: p.grad for n, p in module.named_parameters() if p.grad is not None}
    return Outcome({"loss": loss.detach(), **grads})


def model_case(name: str, device: str, precision: str, size: str) -> CaseResult:
    case = build(name, size)
    base = case.module.to(device).train()
    inputs = case.make_inputs(device)
    t0 = time.perf_counter()
    fresh()
    mine, eager, ref = copy.deepcopy(base), copy.deepcopy(base), copy.deepcopy(base).double()
    got = model_step(mine, torch.compile(mine, backend="fuselens"), inputs, case.loss, precision, device)
    theirs = model_step(eager, eager, inputs, case.loss, precision, device)
    want = model_step(ref, ref, inputs, case.loss, "fp64", device)
    res = judge(f"{case.label} step", precision, got, theirs, want)
    res.seconds = time.perf_counter() - t0
    return res


# -- optimizers and a loop (fp32) -----------------------------------------------------

OPTIMIZERS = {
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
}


def optimizer_case(name: str, device: str) -> CaseResult:
    def net(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.LayerNorm(256),
                                   torch.nn.Linear(256, 16)).to(device, dtype)

    t0 = time.perf_counter()
    fresh()
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 64, generator=g).to(device), torch.randn(32, 16, generator=g).to(device)
    runs: list[Outcome] = []
    for how in ("fuselens", "eager", "fp64"):
        model = net(torch.float64 if how == "fp64" else torch.float32)
        opt = OPTIMIZERS[name](model.parameters())
        step = torch.compile(opt.step, backend="fuselens") if how == "fuselens" else opt.step
        xs, ys = (x.double(), y.double()) if how == "fp64" else (x, y)
        with exact_fp32():
            for _ in range(5):
                opt.zero_grad()
                F.mse_loss(model(xs), ys).backward()
                step()
        runs.append(Outcome({n: p for n, p in model.named_parameters()}))
    res = judge(f"{name} compiled step x5 (parameters)", "fp32", *runs)
    res.seconds = time.perf_counter() - t0
    return res


def loop_case(device: str, size: str, steps: int = 20) -> CaseResult:
    case = build("gpt2", size)
    t0 = time.perf_counter()
    fresh()
    shape = tuple(case.make_inputs(device)["input_ids"].shape)
    vocab = case.module.config.vocab_size
    runs: list[Outcome] = []
    for how in ("fuselens", "eager", "fp64"):
        model = copy.deepcopy(case.module).to(device).train()
        if how == "fp64":
            model = model.double()
        run = torch.compile(model, backend="fuselens") if how == "fuselens" else model
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        gen = torch.Generator().manual_seed(0)
        losses = Outcome()
        with exact_fp32():
            for i in range(steps):
                ids = torch.randint(0, vocab, shape, generator=gen).to(device)
                opt.zero_grad()
                loss = run(input_ids=ids, labels=ids).loss
                loss.backward()
                opt.step()
                losses.tensors[f"loss {i}"] = loss.detach()
        runs.append(losses)
    res = judge(f"GPT-2 {steps}-step AdamW loop (losses)", "fp32", *runs)
    res.seconds = time.perf_counter() - t0
    return res


def available_models() -> list[str]:
    names = []
    for name in MODELS:
        try:
            __import__("torchvision" if name == "resnet50" else "transformers")
            names.append(name)
        except ImportError:
            print(f"skip {name}: its library is not installed", flush=True)
    return names


def run_all(device: str, precisions: list[str], size: str, models: list[str]) -> list[CaseResult]:
    results: list[CaseResult] = []

    def record(r: CaseResult) -> None:
        results.append(r)
        print(f"{'PASS' if r.passed else 'FAIL'}  {r.precision}  {r.case:<44} err {r.error:.2e}  "
              f"eager {r.eager_error:.2e}  vs eager {r.vs_eager:.2e}  worst {r.worst}  {r.seconds:.1f}s {r.note}",
              flush=True)

    for precision in precisions:
        for r in sdpa_cases(device, precision):
            record(r)
        for name in models:
            record(model_case(name, device, precision, size))
    if "fp32" in precisions:
        for name in OPTIMIZERS:
            record(optimizer_case(name, device))
        if "gpt2" in models:
            record(loop_case(device, size))
    return results


def main(argv: Any = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--size", default="cpu", choices=["cpu", "gpu"],
                    help="model configs of benchmarks/real_models.py (cpu: 2 layers, 2x128 tokens)")
    ap.add_argument("--models", default="", help="subset of " + ",".join(MODELS))
    ap.add_argument("--out", default="", help="write training_check.json here")
    args = ap.parse_args(argv)
    models = [m for m in (args.models.split(",") if args.models else available_models()) if m]
    results = run_all(args.device, args.precisions.split(","), args.size, models)
    failed = [r for r in results if not r.passed]
    versions = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu"}
    print(f"{len(results) - len(failed)}/{len(results)} pass on {versions['device']}, torch {versions['torch']}")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "training_check.json").write_text(json.dumps(
            {"versions": versions, "size": args.size, "results": [asdict(r) for r in results]}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
