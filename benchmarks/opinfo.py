"""Full OpInfo correctness run of a torch.compile backend (default: fuselens).

    python -m benchmarks.opinfo                       # every float32 CPU op, 3 samples each
    python -m benchmarks.opinfo --backend eager --ops add,softmax --max-samples 0
    python -m benchmarks.opinfo --json /tmp/opinfo.json --variants fn,inplace,out
    python -m benchmarks.opinfo --grad --max-samples 1 --workdir /tmp/grad   # gradients, float32+float64

Prints the pass rate, failures by category and op, skips by reason, and the
fraction of ATen nodes that went into generated kernels versus extern/ATen
fallback calls (from the compiler's events).

Cases run in worker subprocesses so that a crash in generated code (a
segfault) costs one case, not the run: each worker appends one JSON line per
case to a results file, and the parent restarts a dead worker after the case
it died on, recording that case as `crash`.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parent.parent


def _worker(args: argparse.Namespace) -> int:
    """Run the cases of `--ops` and append results to `--results`; cases
    already in the file are skipped (that is how a restart resumes)."""
    import torch

    from benchmarks import opinfo_grad as g
    from benchmarks import opinfo_harness as h

    if args.threads:
        torch.set_num_threads(args.threads)
    results = Path(args.results)
    done = set()
    if results.exists():
        for line in results.read_text().splitlines():
            rec = json.loads(line)
            done.add(rec["key"])
    # An op spec is "name" (all --variants) or "name:fn+inplace" (those variants).
    variants_of = {}
    for spec in args.ops.split(","):
        name, _, variants = spec.partition(":")
        variants_of[name] = tuple((variants or args.variants).replace("+", ",").split(","))
    ops = [op for op in h.float32_cpu_ops() if h.full_name(op) in variants_of]
    options = json.loads(args.options) if args.options else None
    max_samples = args.max_samples or None
    # inplace/out variants mostly re-test the fn variant's kernels plus the
    # mutation/out handling: fewer samples keep a full run affordable.
    mutating_samples = args.max_samples_mutating or max_samples

    def cases_of(op: Any) -> Any:
        for variant in variants_of[h.full_name(op)]:
            if variant in g.GRAD_DTYPES:
                try:
                    samples = g.grad_samples(op, g.GRAD_DTYPES[variant], max_samples)
                except Exception:  # a broken sample generator is not our business
                    continue
                yield from ((op, index, sample, variant) for index, sample in samples)
                continue
            budget = max_samples if variant == "fn" else mutating_samples
            yield from h.iter_cases([op], (variant,), budget)

    def run(op: Any, index: int, sample: Any, variant: str) -> Any:
        if variant in g.GRAD_DTYPES:
            return g.run_grad_case(op, index, sample, variant, args.backend, options=options,
                                   timeout_s=args.case_timeout)
        return h.run_case(op, index, sample, variant, args.backend, options=options,
                          dynamic=args.dynamic, timeout_s=args.case_timeout)

    with results.open("a") as fh:
        cases = (c for op in ops for c in cases_of(op))
        for op, index, sample, variant in cases:
            key = f"{h.full_name(op)}|{variant}|{index}"
            if key in done:
                continue
            # Written before running: if the process dies, the parent knows where.
            fh.write(json.dumps({"key": key, "started": True}) + "\n")
            fh.flush()
            try:
                res = run(op, index, sample, variant)
            except Exception as exc:  # a bug of this harness: visible, never a pass
                res = h.CaseResult(op=h.full_name(op), variant=variant, sample=index, status="fail",
                                   category="harness error", detail=f"{type(exc).__name__}: {exc}")
            # A null result: the variant does not apply to this sample.
            fh.write(json.dumps({"key": key, "result": res.to_dict() if res else None}) + "\n")
            fh.flush()
    return 0


def _read_results(path: Path) -> tuple[list[dict], Optional[str]]:
    """Finished results, and the key of a started-but-unfinished case."""
    finished: dict[str, dict] = {}
    started: list[str] = []
    if path.exists():
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if "result" in rec:
                finished[rec["key"]] = rec["result"]
            else:
                started.append(rec["key"])
    dangling = [k for k in started if k not in finished]
    return [r for r in finished.values() if r is not None], (dangling[-1] if dangling else None)


def run_ops(op_names: list[str], args: argparse.Namespace, results: Path, log: Path,
            env: Optional[dict[str, str]] = None) -> list[dict]:
    """Drive one worker over `op_names` until every case has a result,
    restarting it after crashes. Returns the result dicts. `env`: the worker's
    environment (default: this process's), e.g. with TRITON_INTERPRET=1."""
    from benchmarks.opinfo_harness import CaseResult

    cmd = [
        sys.executable, "-m", "benchmarks.opinfo", "--worker", "--results", str(results),
        "--ops", ",".join(op_names), "--backend", args.backend, "--variants", args.variants,
        "--max-samples", str(args.max_samples), "--max-samples-mutating", str(args.max_samples_mutating),
        "--case-timeout", str(args.case_timeout),
        "--threads", str(args.threads),
    ]
    if args.options:
        cmd += ["--options", args.options]
    if args.dynamic:
        cmd += ["--dynamic"]
    for _attempt in range(200):
        with log.open("a") as lf:
            proc = subprocess.run(cmd, cwd=REPO, stdout=lf, stderr=subprocess.STDOUT, env=env)
        _, dangling = _read_results(results)
        if proc.returncode == 0 and dangling is None:
            break
        if dangling is None:  # died outside a case (import error...): give up
            print(f"worker exited {proc.returncode} outside a case; see {log}", file=sys.stderr)
            break
        op, variant, sample = dangling.split("|")
        crash = CaseResult(op=op, variant=variant, sample=int(sample), status="fail", category="crash",
                           detail=f"worker process died with exit code {proc.returncode} (see {log})")
        with results.open("a") as fh:
            fh.write(json.dumps({"key": dangling, "result": crash.to_dict()}) + "\n")
    return _read_results(results)[0]


# Extern calls the compiler keeps as library calls on purpose (issue 3: matmul,
# convolution, SDPA); the other extern nodes are ATen fallbacks.
LIBRARY_OPS = {
    "mm", "bmm", "addmm", "baddbmm", "addmv", "addbmm", "mv", "dot", "addr", "convolution",
    "convolution_backward", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention", "scaled_dot_product_attention",
    "_scaled_dot_product_flash_attention_for_cpu_backward",
}


def summarize(records: list[dict], out: Any = sys.stdout) -> dict[str, Any]:
    """Print the summary; return its numbers."""
    by_status = collections.Counter(r["status"] for r in records)
    compared = by_status["pass"] + by_status["fail"]
    rate = by_status["pass"] / compared if compared else 0.0
    ops_total = sorted({r["op"] for r in records})
    failing_ops = sorted({r["op"] for r in records if r["status"] == "fail"})
    lowered = sum(r["nodes"]["lowered"] for r in records)
    extern = sum(r["nodes"]["extern"] for r in records)
    no_kernel = sum(r["nodes"]["no_kernel"] for r in records)
    frac = lowered / (lowered + extern) if lowered + extern else 0.0
    p = lambda *a: print(*a, file=out)  # noqa: E731
    p(f"cases: {len(records)} over {len(ops_total)} ops  " + "  ".join(f"{k}={v}" for k, v in sorted(by_status.items())))
    p(f"pass rate (pass / (pass+fail)): {rate:.1%}  ({by_status['pass']}/{compared}); "
      f"ops with a failing case: {len(failing_ops)}/{len(ops_total)}")
    p(f"ATen nodes: lowered into generated kernels {lowered}, extern/fallback {extern}, "
      f"in no kernel (views/no-ops) {no_kernel}; lowered fraction {frac:.1%} "
      f"(lowered / (lowered + extern))")
    library = sum(1 for r in records for op in r["nodes"]["extern_ops"] if op.split(".")[1:2] and
                  op.split(".")[1] in LIBRARY_OPS)
    if lowered + extern - library:
        p(f"  of the extern nodes {library} are library calls by design (matmul, convolution, SDPA); "
          f"lowered / (lowered + ATen fallback) = {lowered / (lowered + extern - library):.1%}")
    bw_low = sum(r.get("backward", {}).get("lowered", 0) for r in records)
    bw_ext = sum(r.get("backward", {}).get("extern", 0) for r in records)
    if bw_low + bw_ext:
        bw_lib = sum(1 for r in records for op in r.get("backward", {}).get("extern_ops", [])
                     if op.split(".")[1:2] and op.split(".")[1] in LIBRARY_OPS)
        p(f"backward graphs: lowered {bw_low}, extern {bw_ext} ({bw_lib} library calls by design); "
          f"lowered fraction {bw_low / (bw_low + bw_ext):.1%}, "
          f"lowered / (lowered + ATen fallback) {bw_low / max(bw_low + bw_ext - bw_lib, 1):.1%}")
    graph_fallbacks = sum(r["nodes"]["graph_fallbacks"] for r in records)
    if graph_fallbacks:
        p(f"whole graphs that fell back to eager (compile error, result still right): {graph_fallbacks}")
        fell = collections.defaultdict(set)
        for r in records:
            if r["nodes"]["graph_fallbacks"]:
                for reason in r["nodes"]["fallback_reasons"] or ["?"]:
                    fell[reason[:160]].add(r["op"])
        for reason, ops in sorted(fell.items(), key=lambda kv: -len(kv[1]))[:15]:
            p(f"  {len(ops):4d} ops  {reason}: {', '.join(sorted(ops)[:8])}")
    cats = collections.Counter(r["category"] for r in records if r["status"] == "fail")
    if cats:
        p("\nfailures by category:")
        for cat, n in cats.most_common():
            ops = sorted({r["op"] for r in records if r["status"] == "fail" and r["category"] == cat})
            p(f"  {n:5d}  {cat}: {', '.join(ops[:25])}{' ...' if len(ops) > 25 else ''}")
    for status in ("upstream", "skip", "not_compiled"):
        c = collections.Counter(r["category"].split(":")[0] for r in records if r["status"] == status)
        if c:
            p(f"\n{status} by reason:")
            for cat, n in c.most_common(8):
                p(f"  {n:5d}  {cat}")
    ext = collections.Counter(op for r in records for op in r["nodes"]["extern_ops"])
    if ext:
        p("\nmost frequent extern/fallback ATen ops: " + ", ".join(f"{o} ({n})" for o, n in ext.most_common(20)))
    seconds = sum(r["seconds"] for r in records)
    p(f"\ncompile+first-call time over all cases: {seconds:.0f} s")
    return {"cases": len(records), "status": dict(by_status), "pass_rate": rate, "lowered_fraction": frac,
            "backward_lowered": bw_low, "backward_extern": bw_ext,
            "lowered": lowered, "extern": extern, "no_kernel": no_kernel, "failing_ops": failing_ops}


def print_failures(records: list[dict], limit: int, out: Any = sys.stdout) -> None:
    fails = [r for r in records if r["status"] == "fail"]
    for r in fails[:limit]:
        print(f"\n--- {r['op']} [{r['variant']} sample {r['sample']}] {r['category']}\n"
              f"    sample: {r['sample_desc']}\n    " + r["detail"].replace("\n", "\n    "), file=out)
    if len(fails) > limit:
        print(f"\n... {len(fails) - limit} more failing cases (see --json)", file=out)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="fuselens")
    ap.add_argument("--ops", default="", help="comma-separated OpInfo full names, each optionally "
                    "with its variants as name:fn+inplace (default: all float32 CPU ops)")
    ap.add_argument("--variants", default="fn,inplace,out")
    ap.add_argument("--max-samples", type=int, default=2, help="samples per op (fn variant), 0 = all")
    ap.add_argument("--max-samples-mutating", type=int, default=1,
                    help="samples per op for the inplace and out variants, 0 = same as --max-samples")
    ap.add_argument("--options", default="", help="backend options as JSON, e.g. '{\"fusion\": false}'")
    ap.add_argument("--dynamic", action="store_true", help="compile with dynamic=True (default dynamic=False)")
    ap.add_argument("--case-timeout", type=int, default=120)
    ap.add_argument("--threads", type=int, default=0, help="torch threads in workers (0 = torch default)")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes in parallel")
    ap.add_argument("--json", default="", help="write every case result here")
    ap.add_argument("--show-failures", type=int, default=30)
    ap.add_argument("--grad", action="store_true", help="gradient cases (benchmarks/opinfo_grad.py): every "
                    "autograd op, forward+backward compiled, in float32 and float64 (sets --variants unless it names only grad_float32 or grad_float64)")
    ap.add_argument("--workdir", default="", help="keep the workers' results here; a rerun resumes from them")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--results", default="", help=argparse.SUPPRESS)
    ap.add_argument("--summarize", default="", help="print the summary of a saved --json file and exit")
    args = ap.parse_args(argv)
    if args.worker:
        return _worker(args)
    if args.summarize:
        saved = json.loads(Path(args.summarize).read_text())
        summarize(saved["cases"])
        print_failures(saved["cases"], args.show_failures)
        return 0

    import torch  # noqa: F401  (only to list ops; the work happens in workers)

    from benchmarks import opinfo_harness as h

    if args.grad:
        from benchmarks import opinfo_grad as g

        if not set(args.variants.split(",")) <= set(g.GRAD_DTYPES):  # e.g. --variants grad_float32 alone
            args.variants = ",".join(g.GRAD_DTYPES)
        names = [h.full_name(op) for op in g.grad_ops()]
    else:
        names = [h.full_name(op) for op in h.float32_cpu_ops()]
    if args.ops:
        wanted = args.ops.split(",")
        unknown = [n for n in wanted if n.partition(":")[0] not in names]
        if unknown:
            print(f"unknown ops: {unknown}", file=sys.stderr)
            return 2
        names = wanted
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="fuselens-opinfo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    chunks = [names[i :: args.jobs] for i in range(args.jobs)]
    records: list[dict] = []
    start = time.time()

    def drive(i: int) -> None:
        records.extend(run_ops(chunks[i], args, workdir / f"results{i}.jsonl", workdir / f"worker{i}.log"))

    threads = [threading.Thread(target=drive, args=(i,)) for i in range(args.jobs) if chunks[i]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    import platform

    print(f"backend={args.backend} options={args.options or '{}'} variants={args.variants} "
          f"max_samples={args.max_samples or 'all'} (inplace/out: {args.max_samples_mutating or 'same'}) "
          f"dynamic={args.dynamic} torch={torch.__version__} "
          f"python={platform.python_version()} wall={time.time() - start:.0f}s logs={workdir}")
    stats = summarize(records)
    print_failures(records, args.show_failures)
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": stats, "args": vars(args), "cases": records}, indent=1))
    return 1 if stats["status"].get("fail") else 0


if __name__ == "__main__":
    sys.exit(main())
