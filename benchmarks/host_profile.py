"""Where a compiled model's host time goes: cProfile over repeated inference calls.

    python -m benchmarks.host_profile --models llama,gpt2 --backends fuselens,inductor --out DIR

Prints the functions with the most own time (tottime) per call: the generated
wrapper, launchers, allocations, library-call bindings. GPU only (the wrapper's
direct launch path exists only on CUDA).
"""

from __future__ import annotations

import argparse
import cProfile
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


def profile(model: str, backend: str, calls: int, top: int, out: Path | None) -> None:
    from fuselens.compiler.runtime import wrapper_codegen

    torch._dynamo.reset()
    case = build(model, "gpu")
    module = case.module.to("cuda").bfloat16().eval()
    inputs = case.make_inputs("cuda")
    compiled = torch.compile(module, backend=backend)
    with wrapper_codegen.recorded_sources() as sources:
        with torch.no_grad():
            for _ in range(5):
                compiled(**inputs)
            torch.cuda.synchronize()
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(calls):
                compiled(**inputs)
            prof.disable()
            torch.cuda.synchronize()
    stream = io.StringIO()
    stats = pstats.Stats(prof, stream=stream)
    stats.sort_stats("tottime")
    stream.write(f"{model} {backend}: {calls} calls\n")
    stats.print_stats(top)
    stats.sort_stats("cumulative")
    stats.print_stats(top)
    print(stream.getvalue())
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"host_{model}_{backend}.txt").write_text(stream.getvalue())
        for i, src in enumerate(sources):
            (out / f"wrapper_{model}_{i}.py").write_text(src)


def main(argv: Any = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="llama")
    ap.add_argument("--backends", default="fuselens")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--out", default="", help="write the statistics and fuselens' generated wrappers here")
    args = ap.parse_args(argv)
    for model in args.models.split(","):
        for backend in args.backends.split(","):
            profile(model, backend, args.calls, args.top, Path(args.out) if args.out else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
