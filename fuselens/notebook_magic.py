"""The IPython extension: `%load_ext fuselens`, then `%%fuselens` on a cell.

    %%fuselens [--backend eager] [--timeout 120] [--max-calls 3] [--no-history]
               [--time-kernels] [--height 600] [-o NAME]
    model = torch.compile(model)
    model(x)

The cell does NOT run in the kernel: it runs in a fuselens worker subprocess
under capture (torch.compile graph breaks, recompiles, graphs, kernels), and
the report shows inline as HTML (text in a terminal IPython).

What the worker knows of the notebook: by default the cells executed earlier
in this session (IPython's raw `In[]` history) run first, in order, so a cell
may use the model and data that earlier cells defined, as it would in the
kernel. Other `%%fuselens` cells are left out; magics, shell lines and help
requests are inert there, by the rules of `fuselens.notebook_program` that
`fuselens report` and the language server share (`x = !ls` still defines x);
cells that raised in the kernel (while the extension was loaded) are skipped.
Earlier cells run again in the worker, so with expensive history (a training
loop) or history with side effects, pass `--no-history` and make the cell
self-contained. Findings point at `In[N]:line` (line 1 of the current cell
is its `%%fuselens` line).

This module never imports torch; the worker does.
"""

from __future__ import annotations

import dataclasses
import html
import os
from typing import Any, Optional

from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from fuselens import notebook_program, private_dirs
from fuselens.events import Report, SourceLocation

MAGIC_NAME = "fuselens"
DEFAULT_TIMEOUT_S = 120.0
DEFAULT_HEIGHT_PX = 600


@dataclasses.dataclass
class CellProgram:
    """The notebook the worker runs: code cells and the `In[N]` label of each."""

    sources: list[str]
    labels: list[str]


def build_cell_program(
    cell: str,
    execution_count: Optional[int],
    history: list[tuple[int, str]],
    failed: frozenset[int] = frozenset(),
    use_history: bool = True,
) -> CellProgram:
    """Cells for the worker: the history (execution count, raw source) that
    still matters, then this cell.

    This cell gets a blank first line in place of its `%%fuselens` line so
    that line numbers in the report are the ones the user sees. History
    cells that are `%%fuselens` cells (they ran in a worker, not the kernel)
    and cells that failed are left out."""
    sources: list[str] = []
    labels: list[str] = []
    if use_history:
        for count, source in history:
            if count == execution_count or count in failed or not source.strip():
                continue
            if _is_fuselens_cell(source):
                continue
            sources.append(source)
            labels.append(f"In[{count}]")
    sources.append("\n" + cell)
    labels.append(f"In[{execution_count}]" if execution_count is not None else "this cell")
    return CellProgram(sources, labels)


def _is_fuselens_cell(source: str) -> bool:
    return notebook_program.cell_magic(source) == MAGIC_NAME


def write_notebook(program: CellProgram, path: str) -> None:
    """Writes the cells as an nbformat 4 notebook (what `Target` runs)."""
    notebook_program.write_notebook(program.sources, path)


def relabel_report(report: Report, notebook_path: str, labels: list[str]) -> Report:
    """Points every location of the temporary notebook at `In[N]` instead
    (file "In[N]", no cell index), and rewrites its paths in messages."""

    def label(cell: Optional[int]) -> str:
        return labels[cell] if cell is not None and 0 <= cell < len(labels) else "this cell"

    cell_ref = notebook_program.cell_ref_pattern(notebook_path)

    def fix_text(text: str) -> str:
        text = cell_ref.sub(lambda m: label(int(m.group(1))), text)
        return text.replace(notebook_path, labels[-1])

    def visit(obj: Any) -> None:
        if isinstance(obj, SourceLocation):
            if obj.file == notebook_path or _cell_path(obj.file) == notebook_path:
                obj.file = label(obj.cell)
                obj.cell = None
            return
        if isinstance(obj, list):
            for item in obj:
                visit(item)
            return
        if dataclasses.is_dataclass(obj):
            for f in dataclasses.fields(obj):
                value = getattr(obj, f.name)
                if isinstance(value, str) and notebook_path in value:
                    setattr(obj, f.name, fix_text(value))
                else:
                    visit(value)

    visit(report)
    report.run.target = labels[-1]
    return report


def _cell_path(filename: str) -> Optional[str]:
    split = notebook_program.split_cell_filename(filename)
    return split[0] if split else None


class NotebookReport:
    """What `%%fuselens` returns: the Report, shown as HTML in notebooks and
    as a short summary in a terminal. `.report` is the `fuselens.events.Report`."""

    def __init__(self, report: Report, height: int = DEFAULT_HEIGHT_PX, root: Optional[str] = None) -> None:
        self.report = report
        self.height = height
        self.root = root

    def _repr_html_(self) -> str:
        from fuselens.report.html import render_html

        document = render_html(self.report, root=self.root)
        # An iframe keeps the report's page-wide CSS out of the notebook's page.
        return (
            f'<iframe class="fuselens-report" title="fuselens report" srcdoc="{html.escape(document, quote=True)}" '
            f'style="width:100%;height:{int(self.height)}px;border:1px solid #ccc;resize:vertical"></iframe>'
        )

    def __repr__(self) -> str:
        from fuselens.present import location_label
        from fuselens.report.common import summary_line

        lines = [f"fuselens: {summary_line(self.report)} ({self.report.run.target})"]
        for gb in self.report.graph_breaks:
            lines.append(f"  graph break at {location_label(gb.location)}: {gb.reason}")
        for rc in self.report.recompiles:
            why = rc.reasons[0] if rc.reasons else "guard failed"
            lines.append(f"  recompile of {rc.function} at {location_label(rc.location)}: {why}")
        for err in self.report.errors:
            where = f" at {location_label(err.location)}" if err.location else ""
            lines.append(f"  {err.kind}{where}: {err.message}")
        lines.append(f"  {len(self.report.graphs)} graphs, {len(self.report.kernels)} kernels")
        return "\n".join(lines)


@magics_class
class FuselensMagics(Magics):
    """`%%fuselens`: run the cell under torch.compile capture, show the report."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.failed_cells: set[int] = set()

    def record_result(self, result: Any) -> None:
        """post_run_cell hook: remember cells that raised, to skip them later."""
        count = getattr(result, "execution_count", None)
        if count is not None and not getattr(result, "success", True):
            self.failed_cells.add(count)

    @magic_arguments()
    @argument("--backend", default=None, help="force this torch.compile backend (eager, inductor, fuselens, ...)")
    @argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="stop the cell after this many seconds")
    @argument("--max-calls", type=int, default=None, help="stop once every compiled function ran this many times")
    @argument("--no-history", action="store_true", help="run only this cell (it must be self-contained)")
    @argument("--time-kernels", action="store_true", help="time every generated kernel")
    @argument("--height", type=int, default=DEFAULT_HEIGHT_PX, help="height of the inline report, in pixels")
    @argument("-o", "--output", default=None, help="also store the fuselens Report in this variable")
    @cell_magic
    def fuselens(self, line: str, cell: str) -> NotebookReport:
        """Run this cell under fuselens capture (in a worker subprocess) and
        display the report. See `fuselens.notebook_magic` for what the worker
        knows of earlier cells."""
        from fuselens.capture import RunOptions, Target, analyze

        args = parse_argstring(self.fuselens, line)
        history = self._history()
        program = build_cell_program(
            cell,
            self.shell.execution_count,
            history,
            frozenset(self.failed_cells),
            use_history=not args.no_history,
        )
        cwd = os.getcwd()
        # In the user's private cache, 0700: the cell's program is code the worker runs
        workdir = private_dirs.scratch_dir("cell")
        try:
            path = os.path.join(workdir, "cell.ipynb")
            write_notebook(program, path)
            # The kernel can import modules beside the notebook (cwd on
            # sys.path); the worker puts the temporary notebook's folder first,
            # so hand it the kernel's cwd as well.
            pythonpath = os.pathsep.join(p for p in (cwd, os.environ.get("PYTHONPATH", "")) if p)
            options = RunOptions(
                backend=args.backend,
                timeout_s=args.timeout,
                max_calls=args.max_calls,
                time_kernels=args.time_kernels,
                env={"PYTHONPATH": pythonpath},
            )
            report = analyze(Target("notebook", path, [], cwd), options)
            relabel_report(report, path, program.labels)
        finally:
            private_dirs.remove_scratch(workdir)
        if args.output:
            self.shell.user_ns[args.output] = report
        return NotebookReport(report, height=args.height, root=cwd)

    def _history(self) -> list[tuple[int, str]]:
        """(execution count, raw source) of this session's cells, in order."""
        raw = list(getattr(self.shell.history_manager, "input_hist_raw", []) or [])
        return [(count, source) for count, source in enumerate(raw) if count > 0]


def load_ipython_extension(ipython: Any) -> None:
    """Registers `%%fuselens` (called by `%load_ext fuselens`)."""
    magics = FuselensMagics(ipython)
    ipython.register_magics(magics)
    ipython.events.register("post_run_cell", magics.record_result)


def unload_ipython_extension(ipython: Any) -> None:
    """`%unload_ext fuselens`: stop tracking failed cells."""
    for callback in list(ipython.events.callbacks.get("post_run_cell", [])):
        owner = getattr(callback, "__self__", None)
        if isinstance(owner, FuselensMagics):
            ipython.events.unregister("post_run_cell", callback)
