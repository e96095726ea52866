"""Where a compiled model's host time goes: cProfile over repeated inference calls.

    python -m benchmarks.host_profile --model llama --backend fuselens --calls 50

Prints the functions with the most own time (tottime) per call: the generated
wrapper, launchers, allocations, library-call bindings. GPU only (the wrapper's
direct launch path exists only on CUDA).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import fuselens.compiler  # noqa: E402,F401
from benchmarks.real_models import build  # noqa: E402


def main(argv: Any = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="llama")
    ap.add_argument("--backend", default="fuselens")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args(argv)
    case = build(args.model, "gpu")
    module = case.module.to("cuda").bfloat16().eval()
    inputs = case.make_inputs("cuda")
    compiled = torch.compile(module, backend=args.backend)
    with torch.no_grad():
        for _ in range(5):
            compiled(**inputs)
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            compiled(**inputs)
        prof.disable()
        torch.cuda.synchronize()
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime")
    print(f"{args.model} {args.backend}: {args.calls} calls")
    stats.print_stats(args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
