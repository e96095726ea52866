"""What the fixes need to know about a program's source: where torch.compile
is applied, which names call compiled code, and the call sites. Pure `ast`.

Columns are code points (ast gives UTF-8 byte offsets; converted here).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Optional

from fuselens.server.positions import byte_to_codepoint
from fuselens.server.program import split_lines

SIMPLE_STATEMENTS = (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return)


@dataclass
class CompileSite:
    """One application of torch.compile."""

    function: str  # compiled function name as Dynamo reports it ("forward" for modules)
    callables: set[str] = field(default_factory=set)  # names that call it
    call: Optional[ast.Call] = None  # the torch.compile(...) call
    bare_decorator: Optional[ast.expr] = None  # `@torch.compile` without parentheses
    definition: Optional[ast.FunctionDef] = None  # the compiled function's def
    is_method: bool = False  # the def takes `self` first


class SourceIndex:
    """Parsed view of one program. `tree` is None when it does not parse."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.lines = split_lines(source)
        try:
            self.tree: Optional[ast.Module] = ast.parse(source)
        except (SyntaxError, ValueError):
            self.tree = None
        self.parents: dict[ast.AST, ast.AST] = {}
        self.torch_names: list[str] = []
        self.defs: dict[str, ast.FunctionDef] = {}
        self.classes: dict[str, ast.ClassDef] = {}
        self.names: set[str] = set()
        self.sites: list[CompileSite] = []
        if self.tree is not None:
            self._index(self.tree)

    # -- positions -------------------------------------------------------
    def line(self, lineno: int) -> str:
        """1-based line text."""
        return self.lines[lineno - 1] if 0 < lineno <= len(self.lines) else ""

    def start(self, node: ast.AST) -> tuple[int, int]:
        """(0-based line, code-point column) of a node's start."""
        return node.lineno - 1, byte_to_codepoint(self.line(node.lineno), node.col_offset)

    def end(self, node: ast.AST) -> tuple[int, int]:
        return node.end_lineno - 1, byte_to_codepoint(self.line(node.end_lineno), node.end_col_offset)

    def text(self, node: ast.AST) -> str:
        return ast.get_source_segment(self.source, node) or ""

    def indent_of(self, lineno: int) -> str:
        line = self.line(lineno)
        return line[: len(line) - len(line.lstrip())]

    def starts_line(self, node: ast.stmt) -> bool:
        """The statement is alone at the start of its first line."""
        _, col = self.start(node)
        return self.line(node.lineno)[:col].strip() == ""

    # -- queries ---------------------------------------------------------
    @property
    def torch(self) -> str:
        """The name under which the module imported torch ("torch" if not)."""
        return self.torch_names[0] if self.torch_names else "torch"

    def statement_at(self, lineno: int, kinds: tuple = (ast.stmt,)) -> Optional[ast.stmt]:
        """The innermost statement of the given kinds that starts on `lineno`."""
        best = None
        if self.tree is None:
            return None
        for node in ast.walk(self.tree):
            if isinstance(node, kinds) and node.lineno == lineno:
                if best is None or _depth(node, self.parents) > _depth(best, self.parents):
                    best = node
        return best

    def enclosing(self, node: ast.AST, kinds: tuple) -> Optional[ast.AST]:
        node = self.parents.get(node)
        while node is not None and not isinstance(node, kinds):
            node = self.parents.get(node)
        return node

    def body_of(self, stmt: ast.stmt) -> Optional[list[ast.stmt]]:
        """The statement list that holds `stmt`."""
        parent = self.parents.get(stmt)
        for name in ("body", "orelse", "finalbody", "handlers"):
            seq = getattr(parent, name, None)
            if isinstance(seq, list) and stmt in seq:
                return seq
        return None

    def site_for(self, function: str) -> Optional[CompileSite]:
        """The compile site of a function Dynamo named; the only site when the
        name does not match any (resume functions, lambdas)."""
        base = function.split(".")[-1]
        for site in self.sites:
            if site.function == base:
                return site
        for site in self.sites:  # named as the program calls it (`model`: a library module's forward)
            if base in site.callables:
                return site
        return self.sites[0] if len(self.sites) == 1 else None

    def call_sites(self, site: CompileSite) -> list[tuple[ast.Call, ast.stmt]]:
        """Calls of the compiled code that stand in a simple statement."""
        out = []
        if self.tree is None:
            return out
        for node in ast.walk(self.tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
                continue
            if node.func.id not in site.callables or node is site.call:
                continue
            stmt = self.enclosing(node, (ast.stmt,))
            if isinstance(stmt, SIMPLE_STATEMENTS) and self.starts_line(stmt) and self.body_of(stmt) is not None:
                if site.definition is not None and stmt in ast.walk(site.definition):
                    continue  # recursion inside the compiled function itself
                out.append((node, stmt))
        out.sort(key=lambda pair: pair[1].lineno)
        return out

    # -- indexing --------------------------------------------------------
    def _index(self, tree: ast.Module) -> None:
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == "torch":
                        self.torch_names.append(alias.asname or "torch")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.defs.setdefault(node.name, node)
            elif isinstance(node, ast.ClassDef):
                self.classes.setdefault(node.name, node)
            elif isinstance(node, ast.Name):
                self.names.add(node.id)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self._decorated(node)
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and self._is_compile(node.value.func):
                self._assigned(node, node.value)

    def _is_compile(self, node: ast.AST) -> bool:
        names = self.torch_names or ["torch"]
        return isinstance(node, ast.Attribute) and node.attr == "compile" and isinstance(node.value, ast.Name) and node.value.id in names

    def _decorated(self, fn: ast.FunctionDef) -> None:
        for dec in fn.decorator_list:
            is_method = isinstance(self.parents.get(fn), ast.ClassDef)
            if self._is_compile(dec):
                self.sites.append(CompileSite(fn.name, {fn.name}, None, dec, fn, is_method))
            elif isinstance(dec, ast.Call) and self._is_compile(dec.func):
                self.sites.append(CompileSite(fn.name, {fn.name}, dec, None, fn, is_method))

    def _assigned(self, assign: ast.Assign, call: ast.Call) -> None:
        callables = {t.id for t in assign.targets if isinstance(t, ast.Name)}
        if not call.args:
            return
        arg = call.args[0]
        if isinstance(arg, ast.Name) and arg.id in self.defs:
            self.sites.append(CompileSite(arg.id, callables, call, None, self.defs[arg.id]))
            return
        cls_name = self._instance_class(arg)
        if cls_name:
            forward = next(
                (n for n in self.classes[cls_name].body if isinstance(n, ast.FunctionDef) and n.name == "forward"),
                None,
            )
            self.sites.append(CompileSite("forward", callables, call, None, forward, True))
        elif isinstance(arg, (ast.Name, ast.Call, ast.Attribute)):
            # a module or function from a library (transformers, torchvision, opt.step): its
            # definition is not here, the compile call and the callers are
            name = arg.attr if isinstance(arg, ast.Attribute) else "forward"
            self.sites.append(CompileSite(name, callables, call, None, None, not isinstance(arg, ast.Attribute)))

    def _instance_class(self, arg: ast.expr) -> Optional[str]:
        """`Model()` or a name bound to `Model()` -> "Model" when defined here."""
        if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Name) and arg.func.id in self.classes:
            return arg.func.id
        if isinstance(arg, ast.Name):
            for node in ast.walk(self.tree):
                if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == arg.id for t in node.targets):
                    found = self._instance_class(node.value) if isinstance(node.value, ast.Call) else None
                    if found:
                        return found
        return None


def _depth(node: ast.AST, parents: dict) -> int:
    depth = 0
    while node in parents:
        node = parents[node]
        depth += 1
    return depth
