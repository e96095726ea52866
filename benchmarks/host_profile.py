"""Where a compiled model's host time goes: cProfile over repeated steps.

    python -m benchmarks.host_profile --models llama,gpt2 --backends fuselens,inductor --out DIR
    python -m benchmarks.host_profile --models densenet121 --modes train --backends fuselens,inductor
    python -m benchmarks.host_profile --models efficientnet --modes train --backends fuselens_cg,inductor_cg

Inference in bf16, or (`--modes train`) the training step of `benchmarks.models`: forward
and backward under bf16 autocast.

Prints the functions with the most own time (tottime) per call: the generated
wrapper, launchers, allocations, library-call bindings. With `--out`, also each
backend's generated wrappers (Inductor's output code too), to count what each does
per call, in one file a backend with each graph's code under a `# ===== graph N` line. GPU
only (the wrapper's direct launch path exists only on CUDA).
"""

from __future__ import annotations

import argparse
import io
import pstats
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import fuselens.compiler  # noqa: E402
fuselens.compiler.register()  # a source checkout (the GPU machine) has no entry point
from benchmarks.real_models import build  # noqa: E402


def profile(model: str, backend: str, mode: str, calls: int, top: int, out: Path | None) -> None:
    from benchmarks.models import backends_for, make_step, placed, profiled_steps
    from fuselens.compiler.runtime import wrapper_codegen

    train = mode == "train"
    torch._dynamo.reset()
    case = build(model, "gpu")
    module, inputs = placed(case, train, "cuda")
    suite = dict(backends_for("cuda", True, []))  # the suite's labels; any other is a backend's name
    kwargs = suite[backend] if backend in suite and backend != "eager" else {"backend": backend}
    step = make_step(case, torch.compile(module, **kwargs), inputs, train, "cuda")
    loaded = len(_inductor_modules())
    with wrapper_codegen.recorded_sources() as sources:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        prof = profiled_steps(step, calls, "cuda")
    if backend.startswith("inductor"):  # its output code, for the same comparison of what each wrapper does per call
        sources = [Path(m.__file__).read_text() for m in _inductor_modules()[loaded:]
                   if hasattr(m, "call") and getattr(m, "__file__", None)]
    stream = io.StringIO()
    stats = pstats.Stats(prof, stream=stream)
    stats.sort_stats("tottime")
    stream.write(f"{model} {mode} {backend}: {calls} steps\n")
    stats.print_stats(top)
    stats.sort_stats("cumulative")
    stats.print_stats(top)
    print(stream.getvalue())
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"host_{model}_{mode}_{backend}.txt").write_text(stream.getvalue())
        # one file a backend: the device returns few files, and Inductor's backward was one too many
        (out / f"wrappers_{model}_{mode}_{backend}.py").write_text(
            "".join(f"# ===== graph {i} =====\n{src}\n" for i, src in enumerate(sources)))


def _inductor_modules() -> list:
    """The modules Inductor has loaded its generated code into, in load order."""
    from torch._inductor.codecache import PyCodeCache

    return list(getattr(PyCodeCache, "modules", []))


def main(argv: Any = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="llama")
    ap.add_argument("--modes", default="infer", help="infer,train")
    ap.add_argument("--backends", default="fuselens", help="of benchmarks.models': inductor, fuselens, and with "
                    "CUDA graphs inductor_cg (reduce-overhead), fuselens_cg")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--out", default="", help="write the statistics and each backend's generated wrappers here")
    args = ap.parse_args(argv)
    for model in args.models.split(","):
        for mode in args.modes.split(","):
            for backend in args.backends.split(","):
                profile(model, backend, mode, args.calls, args.top, Path(args.out) if args.out else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
