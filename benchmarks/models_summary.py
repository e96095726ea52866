"""Print a saved `benchmarks.models --out DIR` run: the table, fuselens' fallbacks and
errors per model, and (with --top N) each backend's top kernels.

    python -m benchmarks.models_summary DIR/models_bench.json --top 12
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def main(argv: Any = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json")
    ap.add_argument("--top", type=int, default=0)
    args = ap.parse_args(argv)
    from benchmarks.models import table

    data = json.load(open(args.json))
    results = data["results"]
    backends = [b for b in ("eager", "inductor", "fuselens", "inductor_cg", "fuselens_cg")
                if any(b in r for r in results)]
    print(json.dumps(data["info"]))
    print(table(results, backends))
    for rec in results:
        for b in backends:
            r = rec.get(b, {})
            if b.startswith("fuselens") and (r.get("errors") or r.get("kernels_by_kind")):
                print(f"{rec['model']} {rec['mode']} {b}: {r.get('kernels_by_kind')} graphs={r.get('graphs')}")
                for e in r.get("errors", []):
                    print(f"    {e[:160]}")
            for t in r.get("top", [])[: args.top]:
                print(f"    {b:9s} {t['calls']:5.0f} {t['ms']:7.3f} ms  {t['name'][:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
