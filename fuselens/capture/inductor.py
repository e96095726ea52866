"""Inductor's kernels as `Kernel` events (worker side).

Per compile, Inductor writes to the structured trace (in this order):
`inductor_post_grad_graph` (the graph it lowers; node -> ATen target),
`inductor_output_code` (the generated module: kernel sources),
`inductor_provenance_tracking_node_mappings` (kernel -> post-grad nodes ->
Dynamo nodes) and `inductor_provenance_tracking_kernel_stack_traces`
(kernel -> user stack traces); a training graph repeats this for the
backward. All are read from the trace, nothing from stderr. Provenance
needs `torch._inductor.config.trace.provenance_tracking_level` (the worker
turns it on); without it kernels still come from the output code, with ops
from the kernel name and no user lines.

Kernels of the k-th Inductor output of compile `c` get graph_id `c:dynamo`
for k = 0 and `c:dynamo#k` after (the backward of a training graph is #1).

Kernel timing (`time_kernels`): profiler events are matched to one graph's
kernel by the kernel's profile name (`graph_N_<kernel>`, from its source) or
by the `graph_N_inductor_wrapper_call` range around them, so a recompiled
graph whose kernels have the same names is timed on its own. What Inductor does
inside its `dynamo_timed` ranges (compiling, autotuning: benchmark launches of a
kernel) is not a call of the program and is left out. The times go to one
`KernelTimer` per Inductor graph (fuselens/kernel_timing.py), which the run
collects from like the fuselens backend's. Fusion decisions come from
`inductor_fusion` once a graph's kernels are known.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

from fuselens.capture import frames as fr
from fuselens.capture.inductor_fusion import fusion_decisions
from fuselens.events import Kernel, SourceLocation
from fuselens.kernel_timing import KernelTimer

Emit = Callable[[Any], None]

_DEF_RE = re.compile(
    r"^(?P<name>\w+) = async_compile\.(?P<how>cpp_pybinding|cpp|triton)\((?P<head>.*?)(?P<q>r?''')", re.M
)
_POST_NODE_RE = re.compile(r"^\s*(?P<name>\w+)(?::\s*\"[^\"]*\")?\s*=\s*torch\.ops\.(?P<target>[\w.]+)\(", re.M)
_NAME_OPS_RE = re.compile(r"^(?:cpp|triton)_(?:[a-z]+_)?fused_(?P<ops>.+?)_\d+$")
# With `cpp.enable_kernel_profile` a cpp kernel records itself under this name
# (`graph_3_cpp_fused_add_0`: Inductor's graph counter makes it unique per graph).
_PROFILE_NAME_RE = re.compile(r'RAIIAtenRecordFunctionHandle\s+\w+\("(?P<name>[^"]+)"')
# With `profiler_mark_wrapper_call` the whole call of one Inductor graph is a
# profiler range of this name: every kernel and library call inside it
# belongs to that graph (the only way to tell graphs apart for externs).
_WRAPPER_RE = re.compile(r"graph_\d+_inductor_wrapper_call")


@dataclass
class _Segment:
    code: str = ""
    post_targets: dict[str, str] = field(default_factory=dict)
    code_to_post: dict[str, list[str]] = field(default_factory=dict)
    post_to_pre: dict[str, list[str]] = field(default_factory=dict)
    stack_traces: dict[str, list[str]] = field(default_factory=dict)
    refusals: list[Any] = field(default_factory=list)  # inductor_fusion.Refusal, scheduled before this code


def kernel_sources(code: str) -> dict[str, tuple[str, str]]:
    """name -> (kind, source) for every kernel defined in an output module."""
    out: dict[str, tuple[str, str]] = {}
    for m in _DEF_RE.finditer(code):
        start = m.end()
        end = code.find("'''", start)
        if end < 0:
            continue
        kind = "triton" if m.group("how") == "triton" else "cpp"
        out[m.group("name")] = (kind, code[start:end].strip("\n"))
    return out


def ops_from_name(name: str) -> list[str]:
    """`cpp_fused_add_cos_pow_sin_0` -> ["add", "cos", "pow", "sin"] (Inductor
    joins op names with `_`, so multi-word ops split; a fallback only)."""
    m = _NAME_OPS_RE.match(name)
    return [p for p in m.group("ops").split("_") if p] if m else []


class InductorKernels:
    def __init__(self, emit: Emit, capture: Any) -> None:
        self._emit = emit
        self._capture = capture
        self._segments: dict[str, list[_Segment]] = {}
        self._pending_post: dict[str, dict[str, str]] = {}
        self._kernels: dict[tuple[str, str], Kernel] = {}  # (graph_id, name) -> emitted
        self._profile_names: dict[str, tuple[str, str]] = {}  # profiler name -> (graph_id, kernel)
        self._wrappers: dict[str, str] = {}  # "graph_3_inductor_wrapper_call" -> graph_id
        self.fusion_log: Optional[Any] = None  # inductor_fusion.FusionLog, set by the worker
        self.time_kernels = False
        self._timers: dict[str, KernelTimer] = {}  # graph_id -> the kernel times of one Inductor graph

    def reset_run(self, time_kernels: bool) -> None:
        self._segments.clear()
        self._pending_post.clear()
        self._kernels.clear()
        self._profile_names.clear()
        self._wrappers.clear()
        self._timers.clear()
        self.time_kernels = time_kernels

    # trace records ----------------------------------------------------------
    def on_record(self, cid: str, meta: dict, payload: Optional[str]) -> None:
        if "inductor_output_code" in meta:
            seg = _Segment(code=payload or "", post_targets=self._pending_post.pop(cid, {}))
            if self.fusion_log is not None:
                seg.refusals = self.fusion_log.take(cid)
            self._segments.setdefault(cid, []).append(seg)
            return
        artifact = meta.get("artifact")
        if not isinstance(artifact, dict):
            return
        name = artifact.get("name", "")
        if name == "inductor_post_grad_graph":
            self._pending_post[cid] = {m.group("name"): m.group("target") for m in _POST_NODE_RE.finditer(payload or "")}
            return
        segments = self._segments.get(cid)
        if not segments:
            return
        seg = segments[-1]
        try:
            data = json.loads(payload or "{}")
        except ValueError:
            return
        if name == "inductor_provenance_tracking_node_mappings" and isinstance(data, dict):
            # "cppCodeToPost" on CPU; GPU runs name it by the code kind too.
            for key, value in data.items():
                if key.endswith("CodeToPost") and isinstance(value, dict):
                    seg.code_to_post.update(value)
            seg.post_to_pre.update(data.get("postToPre") or {})
        elif name == "inductor_provenance_tracking_kernel_stack_traces" and isinstance(data, dict):
            seg.stack_traces.update(data)

    def on_compile_end(self, cid: str) -> None:
        """compilation_metrics for `cid` arrived: its kernels are complete."""
        for index, seg in enumerate(self._segments.pop(cid, [])):
            graph_id = f"{cid}:dynamo" if index == 0 else f"{cid}:dynamo#{index}"
            kernels = self._kernels_of(seg, graph_id)
            for kernel in kernels:
                self._kernels[(graph_id, kernel.name)] = kernel
                self._emit(kernel)
                m = _PROFILE_NAME_RE.search(kernel.source)
                if m:
                    self._profile_names[m.group("name")] = (graph_id, kernel.name)
            wrapper = _WRAPPER_RE.search(seg.code)
            if wrapper:
                self._wrappers[wrapper.group(0)] = graph_id
            for decision in fusion_decisions(seg, kernels, graph_id):
                self._emit(decision)
            if index == 0 and kernels:
                self._capture.mark_kernels(cid, {n: k.name for k in kernels for n in k.nodes})

    def flush(self) -> None:
        for cid in list(self._segments):
            self.on_compile_end(cid)

    def _kernels_of(self, seg: _Segment, graph_id: str) -> list[Kernel]:
        sources = kernel_sources(seg.code)
        names = list(dict.fromkeys([*(k.rsplit(":", 1)[0] for k in seg.code_to_post), *sources]))
        keyed = {k.rsplit(":", 1)[0]: k for k in seg.code_to_post}
        out = []
        for name in names:
            key = keyed.get(name, name)
            post = seg.code_to_post.get(key, [])
            if name in sources:
                kind, source = sources[name]
            else:
                kind, source = "extern", _extern_call(seg.code, name)
            ops = [seg.post_targets.get(p, p) for p in post] or ops_from_name(name)
            pre = list(dict.fromkeys(n for p in post for n in seg.post_to_pre.get(p, [])))
            lines = _user_lines(seg.stack_traces.get(key, []))
            out.append(
                Kernel(
                    name=name,
                    kind=kind,  # type: ignore[arg-type]
                    backend="inductor",
                    graph_id=graph_id,
                    ops=list(dict.fromkeys(ops)),
                    nodes=pre,
                    source_lines=lines,
                    source=source,
                    language={"cpp": "cpp", "triton": "python"}.get(kind, ""),
                    device="cuda" if kind == "triton" else "cpu",
                )
            )
        return out

    # kernel timing ------------------------------------------------------------
    @contextlib.contextmanager
    def timing(self) -> Iterator[None]:
        """Profile the run when asked; afterwards attribute profiler time to
        the kernels by name (cpp kernels appear when
        `cpp.enable_kernel_profile` is on, Triton kernels as device events)."""
        if not self.time_kernels:
            yield
            return
        import torch

        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        prof = torch.profiler.profile(activities=activities)
        prof.__enter__()
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                prof.__exit__(None, None, None)
                self._attribute(prof)

    def _attribute(self, prof: Any) -> None:
        """Profiler events -> each graph's KernelTimer, per kernel.

        A kernel is found by its profile name (cpp kernels, unique per
        Inductor graph), else by the graph whose wrapper range encloses the
        event (library calls: `aten::addmm` is `extern_kernels.addmm`), else
        by its bare name when only one graph has it (Triton device events)."""
        self.flush()
        by_graph: dict[str, dict[str, Kernel]] = {}
        by_name: dict[str, list[Kernel]] = {}
        for kernel in self._kernels.values():
            by_graph.setdefault(kernel.graph_id, {})[kernel.name] = kernel
            by_name.setdefault(kernel.name, []).append(kernel)
        totals: dict[tuple[str, str], list[float]] = {}
        events = prof.events()
        launches = {e.id: e for e in events if getattr(e, "cpu_parent", None) is not None}
        # a Triton kernel is a host range (its launch) and a device event of the same name:
        # the device event is the kernel's time, the host range would count each call twice
        on_device = {e.name for e in events if _on_device(e)}
        for event in events:
            if _compile_work(event, launches) or (event.name in on_device and not _on_device(event)):
                continue
            key = self._kernel_of_event(event, by_graph, by_name)
            if key is None:
                continue
            device_us = getattr(event, "device_time_total", 0.0) or 0.0
            total = totals.setdefault(key, [0, 0.0])
            total[0] += 1
            total[1] += float(device_us or event.cpu_time_total)
        for (graph_id, name), (calls, us) in totals.items():
            timer = self._timers.get(graph_id)
            if timer is None:
                timer = self._timers[graph_id] = KernelTimer(graph_id)
            timer.add(name, int(calls), us)
        from fuselens.capture.collectives import collective_kernels

        for kernel in collective_kernels(events):  # distributed runs: all_reduce & co.
            self._emit(kernel)

    def _kernel_of_event(
        self, event: Any, by_graph: dict[str, dict[str, Kernel]], by_name: dict[str, list[Kernel]]
    ) -> Optional[tuple[str, str]]:
        name = event.name
        if name in self._profile_names:
            return self._profile_names[name]
        parent = getattr(event, "cpu_parent", None)
        graph_id = self._wrappers.get(getattr(parent, "name", ""))
        if graph_id is not None:  # a direct child of one graph's wrapper call
            kernels = by_graph.get(graph_id, {})
            if name in kernels:
                return graph_id, name
            if name.startswith("aten::") and f"extern_kernels.{name[6:]}" in kernels:
                return graph_id, f"extern_kernels.{name[6:]}"
            return None
        if self._wrappers and parent is not None:
            return None  # nested inside something else: counted at its own level
        kernels = by_name.get(name) or []
        if len(kernels) == 1 and not name.startswith("extern"):
            return kernels[0].graph_id, name
        return None


def _on_device(event: Any) -> bool:
    return str(getattr(event, "device_type", "")).endswith("CUDA")


def _compile_work(event: Any, launches: dict[int, Any]) -> bool:
    """Whether Inductor ran `event` to compile or autotune (inside a `... (dynamo_timed)`
    range such as `CachingAutotuner.benchmark_all_configs`). A device event has no
    parent: the host call that launched it (same correlation id) is looked at."""
    node = event
    if getattr(node, "cpu_parent", None) is None:
        node = launches.get(getattr(event, "linked_correlation_id", 0) or -1, node)
    while node is not None:
        if node.name.endswith("(dynamo_timed)"):
            return True
        node = getattr(node, "cpu_parent", None)
    return False


def _extern_call(code: str, name: str) -> str:
    for line in code.splitlines():
        if name + "(" in line:
            return line.strip()
    return name


def _user_lines(traces: list[str]) -> list[SourceLocation]:
    out: list[SourceLocation] = []
    for trace in traces:
        loc = fr.innermost_user_in(trace)
        if loc is not None and all((loc.file, loc.line, loc.cell) != (o.file, o.line, o.cell) for o in out):
            out.append(loc)
    return out
