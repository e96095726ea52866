"""OpInfo in bfloat16 on the C++ target (CPU).

    python -m benchmarks.opinfo_bf16                  # the CI subset's ops (tests/test_opinfo_subset.py)
    python -m benchmarks.opinfo_bf16 --ops all        # every OpInfo op with bfloat16 CPU samples

Each sample's function variant is compiled with `backend="fuselens"` and compared
with eager in bfloat16 on the CPU at torch's bfloat16 tolerances (rtol 1.6e-2,
atol 1e-2), as benchmarks/gpu_check.py does on CUDA. Prints the pass rate, the
fraction of ATen nodes lowered into kernels and every failure.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import sys
from pathlib import Path
from typing import Optional

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import fuselens.compiler  # noqa: E402
fuselens.compiler.register()  # a source checkout (the GPU machine) has no entry point
from benchmarks import opinfo_harness as h  # noqa: E402


def _subset() -> set[str]:
    spec = importlib.util.spec_from_file_location("opinfo_subset", ROOT / "tests" / "test_opinfo_subset.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return set(dict(mod.SUBSET))


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="subset", help="subset | all | comma-separated OpInfo names")
    ap.add_argument("--max-samples", type=int, default=2, help="samples per op, 0 = all")
    ap.add_argument("--json", default="", help="write every case here")
    args = ap.parse_args(argv)
    names = None if args.ops == "all" else _subset() if args.ops == "subset" else set(args.ops.split(","))
    cases = h.dtype_cases("cpu", (torch.bfloat16,), names, args.max_samples or None)
    good = [r for r in cases if r["ok"]]
    upstream = [r for r in cases if r.get("upstream")]
    low = sum(r.get("lowered", 0) for r in cases)
    ext = sum(r.get("extern", 0) for r in cases)
    ops = {r["op"] for r in cases}
    print(f"bfloat16 on CPU, torch {torch.__version__}: {len(good)}/{len(cases) - len(upstream)} cases pass over "
          f"{len(ops)} ops, {len(upstream)} more differ from eager under aot_eager too (torch's); "
          f"ATen nodes lowered {low}, extern {ext}: {100 * low / max(low + ext, 1):.1f}% lowered")
    reasons = collections.Counter(x.split(" in graph")[0] for r in cases for x in r.get("reasons", []))
    for why, n in reasons.most_common(8):
        print(f"  {n:4d}  {why}")
    for r in cases:
        if not r["ok"]:
            print(f"{'UPSTREAM' if r.get('upstream') else 'FAIL'} {r['op']} sample {r.get('sample')}: {r.get('why', '')[:300]}")
    if args.json:
        Path(args.json).write_text(json.dumps(cases, indent=1, default=str))
    return 0 if len(good) + len(upstream) == len(cases) else 1


if __name__ == "__main__":
    sys.exit(main())
