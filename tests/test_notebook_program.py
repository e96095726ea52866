"""One set of notebook rules (`fuselens.notebook_program`) for the report's
worker, the language server and the `%%fuselens` magic: IPython syntax made
inert line for line, and every line mapped back to its cell."""

from __future__ import annotations

import subprocess
import sys
import traceback

import pytest

from fuselens import notebook_program as nbp
from fuselens.capture.program import run_target
from fuselens.capture.target import Target
from fuselens.server.program import notebook_program

# Cells a user writes, with each kind of IPython syntax; the last cell uses
# what earlier cells defined, as it would in Jupyter.
CELLS = [
    "%matplotlib inline\nimport os\nfiles = !ls\nlisting = %sx ls",
    "%%time\ntotal = 0\nfor i in range(3):\n    !echo $i\n    total += i",
    "%%bash\necho not python\nexit 1",
    "os.path?\n??os\nos.path.join??\n%timeit -n1 total\nresult = (len(files), total)",
]


@pytest.mark.parametrize(
    ("line", "inert"),
    [
        ("%matplotlib inline", "pass"),
        ("    !pip install x", "    pass"),
        ("!!ls", "pass"),
        ("files = !ls", "files = []"),
        ("a, b = !ls", "a, b = []"),
        ("    self.t = %timeit -o f()", "    self.t = None"),
        ("obj?", "pass"),
        ("obj.attr??", "pass"),
        ("?obj", "pass"),
        ("  ??obj.attr", "  pass"),
        ("x = a if b else c", "x = a if b else c"),
        ("y = a % b", "y = a % b"),
        ("# %time is a comment", "# %time is a comment"),
        ("print('what?')", "print('what?')"),
    ],
)
def test_each_ipython_line_becomes_inert_python_of_the_same_indentation(line, inert):
    assert nbp.neutralize_line(line) == inert


def test_cell_magics_blank_their_line_or_the_whole_non_python_cell():
    assert nbp.neutralize_lines(["%%bash", "echo hi", "exit 1"]) == ["", "", ""]
    assert nbp.neutralize_lines(["", "%%time", "x = 1", "!ls"]) == ["", "", "x = 1", "pass"]
    assert nbp.cell_magic("\n%%fuselens --backend eager\nf()") == "fuselens"
    assert nbp.cell_magic("%%fuselensx\nf()") == "fuselensx"
    assert nbp.cell_magic("x = 1\n%%time") is None


def test_editor_shell_capture_defines_the_name_for_later_cells(tmp_path):
    """The bug: the editor turned `x = !ls` into `pass`, so a later cell's
    `x` raised NameError only in the editor's run."""
    program = notebook_program("nb", [("c0", "x = !ls"), ("c1", "print(len(x))")])
    script = tmp_path / "joined.py"
    script.write_text(program.text)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "0"


def test_editor_help_request_is_a_no_op_line():
    """The bug: the editor left `obj?` in the program, a SyntaxError."""
    program = notebook_program("nb", [("c0", "import os\nos.path?\n??os\nx = 1")])
    assert program.text.split("\n")[1:3] == ["pass", "pass"]
    compile(program.text, "joined.py", "exec")


def test_report_worker_editor_and_magic_run_the_same_lines(tmp_path):
    path = str(tmp_path / "nb.ipynb")
    nbp.write_notebook(CELLS, path)
    worker = [cell.source for cell in nbp.load_cells(path)]
    editor = notebook_program("nb", [(f"c{i}", text) for i, text in enumerate(CELLS)])
    assert "\n".join(worker) + "\n" == editor.text
    assert worker == [nbp.neutralize_ipython(text) for text in CELLS]
    # Line counts are kept, so cell-relative lines are the same in both maps.
    assert [len(s.split("\n")) for s in worker] == [len(s.lines) for s in editor.segments]


def test_report_worker_runs_a_notebook_with_every_kind_of_ipython_line(tmp_path):
    out = tmp_path / "out.txt"
    path = str(tmp_path / "nb.ipynb")
    nbp.write_notebook(CELLS + [f"open({str(out)!r}, 'w').write(repr(result))"], path)
    run_target(Target("notebook", path, [], str(tmp_path)))
    assert out.read_text() == "(0, 3)"


def test_an_error_maps_back_to_its_cell_and_cell_relative_line_in_worker_and_editor(tmp_path):
    cells = ["files = !ls\nx = 1", "%%time\ny = 2\nobj?\nraise ValueError('boom')"]
    path = str(tmp_path / "nb.ipynb")
    nbp.write_notebook(cells, path)
    with pytest.raises(ValueError) as raised:
        run_target(Target("notebook", path, [], str(tmp_path)))
    frame = traceback.extract_tb(raised.value.__traceback__)[-1]
    assert nbp.split_cell_filename(frame.filename) == (path, 1)
    assert frame.lineno == 4 and frame.line == "raise ValueError('boom')"
    editor = notebook_program("nb", [("c0", cells[0]), ("c1", cells[1])])
    raise_line = editor.text.split("\n").index("raise ValueError('boom')")
    assert editor.to_document(raise_line) == ("c1", 3)
    assert editor.to_program("c1", 3) == raise_line


def test_magic_history_with_a_shell_capture_runs_in_the_worker(tmp_path):
    from fuselens.notebook_magic import build_cell_program, write_notebook

    out = tmp_path / "out.txt"
    history = [(1, "%load_ext fuselens"), (2, "files = !ls\nhelp_me = 1\nhelp_me?")]
    program = build_cell_program(f"open({str(out)!r}, 'w').write(str(files))", 3, history)
    path = str(tmp_path / "cell.ipynb")
    write_notebook(program, path)
    run_target(Target("notebook", path, [], str(tmp_path)))
    assert out.read_text() == "[]"


def test_magic_relabels_the_shared_cell_file_names(tmp_path):
    from fuselens.events import ErrorEntry, Report, RunInfo, SourceLocation
    from fuselens.notebook_magic import relabel_report

    nb = str(tmp_path / "cell.ipynb")
    other = nbp.cell_filename(str(tmp_path / "other.ipynb"), 0)
    report = Report(
        run=RunInfo(target=nb),
        errors=[ErrorEntry("exception", f"in {nbp.cell_filename(nb, 1)}", location=SourceLocation(other, 2, cell=0))],
    )
    relabel_report(report, nb, ["In[1]", "In[4]"])
    assert report.errors[0].message == "in In[4]"
    assert report.errors[0].location.file == other  # another notebook's cell is not this one


def test_notebook_rules_import_without_torch():
    code = "import sys, fuselens.notebook_program, fuselens.server.program; print('torch' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.stdout.strip() == "False", run.stderr
