"""Name things the way the user's call site does. Pure, no torch.

When the compiled code is a library's (an `nn.Module` wrapper in torch,
`transformers`' `wrapper(*args, **kwargs)`), Dynamo names inputs
`args[0]` or `kwargs['input_ids']` and the function `wrapper`. The user
wrote `compiled(input_ids)`: read that line and use its words.
"""

from __future__ import annotations

import ast
import builtins
import re
from dataclasses import dataclass, field
from typing import Optional

_ARGS_RE = re.compile(r"^args\[(\d+)\]$")
_KWARGS_RE = re.compile(r"""^kwargs\[['"](\w+)['"]\]$""")


@dataclass
class CallText:
    callee: str  # `compiled`, `self.model`
    positional: list[str] = field(default_factory=list)
    keywords: dict[str, str] = field(default_factory=dict)


def parse_call(code: str) -> Optional[CallText]:
    """The outermost call on a one-line statement (`y = model(x, n=3).logits`) that is not a
    Python builtin's (`print(float(model(x).loss))` is `model`'s call)."""
    try:
        tree = ast.parse(code.strip())
    except SyntaxError:
        return None
    for node in ast.walk(tree):  # breadth first: the outermost call comes first
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and hasattr(builtins, node.func.id):
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
            if any(isinstance(a, ast.Starred) for a in node.args):
                return None
            return CallText(
                ast.unparse(node.func),
                [ast.unparse(a) for a in node.args],
                {k.arg: ast.unparse(k.value) for k in node.keywords if k.arg},
            )
    return None


def user_argument(name: str, call: Optional[CallText]) -> Optional[str]:
    """`args[0]` -> the first argument the user passed, `kwargs['ids']` -> the
    keyword's expression; None when the call does not say."""
    if call is None:
        return None
    m = _ARGS_RE.match(name)
    if m:
        i = int(m.group(1))
        return call.positional[i] if i < len(call.positional) else None
    m = _KWARGS_RE.match(name)
    if m:
        return call.keywords.get(m.group(1))
    return None
