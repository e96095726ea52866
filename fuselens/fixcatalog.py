"""The fix catalogue: for each cause of a graph break or a recompile, the
fixes that work, best first. Pure, no torch: the worker fills
`Recompile.fixes` / `GraphBreak.fixes` from it, the report verifies the ones
with an edit (fuselens/report/verify.py) and the language server turns the
same entries into quick-fixes (fuselens/server/fixes.py).

One entry per cause; a fix that cannot work for a cause is not listed for it
(`dynamic=True` does not help a bytes value; `mark_dynamic` cannot name a
value computed inside the compiled function).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Optional

from fuselens.events import ORIGIN_OPTIMIZER_STEP, FixAdvice, GraphBreak

if TYPE_CHECKING:
    from fuselens.capture.backend_failure import BackendFailure


def _dynamic_true(cause: str = "input-size") -> FixAdvice:
    """A new object each time: the report marks fixes verified in place."""
    why = ("Python ints become symbols instead of constants" if cause == "python-scalar"
           else "every size is compiled as a symbol, so new sizes reuse the compiled code")
    return FixAdvice(cause, "compile with dynamic=True", why, edit="dynamic_true")


def _mark_dynamic(name: str, dim: int) -> FixAdvice:
    return FixAdvice(
        "input-size", f"mark {name} dynamic at dim {dim} before the call: torch._dynamo.mark_dynamic({name}, {dim})",
        "compiles that dimension as a symbol from the first call; fails with ConstraintViolationError if "
        "the code needs a fixed size there", edit="mark_dynamic", args=[name, str(dim)],
    )


def _config(name: str, value: str, cause: str, why: str) -> FixAdvice:
    return FixAdvice(cause, f"set torch._dynamo.config.{name} = {value}", why, edit="config",
                     args=[f"torch._dynamo.config.{name}", value])


_GRAD_MODE_WHY = ("training and inference calls are separate compiles: a training loop's first evaluation under "
                  "torch.no_grad() recompiles once, as expected, and both stay compiled")


def _optimizer_hyperparameter(name: str) -> Optional[FixAdvice]:
    """The fix for a guard on an optimizer's hyperparameter (`self.param_groups[0].lr`, which an
    LR schedule changes every step), None for another name. The optimizer's own code reads it,
    so nothing can be passed at a call site; a tensor set once is updated in place by the
    scheduler and read as an input."""
    m = re.fullmatch(r"self\.param_groups\[\d+\](?:\.|\[')(\w+)'?\]?", name)
    if m is None:
        return None
    h = m.group(1)
    return FixAdvice("optimizer-hyperparameter", f"create the optimizer with a tensor {h}: e.g. "
                     f"torch.optim.AdamW(params, {h}=torch.tensor(1e-3))",
                     f"a Python float {h} is baked into the compiled step, and each new value (an LR "
                     "scheduler's) compiles it again; a tensor is read as an input (PyTorch's 'Running "
                     "the compiled optimizer with an LR scheduler' recipe)")


def recompile_fixes(kind: str, name: str, dim: Optional[int], *, intermediate: bool = False,
                    input_name: str = "", value: str = "") -> list[FixAdvice]:
    """Fixes for one failed guard. `kind` is tracetext.GuardFailure.kind;
    `intermediate` says `name` was computed inside the compiled function
    (a value carried over a graph break), `input_name` the input it comes
    from when known, `value` the value the code was specialized to."""
    if kind == "size" and intermediate and not input_name and name.startswith("the intermediate"):
        return [FixAdvice(
            "intermediate-size", "remove the graph break before it, or compile with dynamic=True",
            "a value computed before the graph break changed size (often a data-dependent size such as "
            "nonzero's); without the break it never leaves the graph", edit="")] + [_dynamic_true("intermediate-size")]
    if kind == "size" and intermediate:
        root = f" (it comes from the input {input_name})" if input_name else ""
        fixes = [FixAdvice(
            "intermediate-size", f"make the input's size dynamic, not {name}'s{root}",
            f"{name} is computed inside the compiled function, so it cannot be marked; its size follows the "
            "input's, and compiling with dynamic sizes covers both pieces around the graph break",
        )]
        if input_name and dim is not None:
            fixes.append(_mark_dynamic(input_name, dim))
        return fixes + [_dynamic_true()]
    if kind == "size" and name and dim is not None:
        return [_mark_dynamic(name, dim), _dynamic_true()]
    if kind == "size":
        return [_dynamic_true()]
    if kind == "dtype":
        return [FixAdvice("dtype", f"convert {name} to one dtype before the call (e.g. {name}.float())",
                          "each dtype is a separate compile; converting at the call site keeps one")]
    if kind == "rank":
        return [FixAdvice("rank", f"keep the number of dims of {name} fixed (reshape before the call)",
                          "each rank is a separate compile")]
    if kind == "value" and (hyper := _optimizer_hyperparameter(name)) is not None:
        return [hyper]
    if kind == "value" and value in ("True", "False"):
        # torch.tensor(flag) would not be read where the flag is (often a library's object:
        # transformers' cache layers' is_initialized), and dynamic=True leaves bools constant
        return [FixAdvice(
            "bool-flag", f"nothing to change if {name} only switches between True and False",
            "Dynamo compiles once for each value of a Python bool and keeps both; dynamic=True does not "
            "change that. It costs more only if the flag flips on every call, or each call compiles a new "
            "object's flag (a graph break that makes a frame compile apart is the usual cause: remove it)")]
    if kind == "value":
        return [FixAdvice("python-scalar", f"pass {name} as a tensor (torch.tensor({name}))",
                          "a Python number is baked into the code: each new value compiles again; a tensor "
                          "value is an input instead"), _dynamic_true("python-scalar")]
    if kind == "object_value":
        return [FixAdvice(
            "python-object", f"compute what the compiled code needs from {name} outside it, and pass that",
            f"Dynamo specializes on the value of {name} (bytes, str, tuples...): every new value compiles again, "
            "and dynamic=True does not change that. Pass e.g. len(...) or a tensor "
            "(torch.frombuffer(bytearray(b), dtype=torch.uint8)) instead")]
    if kind == "global_value":
        return [FixAdvice(
            "global-mutated", f"update {name} outside the compiled function (after the call), or keep it in a tensor",
            f"the compiled code reads {name} and bakes its value in; changing it (here, inside the compiled code) "
            "forces a new compile on every call until the recompile limit")]
    if kind == "stack_value":
        return [_config("capture_scalar_outputs", "True", "item-specialized",
                        "keeps the number read from the tensor inside the graph instead of baking it in")]
    return _state_fixes(kind, name)


def _state_fixes(kind: str, name: str) -> list[FixAdvice]:
    """Fixes for a guard on the program's state: autocast, grad mode, an attribute set later."""
    if kind == "autocast":
        return [FixAdvice(
            "autocast", "call the compiled function under one autocast setting, or enter torch.autocast inside it",
            "autocast on and off are two compiles of the same function; both are correct, the second costs "
            "compile time once")]
    if kind == "none_check":
        return [FixAdvice(
            "set-after-compile", f"give {name} its value before the first call, or let it recompile once",
            f"the compiled code read {name} before it was set; whatever set it afterwards, often the model itself "
            "on its first call (transformers' classification heads set config.problem_type), makes the next "
            "call compile again, once")]
    if kind == "grad_mode":
        return [FixAdvice("grad-mode", "call the compiled function under one grad mode (no_grad or not)",
                          _GRAD_MODE_WHY)]
    return []




_LOGGER_METHOD = re.compile(r"method: <Logger [^>]*>\.(\w+)")


def graph_break_fixes(gb: GraphBreak, debug_context: str = "") -> tuple[str, list[FixAdvice]]:
    """(an explanation in the user's terms, or "" when torch's is right; the
    fixes) for one graph break; `debug_context` is Dynamo's developer debug context."""
    text = f"{gb.reason} {gb.gb_type} {gb.explanation}".lower()
    code = (gb.location.code or "").replace(" ", "")
    logger = _LOGGER_METHOD.search(debug_context) if "logging.logger method" in text else None
    if logger is not None:
        # a logger call in traced code, often a library's (transformers' warning_once in a model's
        # forward): the break is at the user's line that called into it, where nothing can be edited
        m = logger.group(1)
        return (f"a logging call (logging.Logger.{m}) inside the compiled code", [FixAdvice(
            "logging-call", f"let Dynamo skip logging.Logger.{m} in compiled code: "
            f"torch._dynamo.config.ignore_logging_functions.add(logging.Logger.{m})",
            "the call is left out of the compiled graph instead of ending it; its message is not "
            "printed from compiled code", edit="ignore_logging", args=[m])])
    if gb.origin == ORIGIN_OPTIMIZER_STEP:
        # by design (capture/break_origin.py): no edit removes it, so no fix. "Compile the step
        # separately" was offered here, and a step compiled alone, as PyTorch's recipe does it,
        # breaks the same way
        if "marked as skipped" in text:
            return ("opt.step() as an LR scheduler wraps it: Dynamo does not trace the scheduler's wrapper, "
                    "and compiles the optimizer's step inside it as its own graph (by design, nothing to fix)", [])
        return ("torch's optimizers break the graph around their step on purpose, so that the update compiles "
                "as a graph without gradients (by design, nothing to fix; not a graph_break() you wrote)", [])
    if ".zero_grad(" in code and ("skipped" in text or "graph_break" in text):
        return ("optimizer.zero_grad() inside a compiled function is run by Python between graphs",
                [FixAdvice("optimizer-step", "call opt.zero_grad() outside the compiled function", "")])
    if "backward()" in text or ".backward(" in code:
        return ("loss.backward() cannot be traced into the graph by default",
                [FixAdvice("backward", "compile the forward and loss, and call loss.backward() outside",
                           "AOTAutograd then compiles the backward for you")])
    if "dynamic shape operator" in text or "nonzero" in code or "dynamic_output_shape" in text:
        return ("", [_config("capture_dynamic_output_shape_ops", "True", "data-dependent-shape",
                             "ops whose output size depends on the data (nonzero, unique, masked_select) stay "
                             "in the graph with a symbolic size")])
    if "item()" in text or "_local_scalar_dense" in text or "tolist" in code:
        explained = "reading a tensor's value into Python (.item(), .tolist()) ends the graph" if (
            "_local_scalar_dense" in text or "tolist" in code) else ""
        return (explained, [_config("capture_scalar_outputs", "True", "item",
                                    "keeps the scalar read inside the graph as a symbolic value")])
    return ("", [])


def _short(path: str) -> str:
    """An installed library's file from its package down (transformers/integrations/moe.py),
    the user's by its name."""
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.rsplit(marker, 1)[1]
    return path.replace("\\", "/").rsplit("/", 1)[-1]


def backend_failure_fixes(backend: str, failure: Optional["BackendFailure"]) -> tuple[str, list[FixAdvice]]:
    """(the explanation, the fixes) of a graph break Dynamo made because the backend raised
    (GB0219). `failure` is what the backend's traceback showed, None when torch logged none.
    Dynamo's own hint ("report an issue to the backend compiler repo") is wrong when the
    cause is the program's: a custom op whose registered backward reads a tensor's value
    cannot be traced by any backend that compiles the backward (Inductor, aot_eager)."""
    if failure is None:
        return (f"the {backend or 'backend'} compiler raised while compiling this graph; Dynamo broke the "
                "graph at the failing code, in this frame and every frame around it, and ran the rest of "
                "them eagerly", [])
    where = f"{_short(failure.site.file)}:{failure.site.line} ({failure.site.function})" if failure.site else "its code"
    if not failure.custom_op_backward:
        return (f"the {backend or 'backend'} compiler raised {failure.exception} at {where} while compiling "
                "this graph; Dynamo broke the graph there, in this frame and every frame around it, and ran "
                "the rest of them eagerly", [])
    explained = (f"the {backend or 'backend'} compiler could not trace the backward of a custom op: its registered "
                 f"backward, {where}, reads a tensor's value in Python ({failure.exception}). Dynamo broke "
                 "the graph at the op, in this frame and every frame around it, and ran the rest of them eagerly")
    fixes = [FixAdvice(
        "custom-op-backward", "register the loop that reads the tensor as a custom op of its own "
        "(torch.library.custom_op) and call that op from the backward",
        "the backward then traces as one opaque call and the graph stays whole (transformers 5.24 did this for "
        "its grouped-matmul fallback)")]
    if backend != "fuselens":
        fixes.insert(0, FixAdvice(
            "custom-op-backward", 'compile with backend="fuselens"',
            "fuselens compiles the graph around a custom op whose backward cannot be traced: the op runs "
            "as in eager, between the compiled parts, and Dynamo keeps one graph", edit="backend", args=["fuselens"]))
    return explained, fixes
