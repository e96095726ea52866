"""Quick-fix edit builders. Pure: (program source, finding's event) -> fixes.

Every fix is applied to the source and re-parsed with `ast` before it is
offered (`checked`); an edit that would not parse is never shown. Positions
are program lines (0-based) and code-point columns; the server maps them to
documents and the client's encoding.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from fuselens.events import FusionDecision, GraphBreak, Recompile
from fuselens.server.diagnostics import FindingEvent, is_data_dependent
from fuselens.server.source_index import CompileSite, SourceIndex

LOGGING_METHODS = {"debug", "info", "warning", "warn", "error", "exception", "critical", "log"}
_CONFIG_IN_HINT = re.compile(r"(torch\._dynamo\.config\.\w+)\s*=\s*(True|False|-?\d+)")
_OPTION = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*=\s*(.+?)\s*$")


@dataclass
class Edit:
    line: int
    col: int
    end_line: int
    end_col: int
    text: str


@dataclass
class Fix:
    title: str
    edits: list[Edit] = field(default_factory=list)
    preferred: bool = False


def apply_edits(source: str, edits: list[Edit]) -> str:
    """Apply non-overlapping edits given in original coordinates."""
    starts = [0]
    for match in re.finditer(r"\r\n|\r|\n", source):
        starts.append(match.end())

    def offset(line: int, col: int) -> int:
        if line >= len(starts):
            return len(source)
        return min(starts[line] + col, len(source))

    out = source
    for edit in sorted(edits, key=lambda e: (e.line, e.col), reverse=True):
        a, b = offset(edit.line, edit.col), offset(edit.end_line, edit.end_col)
        out = out[:a] + edit.text + out[b:]
    return out


def checked(source: str, fix: Optional[Fix]) -> Optional[Fix]:
    """The fix if the result parses (and changes something), else None."""
    if fix is None or not fix.edits:
        return None
    result = apply_edits(source, fix.edits)
    if result == source:
        return None
    try:
        ast.parse(result)
    except (SyntaxError, ValueError):
        return None
    return fix


def fixes_for(source: str, event: FindingEvent, line: int) -> list[Fix]:
    """All checked fixes for the finding of `event` (a `Finding.event`) at
    program line `line` (0-based); none for the kinds of event no edit fixes."""
    index = SourceIndex(source)
    if index.tree is None:
        return []
    candidates: list[Optional[Fix]] = []
    if isinstance(event, Recompile):
        candidates += recompile_fixes(index, event)
    elif isinstance(event, GraphBreak):
        candidates += graph_break_fixes(index, event, line)
    elif isinstance(event, FusionDecision) and event.decision == "not_fused" and event.option:
        function = event.locations[0].function if event.locations else ""
        candidates.append(option_fix(index, event.option, function))
    out, titles = [], set()
    for fix in candidates:
        fix = checked(source, fix)
        if fix is not None and fix.title not in titles:
            titles.add(fix.title)
            out.append(fix)
    return out


# ---- recompiles -------------------------------------------------------------


def recompile_fixes(index: SourceIndex, rc: Recompile) -> list[Optional[Fix]]:
    site = index.site_for(rc.function)
    if site is None:
        return []
    changes = [(c.input_name, c.dim) for c in rc.shape_changes if isinstance(c.dim, int)]
    marks: list[Optional[Fix]] = []
    for name, dim in changes:
        for call, stmt in index.call_sites(site)[:3]:
            marks.append(mark_dynamic_fix(index, site, call, stmt, name, dim))
    marks = [m for m in marks if m is not None]
    # Preferred only when `fuselens report` verified the same catalogue fix
    # (fuselens/fixcatalog.py, report/verify.py): a mark_dynamic that looks
    # right can crash with ConstraintViolationError.
    verified = {f.edit for f in rc.fixes if f.preferred}
    # dynamic=True where the catalogue lists it, or where no catalogue fix came with the recompile
    # (a report from before the catalogue): it cannot help a bool, a bytes value or a global, and
    # a quick-fix that changes nothing is a wrong fix
    listed = not rc.fixes or any(f.edit == "dynamic_true" for f in rc.fixes)
    dynamic = [dynamic_true_fix(index, site)] if listed else []
    for fix in marks + dynamic:
        if fix is not None and (("mark_dynamic" in fix.title and "mark_dynamic" in verified)
                                or ("dynamic=True" in fix.title and "dynamic_true" in verified)):
            fix.preferred = True
            break
    return marks + dynamic


def _argument(site: CompileSite, call: ast.Call, name: str) -> Optional[ast.expr]:
    """The expression passed for parameter `name` at this call, or the caller's own variable
    `name` passed to it (the capture names an input as the call passes it: `ids` for
    `model(input_ids=ids)`)."""
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    passed = [a for a in [*call.args, *(kw.value for kw in call.keywords)] if isinstance(a, ast.Name) and a.id == name]
    if len(passed) == 1:
        return passed[0]
    if site.definition is None:
        return None
    params = [a.arg for a in site.definition.args.posonlyargs + site.definition.args.args]
    if site.is_method and params:
        params = params[1:]
    if name not in params:
        return None
    pos = params.index(name)
    if any(isinstance(a, ast.Starred) for a in call.args[: pos + 1]) or pos >= len(call.args):
        return None
    return call.args[pos]


def mark_dynamic_fix(index: SourceIndex, site: CompileSite, call: ast.Call, stmt: ast.stmt, name: str, dim: int) -> Optional[Fix]:
    """`torch._dynamo.mark_dynamic(arg, dim)` on the line before the call."""
    if "." in name or "[" in name:
        return None  # attributes (self.weight) are not call arguments
    arg = _argument(site, call, name)
    if arg is None or arg.lineno != arg.end_lineno:
        return None
    indent = index.indent_of(stmt.lineno)
    torch = index.torch
    at = stmt.lineno - 1
    edits = _import_torch(index)
    if isinstance(arg, ast.Name):
        text = f"{indent}{torch}._dynamo.mark_dynamic({arg.id}, {dim})\n"
        edits.append(Edit(at, 0, at, 0, text))
        shown = arg.id
    else:
        var = _fresh(index, f"{name}_dyn")
        text = f"{indent}{var} = {index.text(arg)}\n{indent}{torch}._dynamo.mark_dynamic({var}, {dim})\n"
        (l0, c0), (l1, c1) = index.start(arg), index.end(arg)
        edits += [Edit(at, 0, at, 0, text), Edit(l0, c0, l1, c1, var)]
        shown = var
    return Fix(f"Mark {shown} dynamic (dim {dim}) before the call on line {stmt.lineno}: torch._dynamo.mark_dynamic", edits)


def dynamic_true_fix(index: SourceIndex, site: CompileSite) -> Optional[Fix]:
    """`dynamic=True` on the torch.compile call (all sizes dynamic)."""
    return _compile_keyword_fix(index, site, "dynamic", True)


def backend_fix(index: SourceIndex, site: CompileSite, backend: str) -> Optional[Fix]:
    """`backend=...` on the torch.compile call, replacing the one it names."""
    return _compile_keyword_fix(index, site, "backend", backend)


def _compile_keyword_fix(index: SourceIndex, site: CompileSite, name: str, value: Any) -> Optional[Fix]:
    """`name=value` on the torch.compile call: added, or replacing the value it has; None
    where it has that value already (of that type: `dynamic=1` is not `dynamic=True`)."""
    text = f'"{value}"' if isinstance(value, str) else repr(value)
    title = f"Compile {site.function} with {name}={text}"
    if site.bare_decorator is not None:
        (l0, c0), (l1, c1) = index.start(site.bare_decorator), index.end(site.bare_decorator)
        return Fix(title, [Edit(l0, c0, l1, c1, f"{index.text(site.bare_decorator)}({name}={text})")])
    call = site.call
    if call is None:
        return None
    for kw in call.keywords:
        if kw.arg == name:
            if isinstance(kw.value, ast.Constant) and type(kw.value.value) is type(value) and kw.value.value == value:
                return None
            (l0, c0), (l1, c1) = index.start(kw.value), index.end(kw.value)
            return Fix(title, [Edit(l0, c0, l1, c1, text)])
    return Fix(title, [_add_keyword(index, call, f"{name}={text}")])


def _add_keyword(index: SourceIndex, call: ast.Call, text: str) -> Edit:
    items = list(call.args) + list(call.keywords)
    if items:
        line, col = index.end(max(items, key=lambda n: (n.end_lineno, n.end_col_offset)))
        return Edit(line, col, line, col, f", {text}")
    line, col = index.end(call)
    return Edit(line, col - 1, line, col - 1, text)  # just inside the ")"


# ---- graph breaks ------------------------------------------------------------


def graph_break_fixes(index: SourceIndex, gb: GraphBreak, line: int) -> list[Optional[Fix]]:
    text = " ".join([gb.reason, gb.gb_type])
    hints = "".join(gb.hints)
    out: list[Optional[Fix]] = []
    if "item()" in text or "capture_scalar_outputs" in hints:
        out.append(config_fix(index, "torch._dynamo.config.capture_scalar_outputs", "True"))
    logging_call = _logging_call(index, line + 1)
    if logging_call is not None:
        out.append(remove_statement_fix(index, logging_call))
        if _is_print(logging_call):
            out.append(reorder_print_fix(index))
    if is_data_dependent(gb):
        out.append(cond_fix(index, line + 1))
    for name, value in _CONFIG_IN_HINT.findall(hints.replace("`", "")):
        out.append(config_fix(index, name, value))
    out += [ignore_logging_fix(index, f.args[0]) for f in gb.fixes if f.edit == "ignore_logging" and f.args]
    site = index.site_for(gb.location.function)
    if site is not None:
        for f in (f for f in gb.fixes if f.edit == "backend" and f.args):
            fix = backend_fix(index, site, f.args[0])
            if fix is not None:
                fix.preferred = f.preferred  # `fuselens report` applied it to a copy and re-ran it
            out.append(fix)
    return out


def ignore_logging_fix(index: SourceIndex, method: str) -> Optional[Fix]:
    """`torch._dynamo.config.ignore_logging_functions.add(logging.Logger.M)` after the program's
    last top-level import: a library may add M to Logger (transformers' warning_once), so it must
    be imported first."""
    statement = f"{index.torch}._dynamo.config.ignore_logging_functions.add(logging.Logger.{method})"
    if f"ignore_logging_functions.add(logging.Logger.{method})" in index.source or not method.isidentifier():
        return None
    imports = [n for n in index.tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    if not any(isinstance(n, ast.Import) and any(a.name == "logging" and a.asname is None for a in n.names)
               for n in imports):
        statement = f"import logging\n{statement}"
    at = max((n.end_lineno for n in imports), default=_import_line(index.tree))
    return Fix(f"Let Dynamo skip logging.Logger.{method} in compiled code (ignore_logging_functions)",
               _import_torch(index) + [Edit(at, 0, at, 0, f"{statement}\n")])


def config_fix(index: SourceIndex, name: str, value: str) -> Optional[Fix]:
    """Insert `torch._dynamo.config.X = V` after `import torch`."""
    short = name.split(".", 1)[1]
    statement = f"{index.torch}.{short} = {value}"
    if re.search(rf"{re.escape(short)}\s*=\s*{re.escape(value)}", index.source):
        return None  # already set
    return Fix(f"Set {name} = {value}", _after_torch_import(index, statement))


def reorder_print_fix(index: SourceIndex) -> Optional[Fix]:
    statement = f"{index.torch}._dynamo.config.reorderable_logging_functions.add(print)"
    if "reorderable_logging_functions.add(print)" in index.source:
        return None
    return Fix(
        "Move print out of the compiled graph (Dynamo runs it after the graph: reorderable_logging_functions)",
        _after_torch_import(index, statement),
    )


def _after_torch_import(index: SourceIndex, statement: str) -> list[Edit]:
    tree = index.tree
    for node in tree.body:
        if isinstance(node, ast.Import) and any(a.name == "torch" for a in node.names):
            at = node.end_lineno
            return [Edit(at, 0, at, 0, f"{statement}\n")]
    at = _import_line(tree)
    return [Edit(at, 0, at, 0, f"import torch\n{statement}\n")]


def _import_line(tree: ast.Module) -> int:
    """0-based line where a new top-level import may go: after the module
    docstring and `from __future__` imports."""
    at = 0
    for i, node in enumerate(tree.body):
        is_doc = i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        is_future = isinstance(node, ast.ImportFrom) and node.module == "__future__"
        if is_doc or is_future:
            at = node.end_lineno
        else:
            break
    return at


def _import_torch(index: SourceIndex) -> list[Edit]:
    if index.torch_names:
        return []
    at = _import_line(index.tree)
    return [Edit(at, 0, at, 0, "import torch\n")]


def _logging_call(index: SourceIndex, lineno: int) -> Optional[ast.Expr]:
    stmt = index.statement_at(lineno, (ast.Expr,))
    if stmt is None or not isinstance(stmt.value, ast.Call) or not index.starts_line(stmt):
        return None
    func = stmt.value.func
    if _is_print(stmt):
        return stmt
    if isinstance(func, ast.Attribute) and func.attr in LOGGING_METHODS and isinstance(func.value, ast.Name):
        if func.value.id in ("logging", "logger", "log", "LOGGER", "_logger"):
            return stmt
    return None


def _is_print(stmt: ast.Expr) -> bool:
    return isinstance(stmt.value.func, ast.Name) and stmt.value.func.id == "print"


def remove_statement_fix(index: SourceIndex, stmt: ast.stmt) -> Optional[Fix]:
    end_text = index.line(stmt.end_lineno)[index.end(stmt)[1] :].strip()
    if end_text and not end_text.startswith("#"):
        return None  # something else follows on the line (`print(x); y = 1`)
    body = index.body_of(stmt)
    first, last = stmt.lineno - 1, stmt.end_lineno
    name = "print" if _is_print(stmt) else "logging call"
    if body is not None and len(body) == 1:
        return Fix(f"Remove the {name} from the compiled code", [Edit(first, 0, last, 0, f"{index.indent_of(stmt.lineno)}pass\n")])
    return Fix(f"Remove the {name} from the compiled code", [Edit(first, 0, last, 0, "")])


def cond_fix(index: SourceIndex, lineno: int) -> Optional[Fix]:
    """`if pred: return a else: return b` -> torch.cond, only when mechanical:
    the `if` is the function's last decision, each branch is one `return`,
    and the branches read only the function's parameters."""
    stmt = index.statement_at(lineno, (ast.If,))
    func = index.enclosing(stmt, (ast.FunctionDef,)) if stmt is not None else None
    if stmt is None or func is None or len(stmt.body) != 1 or not isinstance(stmt.body[0], ast.Return):
        return None
    body = index.body_of(stmt)
    true_expr = stmt.body[0].value
    if len(stmt.orelse) == 1 and isinstance(stmt.orelse[0], ast.Return):
        false_expr, last = stmt.orelse[0].value, stmt
    elif not stmt.orelse and body is func.body and body.index(stmt) == len(body) - 2 and isinstance(body[-1], ast.Return):
        false_expr, last = body[-1].value, body[-1]
    else:
        return None
    if true_expr is None or false_expr is None or not index.starts_line(stmt):
        return None
    params = [a.arg for a in func.args.posonlyargs + func.args.args]
    local = {n.id for n in ast.walk(func) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    used = {n.id for e in (true_expr, false_expr) for n in ast.walk(e) if isinstance(n, ast.Name)}
    if used & (local - set(params)):
        return None  # a branch reads a local computed earlier: not mechanical
    operands = [p for p in params if p in used]
    torch = index.torch
    indent = index.indent_of(stmt.lineno)
    inner = indent + "    "
    sig = ", ".join(operands)
    true_name, false_name = _fresh(index, f"{func.name}_true"), _fresh(index, f"{func.name}_false")
    ops_tuple = f"({sig},)" if len(operands) == 1 else f"({sig})"
    text = (
        f"{indent}def {true_name}({sig}):\n{inner}return {index.text(true_expr)}\n"
        f"{indent}def {false_name}({sig}):\n{inner}return {index.text(false_expr)}\n"
        f"{indent}return {torch}.cond({index.text(stmt.test)}, {true_name}, {false_name}, {ops_tuple})\n"
    )
    return Fix("Rewrite the data-dependent branch with torch.cond", [Edit(stmt.lineno - 1, 0, last.end_lineno, 0, text)])


# ---- fusion -----------------------------------------------------------------------


def option_fix(index: SourceIndex, option: str, function: str) -> Optional[Fix]:
    """Apply a compiler option named by the scheduler: `name=value` goes into
    `options={...}` of the torch.compile call; `torch._...config.x = v` is
    set after `import torch`."""
    match = _OPTION.match(option)
    if match is None:
        return None
    name, value = match.groups()
    if name.startswith("torch."):
        return config_fix(index, name, value)
    site = index.site_for(function)
    if site is None or site.call is None:
        return None
    try:
        literal = repr(ast.literal_eval(value))
    except (ValueError, SyntaxError):
        literal = repr(value)
    title = f"Set compiler option {name}={literal} on torch.compile"
    for kw in site.call.keywords:
        if kw.arg == "options":
            if not isinstance(kw.value, ast.Dict):
                return None
            line, col = index.start(kw.value)
            sep = ", " if kw.value.keys else ""
            return Fix(title, [Edit(line, col + 1, line, col + 1, f"{name!r}: {literal}{sep}")])
    return Fix(title, [_add_keyword(index, site.call, f"options={{{name!r}: {literal}}}")])


def _fresh(index: SourceIndex, base: str) -> str:
    name, n = base, 1
    while name in index.names or name in index.defs:
        n += 1
        name = f"{base}{n}"
    return name
