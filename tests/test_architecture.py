"""The package's shape, checked: no module-level import cycle, no file over 800 lines,
no function over 60 lines (issue 22). Imports inside functions and under
`TYPE_CHECKING` do not count: they run after every module has loaded."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "fuselens"
MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 60

def _modules() -> dict[str, Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def _imported_names(body: list[ast.stmt], module: str, is_package: bool) -> set[str]:
    """Every module name a statement list imports when the module loads."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = module.split(".") if is_package else module.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([node.module] if node.module else []))
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
        elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
            names |= _imported_names(node.body + node.orelse, module, is_package)
        elif isinstance(node, ast.Try):
            blocks = node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body]
            names |= _imported_names(blocks, module, is_package)
    return names


def _import_graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        deps = set()
        for imported in _imported_names(ast.parse(path.read_text()).body, name, path.name == "__init__.py"):
            while imported and imported not in mods:  # `from pkg import function`: the module pkg
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                deps.add(imported)
        graph[name] = deps
    return graph


def _cycles(graph: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: set[tuple[str, ...]] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.add(tuple(sorted(component)))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_module_level_import_cycle() -> None:
    assert _cycles(_import_graph()) == set()


def test_the_cycle_finder_sees_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {("a", "b", "c")}


def test_no_file_over_800_lines() -> None:
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := p.read_text().count("\n")) > MAX_FILE_LINES}
    assert not long


def test_no_function_over_60_lines() -> None:
    long = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
                    long.add(f"{path.relative_to(PACKAGE).as_posix()}:{node.name}")
    assert long == set()
