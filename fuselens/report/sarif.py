"""The SARIF 2.1.0 view, for GitHub code scanning (and any SARIF viewer).

One result per finding: graph breaks, recompiles (and recompiles that hit
the limit), fusion decisions that kept ops apart, and errors. Locations are
relative to the repository root (`uriBaseId` %SRCROOT%), as code scanning
wants; each result carries a `partialFingerprints` entry that does not
depend on the line number, so a finding keeps its identity when code moves.
Errors with no user location become tool notifications rather than results
(code scanning rejects results without a location).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any, Optional
from urllib.parse import quote

from fuselens import __version__
from fuselens.events import ErrorEntry, Report, SourceLocation
from fuselens.report import common

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
SARIF_VERSION = "2.1.0"
SRCROOT = "%SRCROOT%"
FINGERPRINT_KEY = "fuselensFinding/v1"


@dataclass(frozen=True)
class Rule:
    """A SARIF rule: what a kind of finding is, how severe, and the page that explains it
    (the troubleshooting guide where the kind has no page of its own)."""

    id: str
    name: str
    level: str
    short: str
    full: str
    help_uri: str = common.TROUBLESHOOTING_DOCS
    tags: tuple[str, ...] = ("torch.compile", "performance")


RULES: tuple[Rule, ...] = (
    Rule("graph-break", "GraphBreak", "warning", short="torch.compile graph break", help_uri=common.GRAPH_BREAK_DOCS,
         full="Dynamo could not trace this line, split the compiled graph here and ran the line in Python. "
              "Each break costs a graph exit, a Python round trip and lost fusion across the break."),
    Rule("recompile", "Recompile", "warning", short="torch.compile recompiled a function",
         help_uri=common.RECOMPILE_DOCS,
         full="A guard of a compiled function failed (a shape, dtype or value changed), so the function was "
              "compiled again. Repeated recompiles cost compile time on every new input."),
    Rule("recompile-limit", "RecompileLimit", "error", short="torch.compile hit the recompile limit",
         help_uri=common.RECOMPILE_DOCS,
         full="The function recompiled until Dynamo's recompile limit; from then on it runs eagerly, "
              "without compilation."),
    Rule("fusion-blocked", "FusionBlocked", "note", short="ops that share a buffer were not fused",
         full="The compiler kept two ops that share a buffer in separate kernels; the intermediate goes "
              "through memory. The message says why and which option would change it."),
    Rule("error", "ProgramError", "error", short="the program failed under torch.compile",
         tags=("torch.compile", "correctness"),
         full="The analysed program raised, exited with an error, timed out or was killed, or the ranks of "
              "a distributed run compiled different graphs (a divergence: the job can deadlock)."),
    Rule("compile-fallback", "CompileFallback", "warning", short="a graph or op fell back to eager",
         full="A backend failed to compile a graph or lowered an op to an eager fallback; the code runs "
              "but without the compiled speedup."),
    Rule("internal-error", "InternalError", "note", short="fuselens failed while analysing", tags=("fuselens",),
         full="fuselens itself failed; the report may be incomplete. Please report it."),
)
RULE_INDEX = {r.id: i for i, r in enumerate(RULES)}


def render_sarif(report: Report, *, root: Optional[str] = None) -> str:
    """The report as a SARIF 2.1.0 log. Absolute paths under `root` (the
    repository root; default the current directory) become relative URIs."""
    root = os.path.abspath(root or os.getcwd())
    b = _Builder(common.bounded(report), root)
    b.graph_breaks()
    b.recompiles()
    b.fusion()
    b.errors()
    return json.dumps(b.log(), indent=2) + "\n"


def rule_for_error(err: ErrorEntry) -> str:
    if err.kind in ("compile", "fallback"):
        return "compile-fallback"
    if err.kind == "internal":
        return "internal-error"
    return "error"


class _Builder:
    def __init__(self, report: Report, root: str):
        self.report = report
        self.root = root
        self.results: list[dict[str, Any]] = []
        self.notifications: list[dict[str, Any]] = []
        self.seen_fingerprints: dict[str, int] = {}

    # -- locations --------------------------------------------------------
    def artifact(self, file: str) -> dict[str, Any]:
        path = file if os.path.isabs(file) else os.path.join(self.root, file)
        path = os.path.normpath(path)
        rel = os.path.relpath(path, self.root) if not _outside(path, self.root) else None
        if rel is not None:
            return {"uri": quote(rel.replace(os.sep, "/")), "uriBaseId": SRCROOT}
        return {"uri": "file://" + quote(path.replace(os.sep, "/"))}

    def physical(self, loc: SourceLocation) -> dict[str, Any]:
        region: dict[str, Any] = {"startLine": max(1, int(loc.line or 1))}
        if loc.column:
            region["startColumn"] = loc.column + 1  # schema columns are 0-based, SARIF's 1-based
        if loc.code:
            region["snippet"] = {"text": loc.code}
        return {"artifactLocation": self.artifact(loc.file), "region": region}

    def location(self, loc: SourceLocation, message: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {"physicalLocation": self.physical(loc)}
        if loc.function or loc.cell is not None or message:
            text = message or f"in {loc.function}"
            if loc.cell is not None:
                text += f" (notebook cell {loc.cell}, line {loc.line})"
            out["message"] = {"text": common.clip_text(text)}
        return out

    # -- results ----------------------------------------------------------
    def add(self, rule_id: str, loc: SourceLocation, text: str, key: str, *, level: Optional[str] = None,
            related: Optional[list[SourceLocation]] = None, properties: Optional[dict[str, Any]] = None) -> None:
        rule = RULES[RULE_INDEX[rule_id]]
        if _outside(os.path.normpath(loc.file if os.path.isabs(loc.file) else os.path.join(self.root, loc.file)), self.root):
            # Code scanning shows results in the repository only; a program
            # failure elsewhere is still said, as a notification.
            if rule_id == "error":
                self.notifications.append({"level": rule.level, "message": {"text": common.clip_text(text)},
                                           "descriptor": {"id": rule_id, "index": RULE_INDEX[rule_id]}})
            return
        uri = self.artifact(loc.file)["uri"]
        digest = hashlib.sha256(f"{rule_id}\0{uri}\0{loc.function}\0{key}".encode()).hexdigest()[:32]
        # Identical findings in one file get :1, :2... so fingerprints stay unique.
        n = self.seen_fingerprints.get(digest, 0)
        self.seen_fingerprints[digest] = n + 1
        result: dict[str, Any] = {
            "ruleId": rule_id,
            "ruleIndex": RULE_INDEX[rule_id],
            "level": level or rule.level,
            "message": {"text": common.clip_text(text)},
            "locations": [self.location(loc)],
            "partialFingerprints": {FINGERPRINT_KEY: f"{digest}:{n + 1}"},
        }
        if related:
            result["relatedLocations"] = [
                {"id": i + 1, **self.location(r, f"called from {r.function or 'here'}")} for i, r in enumerate(related)
            ]
        if properties:
            result["properties"] = properties
        self.results.append(result)

    def graph_breaks(self) -> None:
        for gb in common.program_breaks(self.report):
            times = f" (hit {gb.count} times)" if gb.count > 1 else ""
            parts = [(0, f"Graph break{times}: {gb.explained or gb.reason}.")]
            if gb.explanation:
                parts.append((3, gb.explanation))
            parts += [(1, f"Fix: {f.title}.") for f in gb.fixes[:1]] or [(1 if i == 0 else 4, f"Hint: {h}") for i, h in enumerate(gb.hints)]
            if gb.registry_id:
                parts.append((2, f"See {common.gb_doc_url(gb)}"))
            props = {"count": gb.count, "compileId": gb.compile_id}
            if gb.registry_id:
                props["registryId"] = gb.registry_id
            if gb.explanation:  # here too: the message may have no room for them
                props["explanation"] = gb.explanation
            if gb.hints:
                props["hints"] = list(gb.hints)
            self.add("graph-break", gb.location, fit(parts), gb.reason, related=gb.user_stack[:-1],
                     properties=props)

    def recompiles(self) -> None:
        for rc in self.report.recompiles:
            rule = "recompile-limit" if rc.hit_limit else "recompile"
            what = "hit the recompile limit and now runs eagerly" if rc.hit_limit else "was recompiled"
            parts = [f"'{rc.function}' {what} (compile {rc.compile_id}): {common.recompile_headline(rc)}."]
            parts += [f"Changed: {common.shape_change_text(sc)}." for sc in rc.shape_changes]
            parts += [f"Dtype: {d}." for d in rc.dtype_changes]
            best = next((f for f in rc.fixes if f.preferred), None)
            if best is not None:
                parts.append(f"Fix (verified): {best.title}.")
            elif rc.fix:
                parts.append(f"Fix: {rc.fix}")
            key = "|".join(sorted({sc.input_name for sc in rc.shape_changes} | set(rc.dtype_changes))) or "guard"
            self.add(rule, rc.location, " ".join(parts), key, properties={"compileId": rc.compile_id})

    def fusion(self) -> None:
        graphs = {g.graph_id: g for g in self.report.graphs}
        for d in self.report.fusion:
            if d.decision != "not_fused":
                continue
            loc = d.locations[0] if d.locations else (graphs[d.graph_id].location if d.graph_id in graphs else None)
            if loc is None:
                continue  # nothing in the user's code to point at
            text = f"Not fused: {' + '.join(d.nodes)}: {d.reason}."
            if d.option:
                text += f" To change it: {d.option}."
            self.add("fusion-blocked", loc, text, f"{d.rule}|{'+'.join(d.nodes)}",
                     related=d.locations[1:], properties={"rule": d.rule, "graphId": d.graph_id})

    def errors(self) -> None:
        for err in self.report.errors:
            rule = rule_for_error(err)
            first = err.message.splitlines()[0] if err.message else err.kind
            text = fit([(0, f"{err.kind}: {first}")] + ([(2, err.explained)] if err.explained else []))
            if err.location is not None:
                props = {"kind": err.kind, **({"explanation": err.explained} if err.explained else {})}
                self.add(rule, err.location, text, f"{err.kind}|{first}", properties=props)
            else:
                level = RULES[RULE_INDEX[rule]].level
                self.notifications.append({"level": level, "message": {"text": common.clip_text(text)},
                                           "descriptor": {"id": rule, "index": RULE_INDEX[rule]}})

    # -- the log ------------------------------------------------------------
    def log(self) -> dict[str, Any]:
        run_info = self.report.run
        invocation: dict[str, Any] = {
            "executionSuccessful": not any(e.kind == "internal" for e in self.report.errors),
            "commandLine": " ".join(["fuselens report", run_info.target, *(["--", *run_info.args] if run_info.args else [])]),
        }
        if run_info.exit_code is not None:
            invocation["exitCode"] = run_info.exit_code
        if self.notifications:
            invocation["toolExecutionNotifications"] = self.notifications
        root_uri = "file://" + quote(self.root.replace(os.sep, "/").rstrip("/") + "/")
        return {
            "$schema": SARIF_SCHEMA,
            "version": SARIF_VERSION,
            "runs": [
                {
                    "tool": {"driver": {"name": "fuselens", "version": __version__,
                                        "semanticVersion": __version__, "rules": [_rule(r) for r in RULES]}},
                    "automationDetails": {"id": f"fuselens/{run_info.target}/"},
                    "originalUriBaseIds": {SRCROOT: {"uri": root_uri}},
                    "invocations": [invocation],
                    "columnKind": "unicodeCodePoints",
                    "results": self.results,
                    "properties": {"torchVersion": run_info.torch_version, "backend": run_info.backend,
                                   "schemaVersion": self.report.schema_version},
                }
            ],
        }


def fit(parts: list[tuple[int, str]]) -> str:
    """Message parts (priority, text; 0 most important) joined in order; the
    least important (priority > 1) are left out until the text fits MAX_TEXT,
    then it is clipped."""
    keep = list(parts)
    while any(p > 1 for p, _ in keep) and len(" ".join(t for _, t in keep)) > common.MAX_TEXT:
        keep.remove(max(keep, key=lambda p: p[0]))
    return common.clip_text(" ".join(t for _, t in keep))


def _rule(r: Rule) -> dict[str, Any]:
    return {
        "id": r.id,
        "name": r.name,
        "shortDescription": {"text": r.short},
        "fullDescription": {"text": r.full},
        "helpUri": r.help_uri,
        "help": {"text": f"{r.full} See {r.help_uri}", "markdown": f"{r.full}\n\nSee [the PyTorch docs]({r.help_uri})."},
        "defaultConfiguration": {"level": r.level},
        "properties": {"tags": list(r.tags), "precision": "very-high"},
    }


def _outside(path: str, root: str) -> bool:
    try:
        rel = os.path.relpath(path, root)
    except ValueError:
        return True
    return rel == ".." or rel.startswith(".." + os.sep)
