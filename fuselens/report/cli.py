"""`fuselens report`: run a program under capture and render what
torch.compile did, for a person (terminal, Markdown, HTML) or a machine
(JSON, SARIF).

Exit codes (documented in `--help`):
  0  the report was produced (the program's own crash is a finding, not a failure)
  1  `--fail-on` matched a finding
  2  bad usage: unknown option, missing file, not Python, unwritable -o
  3  fuselens itself failed (a bug; the message says where)

This module never imports torch: the program runs in the capture worker.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from typing import Any, Callable, Optional

from fuselens import run_args
from fuselens.cli_parser import UsageError
from fuselens.events import Report
from fuselens.report import common, torchrun_cli
from fuselens.serialize import to_data

FORMATS = ("terminal", "json", "md", "html", "sarif")
EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3

DESCRIPTION = """Run TARGET with torch.compile instrumented (in a worker subprocess) and report
graph breaks, recompiles, compiled graphs, kernels, fusion decisions and compile time."""

EPILOG = f"""targets:
  fuselens report train.py [-- ARGS]      a script; ARGS after -- go to the program
  fuselens report -m package.module        a module, like python -m
  fuselens report analysis.ipynb           a notebook's code cells, in order
  fuselens report --from-json run.json     re-render a saved JSON report

{torchrun_cli.TORCHRUN_HELP_EPILOG}

exit codes:
  0  report produced (a crash of the program itself is an `error` finding)
  1  a finding matched --fail-on
  2  bad usage: unknown option, missing file, not a Python script or notebook
  3  fuselens failed internally

--fail-on categories: {", ".join(common.FAIL_CATEGORIES)} (comma separated;
  "any" = graph-break,recompile,error). `error` is a program that failed (raised, exited
  non-zero, hung, crashed) or a torchrun job whose ranks diverged; `fallback` an op our backend ran in ATen, `eager-fallback` a graph
  that ran eagerly after its compile failed, `internal` a fuselens bug: these ran correctly."""


def configure(p: argparse.ArgumentParser) -> None:
    """The options of `fuselens report`: the shared run options and its own."""
    p.description, p.epilog = DESCRIPTION, EPILOG
    run_args.add_run_options(p)
    p.add_argument("--from-json", metavar="FILE", help="render a saved JSON report instead of running")
    p.add_argument("-f", "--format", choices=FORMATS, default="terminal", help="output format (default: terminal)")
    p.add_argument("-o", "--output", metavar="FILE", help="write the report to FILE instead of stdout")
    p.add_argument("--fail-on", type=_fail_on, default=[], metavar="KINDS",
                   help="exit 1 when the report has these findings: graph-break,recompile,error,...")
    p.add_argument("--no-time-kernels", dest="time_kernels", action="store_false",
                   help="do not profile kernel calls (faster; the report has no kernel times)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="terminal: every graph, kernel, fusion decision, fallback and torch's own text "
                        "(default: a summary that fits a screen)")
    p.add_argument("--cold", action="store_true",
                   help="turn compile caches off for the run (every graph compiled and logged afresh; slower). "
                        "By default caches are left as you have them")
    p.add_argument("--no-verify-fixes", dest="verify_fixes", action="store_false",
                   help="do not re-run the program with each fix applied (no fix is then marked verified/preferred)")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="terminal: only findings and the summary; no progress line")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto", help="terminal colours")
    torchrun_cli.add_arguments(p)


def main(argv: Optional[list[str]] = None) -> int:
    """`fuselens report ARGV`; returns the exit code."""
    from fuselens.cli import main as fuselens_main

    return fuselens_main(["report", *(sys.argv[1:] if argv is None else argv)])


def run(args: argparse.Namespace, program_args: list[str]) -> int:
    """Run (or re-render, or merge) and write the report; the exit code."""
    _check_output(args.output)
    run_args.compiler_options(args.settings)  # a switch for the TUI only fails here, before a run

    if torchrun_cli.check_merge_usage(args, program_args):
        raise UsageError(torchrun_cli.check_merge_usage(args, program_args))
    if args.from_json:
        if args.target or args.module or program_args:
            raise UsageError("--from-json renders a saved report; give no target with it")
        report = _load_json(args.from_json)
    elif args.merge:
        report = _distributed(torchrun_cli.merged, args.merge)
    elif torchrun_cli.wanted(args, program_args):
        report = _distributed(torchrun_cli.run, args, program_args, _options(args), _echo(args))
    else:
        report = _run(args, program_args)
        if report is None:
            return EXIT_INTERNAL

    text = render(report, args.format, color=_use_color(args), quiet=args.quiet, width=_width(args),
                  verbose=getattr(args, "verbose", False))
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as exc:
            raise UsageError(f"cannot write {args.output}: {exc.strerror or exc}") from None
        if not args.quiet:
            print(f"fuselens: wrote {args.output} ({common.summary_line(report)})", file=sys.stderr)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()

    failing = common.failing_findings(report, args.fail_on)
    if failing:
        print(f"fuselens: failing because of {', '.join(failing)} findings (--fail-on)", file=sys.stderr)
        return EXIT_FINDINGS
    return EXIT_OK


def render(report: Report, fmt: str, *, color: bool = False, quiet: bool = False, width: int = 100,
           root: Optional[str] = None, verbose: bool = False) -> str:
    """The report in `fmt` (one of FORMATS). Paths are shown relative to the
    current directory; SARIF URIs relative to the repository root."""
    cwd = os.getcwd()
    if fmt == "terminal":
        from fuselens.report.terminal import render_terminal

        return render_terminal(report, width=width, color=color, quiet=quiet, root=root or cwd, verbose=verbose)
    if fmt == "json":
        from fuselens.report.json_format import render_json

        return render_json(report)
    if fmt == "md":
        from fuselens.report.markdown import render_markdown

        return render_markdown(report, root=root or cwd)
    if fmt == "html":
        from fuselens.report.html import render_html

        return render_html(report, root=root or cwd)
    if fmt == "sarif":
        from fuselens.report.sarif import render_sarif

        return render_sarif(report, root=root or repo_root(cwd))
    raise UsageError(f"unknown format {fmt!r}")


def repo_root(start: str) -> str:
    """The enclosing git work tree of `start` (SARIF paths are relative to
    it, as GitHub code scanning expects), else `start` itself."""
    here = os.path.abspath(start)
    while True:
        if os.path.exists(os.path.join(here, ".git")):
            return here
        parent = os.path.dirname(here)
        if parent == here:
            return os.path.abspath(start)
        here = parent


# -- running -------------------------------------------------------------------
def _run(args: argparse.Namespace, program_args: list[str]) -> Optional[Report]:
    from fuselens.capture import Target, TargetError, analyze

    spec = run_args.target_spec(args)
    if not spec:
        raise UsageError("no target: give a script.py, -m package.module or a notebook.ipynb")
    try:
        target = Target.from_cli([*spec, "--", *program_args])
    except TargetError as exc:
        raise UsageError(str(exc)) from None
    options = _options(args)
    echo = _echo(args)
    show_progress = not args.quiet and sys.stderr.isatty()
    try:
        if show_progress:
            report = _analyze_with_progress(analyze, target, options, echo)
        else:
            report = analyze(target, options, echo=echo)
        if args.verify_fixes and target.kind == "script":
            _verify(report, target, options)
        return report
    except Exception as exc:  # capture itself failed: a fuselens bug, not the program's
        print(f"fuselens report: internal error while running {target.label()}: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return None


def _options(args: argparse.Namespace) -> Any:
    return run_args.run_options(args, run_args.compiler_options(args.settings),
                                time_kernels=args.time_kernels, cold_caches=args.cold)


def _echo(args: argparse.Namespace) -> tuple[Any, Any]:
    """Where the program's (stdout, stderr) pass through as it runs. When the
    report itself goes to stdout in a machine format, the program's stdout
    goes to stderr so that the JSON/SARIF stays parseable."""
    machine = args.format != "terminal" and not args.output
    return (sys.stderr if machine else sys.stdout, sys.stderr)


def _distributed(fn: Callable[..., Report], *fn_args: Any) -> Report:
    """A torchrun run or a --merge, bad distributed usage as exit code 2."""
    try:
        return fn(*fn_args)
    except torchrun_cli.TorchrunUsage as exc:
        raise UsageError(str(exc)) from None


def _verify(report: Report, target: Any, options: Any) -> None:
    """Re-run copies of the program with each editable fix applied (quietly,
    no kernel timing) so that only fixes that work are preferred. Verdicts
    come from the verdict cache when nothing they depend on changed
    (`--cold`: re-run them all); the report says which."""
    import dataclasses

    from fuselens.capture import Target, analyze
    from fuselens.report.verdicts import RunContext, VerdictStore
    from fuselens.report.verify import verify_report

    quiet = dataclasses.replace(options, time_kernels=False)

    def run(path: str) -> Report:
        return analyze(Target("script", path, list(target.args), target.cwd, path), quiet)

    # Whether caches are cold changes how long a run takes, not what it shows.
    depends = {k: v for k, v in to_data(quiet).items() if k not in ("cold_caches", "output_limit_bytes")}
    context = RunContext.of(target.value, target.args, target.cwd, depends, report.run.torch_version,
                            report.run.python_version)
    store = VerdictStore.open(refresh=options.cold_caches)
    done = verify_report(report, target.value, run, store=store, context=context)
    report.run.fix_verdicts = done.describe()
    for problem in store.problems[:3]:
        print(f"fuselens report: {problem}", file=sys.stderr)


def _analyze_with_progress(analyze: Callable[..., Report], target: Any, options: Any, echo: Any = None) -> Report:
    """A one-line spinner on stderr, updated with counts as events arrive."""
    from rich.console import Console

    console = Console(stderr=True)
    seen: dict[str, int] = {}
    label = f"running {target.label()}"
    with console.status(label) as status:
        def on_event(event: Any) -> None:
            name = type(event).__name__
            seen[name] = seen.get(name, 0) + 1
            parts = [f"{seen[k]} {v}" for k, v in (("GraphBreak", "graph breaks"), ("Recompile", "recompiles"),
                                                    ("CompiledGraph", "graphs"), ("Kernel", "kernels")) if k in seen]
            status.update(f"{label}  " + ", ".join(parts) if parts else label)

        return analyze(target, options, on_event=on_event, echo=echo)


# -- small helpers ---------------------------------------------------------------
def _load_json(path: str) -> Report:
    try:
        with open(path, encoding="utf-8") as f:
            return Report.from_json(f.read())
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise UsageError(f"{path}: not a fuselens JSON report ({type(exc).__name__}: {exc})".splitlines()[0]) from None


def _check_output(path: Optional[str]) -> None:
    """Fail before a long run, not after it, when -o cannot be written."""
    if not path:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UsageError(f"-o {path}: is a directory")
    if not os.path.isdir(folder):
        raise UsageError(f"-o {path}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"-o {path}: folder {folder} is not writable")


def _use_color(args: argparse.Namespace) -> bool:
    if args.color != "auto":
        return args.color == "always"
    if args.output or os.environ.get("NO_COLOR"):
        return False
    return sys.stdout.isatty()


def _width(args: argparse.Namespace) -> int:
    if args.output or not sys.stdout.isatty():
        return 100
    return max(60, shutil.get_terminal_size((100, 24)).columns)


def _fail_on(text: str) -> list[str]:
    try:
        return common.parse_fail_on(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("--fail-on: ", "")) from None
