"""A list op's independent kernels joined in one launch (compiler/combo_kernels.py): a
compiled optimizer step over parameters of many shapes launches a few combo kernels,
each part on its own range of programs, with eager's results; kernels that depend on
each other, or update an input another reads, stay apart.

The step runs in Triton's interpreter (CI has no GPU), which executes each program's
Python; that Triton's compiler takes the combo's branches (the same names with other
types in each part) is checked by compiling the interpreted run's combo kernel for
sm_90 with the compile workers' compile-only driver, in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import sympy
import torch
from triton_worker import interpreted_worker_records

from fuselens.compiler import ir
from fuselens.compiler.combo_kernels import ComboGroup, join_list_kernels
from fuselens.compiler.kernel_group import KernelGroup
from fuselens.compiler.scheduler import Schedule


def _parameters() -> list[torch.nn.Parameter]:
    """A small transformer's and a convolutional network's parameter shapes: an embedding,
    projections, biases and norms of several widths, and 4-D convolution weights."""
    torch.manual_seed(0)
    shapes = [(503, 64), (64,), (64, 192), (192,), (64, 64), (64,), (64, 256), (256,), (256, 64),
              (32, 3, 3, 3), (32,), (64, 32, 1, 1), (7,)]
    params = [torch.nn.Parameter(torch.randn(s) * 0.1) for s in shapes]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-2
    return params


def _adamw_steps(opts: dict) -> dict:
    """Three compiled AdamW steps: kernel launches, eager's results, each combo kernel's source."""
    from fuselens import sink
    from fuselens.compiler.codegen import triton_combo as tg
    from fuselens.events import ErrorEntry, Kernel

    combos: list[dict] = []
    generate_combo = tg.generate_combo

    def keep(group, graph, options):  # noqa: ANN001, ANN202 - the generator's signature
        ks = generate_combo(group, graph, options)
        combos.append({"name": ks.name, "source": ks.source, "parts": ks.parts,
                       "dtypes": [str(d).replace("torch.", "") for d in ks.buffer_dtypes]})
        return ks

    tg.generate_combo = keep
    out = {}
    for label, combo, foreach in (("on", True, True), ("off", False, True), ("for-loop", True, False)):
        torch._dynamo.reset()
        mine, ref = _parameters(), _parameters()
        opt = torch.optim.AdamW(mine, lr=1e-2, weight_decay=0.1, foreach=foreach, capturable=True)
        ref_opt = torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.1, foreach=foreach)
        step = torch.compile(opt.step, backend="fuselens", options={**opts, "combo_kernels": combo})
        with sink.collect() as events:
            for _ in range(3):
                step()
                ref_opt.step()
        err = max(float((p - q).abs().max()) for p, q in zip(mine, ref))
        out[label] = {
            "err": err, "errors": [e.message for e in events if isinstance(e, ErrorEntry)],
            "kernels": [k.name for k in events if isinstance(k, Kernel)]}
    out["combos"] = combos
    return out


COMPILE = '''
import importlib.util, json, os, sys
from fuselens.compiler.runtime.compile_worker import use_target
use_target("cuda:90:32")  # no GPU in CI: Triton's CUDA backend and ptxas, compile only
import torch
from triton import knobs
from fuselens.compiler.runtime.triton_prelude import prelude_header, prelude_text
from fuselens.compiler.runtime.launch_config import LaunchConfig

root, combo = {root!r}, json.loads({combo!r})
knobs.cache.dir = os.path.join(root, "triton")
path = os.path.join(root, "fl_combo_mod.py")
open(path, "w").write(prelude_header(prelude_text(interpret=False)) + "\\n\\n" + combo["source"])
spec_ = importlib.util.spec_from_file_location("fl_combo_mod", path)
mod = importlib.util.module_from_spec(spec_); sys.modules["fl_combo_mod"] = mod; spec_.loader.exec_module(mod)
kw = dict(grid=(1,), **LaunchConfig(1024, 1, 4).compile_kwargs("combo"))
k = getattr(mod, combo["name"]).warmup(*[getattr(torch, d) for d in combo["dtypes"]], **kw)
ttir = k.asm["ttir"]
print("COMPILED", len(k.asm["cubin"]) > 0, ttir.count("scf.if"))
'''


def test_a_compiled_optimizer_step_over_many_shapes_launches_a_few_combo_kernels_with_eagers_results(
        tmp_path: Path) -> None:
    rec = interpreted_worker_records(__file__, tmp_path / "out.json", 900, "the combo-kernel worker")
    on, off, loop = rec["on"], rec["off"], rec["for-loop"]
    assert not on["errors"] and not off["errors"] and not loop["errors"]
    assert max(on["err"], off["err"], loop["err"]) < 1e-6, (on["err"], off["err"], loop["err"])
    # the for-loop implementation (a parameter at a time) is joined alike
    assert len(loop["kernels"]) <= 4, loop["kernels"]
    # 13 parameters of 12 shapes: a kernel per shape without combos
    assert len(off["kernels"]) >= 12, off["kernels"]
    assert len(on["kernels"]) <= 3, on["kernels"]
    combo = max(rec["combos"], key=lambda c: len(c["parts"]))
    assert len(combo["parts"]) >= 8 and 32192 in combo["parts"], combo["parts"]
    # compiled as a GPU machine compiles it: one branch per part
    r = subprocess.run([sys.executable, "-c", COMPILE.format(root=str(tmp_path), combo=json.dumps(combo))],
                       capture_output=True, text=True, timeout=600)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("COMPILED")), "")
    assert line.split()[1:2] == ["True"], r.stdout[-2000:] + r.stderr[-4000:]
    assert int(line.split()[2]) >= len(combo["parts"]), line


def _node(name: str, n: int, reads: set[str]) -> ir.ComputeNode:
    size = [sympy.Integer(n)]
    return ir.ComputeNode(name, size, ir.contiguous_strides(size), torch.float32, lambda ops, idx: None, [name],
                          ["aten.mul.Tensor"], reads=reads, list_element=True)


def _group(node: ir.ComputeNode) -> KernelGroup:
    return KernelGroup(nodes=[node], full=list(node.size), name=f"k_{node.name}", stores={node.name})


def test_kernels_that_read_what_another_writes_or_updates_in_place_are_not_joined() -> None:
    a = _node("a", 8, {"x0"})
    b = _node("b", 16, {"a"})  # reads a's output: after a's kernel
    c = _node("c", 4, {"x1"})  # independent of b: joins it
    d = _node("d", 32, {"x2"})  # updates input x2 in place (an optimizer's parameter)...
    e = _node("e", 2, {"x2"})  # ...which e reads: e must see the old value, so not in d's launch
    f = _node("f", 2, {"x3"})
    graph = ir.GraphIR(steps=[a, b, c, d, e, f], input_mutations={"d": "x2"})
    groups = [_group(n) for n in graph.steps]
    sched = Schedule(list(groups), list(groups), [], {g.nodes[0].name: g for g in groups})
    combos = join_list_kernels(graph, sched, lambda g: True, "k")
    assert [[p.name for p in c.parts] for c in combos] == [["k_b", "k_c", "k_d"], ["k_e", "k_f"]]
    assert [u.name for u in sched.units][:1] == ["k_a"] and all(isinstance(u, ComboGroup) for u in sched.units[1:])
    assert sched.group_of["c"] is combos[0] and sched.group_of["f"] is combos[1]
    # a graph without list elements keeps its kernels
    plain = ir.GraphIR(steps=[ir.ComputeNode("p", [sympy.Integer(4)], [sympy.Integer(1)], torch.float32,
                                             lambda ops, idx: None, ["p"], ["aten.mul.Tensor"], reads={"x"})])
    g = _group(plain.steps[0])
    assert join_list_kernels(plain, Schedule([g], [g], [], {"p": g}), lambda g: True, "k") == []


if __name__ == "__main__":  # pragma: no cover - the worker, under TRITON_INTERPRET=1
    from triton_worker import worker_main

    worker_main(_adamw_steps, "fl_combo_")
