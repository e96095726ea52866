"""Verify the catalogue's fixes before one is offered as preferred.

For each finding, each fix with an edit is applied to a copy of the program
(the same edit the language server's quick-fix makes: fuselens/server/fixes.py)
and the copy is run in a fresh capture worker. The fix is `verified` when
the copy still runs without failing and the finding it targets is gone;
the first verified fix of a finding becomes its `preferred` one. A fix that
crashes (a `mark_dynamic` that raises ConstraintViolationError) is kept as
`verified = False` and never preferred. Advice-only fixes (no edit) are never
run; a report with no editable fix runs nothing. Verdicts are kept by content
(fuselens/report/verdicts.py), so a warm report re-runs nothing that has not
changed. No torch here: the runs are subprocesses.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Callable, Optional, Union

from fuselens.events import FixAdvice, GraphBreak, Recompile, Report
from fuselens.report import common
from fuselens.report.verdicts import RunContext, Verdict, VerdictStore, verdict_key

EDITABLE = ("mark_dynamic", "dynamic_true", "config", "ignore_logging", "backend")
Finding = Union[GraphBreak, Recompile]


Outcome = Verdict  # what one verification run showed


@dataclass
class Verification:
    """How the verdicts of one report were reached."""

    runs: int = 0  # programs re-run with a fix applied
    cached: int = 0  # verdicts taken from the verdict cache instead

    def describe(self) -> str:
        """For RunInfo.fix_verdicts: "" when nothing needed verifying."""
        if not self.runs and not self.cached:
            return ""
        if not self.runs:
            return "cached"
        if not self.cached:
            return "re-run"
        return f"{self.cached} cached, {self.runs} re-run"


def edited_source(source: str, finding: Finding, fix: FixAdvice) -> Optional[str]:
    """The program with `fix` applied, or None when the edit cannot be made
    mechanically here (no unique call site, no torch.compile call found)."""
    from fuselens.server import fixes as fx
    from fuselens.server.source_index import SourceIndex

    index = SourceIndex(source)
    if index.tree is None:
        return None
    edit: Optional[fx.Fix] = None
    function = finding.function if isinstance(finding, Recompile) else finding.location.function
    if fix.edit == "config" and len(fix.args) == 2:
        edit = fx.config_fix(index, fix.args[0], fix.args[1])
    elif fix.edit == "ignore_logging" and len(fix.args) == 1:
        edit = fx.ignore_logging_fix(index, fix.args[0])
    elif fix.edit == "dynamic_true":
        site = index.site_for(function)
        edit = fx.dynamic_true_fix(index, site) if site is not None else None
    elif fix.edit == "backend" and len(fix.args) == 1:
        site = index.site_for(function)
        edit = fx.backend_fix(index, site, fix.args[0]) if site is not None else None
    elif fix.edit == "mark_dynamic" and len(fix.args) == 2:
        site = index.site_for(function)
        calls = index.call_sites(site) if site is not None else []
        if site is not None and len(calls) == 1:
            edit = fx.mark_dynamic_fix(index, site, calls[0][0], calls[0][1], fix.args[0], int(fix.args[1]))
    edit = fx.checked(source, edit)
    return fx.apply_edits(source, edit.edits) if edit is not None else None


def still_there(finding: Finding, fix: FixAdvice, after: Report) -> bool:
    """Whether the re-run still has the finding the fix targets (lines may
    have moved: compare the function and the cause, or the break's reason)."""
    if isinstance(finding, Recompile):
        return any(rc.function == finding.function and rc.cause == finding.cause for rc in after.recompiles)
    return any(gb.reason == finding.reason and gb.location.function == finding.location.function
               for gb in after.graph_breaks)


def verify_report(report: Report, script: str, run: Callable[[str], Report], max_runs: int = 4,
                  store: Optional[VerdictStore] = None, context: Optional[RunContext] = None) -> Verification:
    """Verify the fixes of `report` (from running `script`) in place; `run(path)`
    runs a copy and returns its report. With a `store` and the `context` of the
    run, verdicts are looked up before a run and stored after it."""
    findings: list[Finding] = list(report.graph_breaks)
    findings += [group[0] for group in common.recompiles_by_function(report.recompiles)]
    groups = {id(g[0]): g for g in common.recompiles_by_function(report.recompiles)}
    done = Verification()
    if not any(f.edit in EDITABLE for finding in findings for f in _fixes_of(groups.get(id(finding), [finding]))):
        return done  # advice only: nothing a re-run could check
    try:
        with open(script, encoding="utf-8") as f:
            source = f.read()
    except OSError:
        return done
    tried: dict[tuple, Outcome] = {}
    for finding in findings:
        siblings = groups.get(id(finding), [finding])
        candidates = _fixes_of(siblings)
        for fix in candidates:
            if fix.edit not in EDITABLE:
                continue
            key = (fix.edit, tuple(fix.args), *_target(finding))
            if key not in tried:
                found = _verdict(source, script, finding, fix, run, store, context, done, max_runs)
                if found is None:
                    break  # the run budget is spent
                tried[key] = found
            outcome = tried[key]
            for f in (f for rc in siblings for f in rc.fixes if f.title == fix.title):
                f.verified, f.verify_note = outcome.verified, outcome.note
        # One preferred fix per finding: the first that worked.
        best = next((f for f in candidates if f.verified), None)
        for rc in siblings:
            for f in rc.fixes:
                f.preferred = best is not None and f.title == best.title
    return done


def _target(finding: Finding) -> tuple[str, ...]:
    """What `still_there` compares: the finding a verdict is about."""
    if isinstance(finding, Recompile):
        return ("recompile", finding.function, finding.cause)
    return ("graph-break", finding.location.function, finding.reason)


def _verdict(source: str, script: str, finding: Finding, fix: FixAdvice, run: Callable[[str], Report],
             store: Optional[VerdictStore], context: Optional[RunContext], done: Verification,
             max_runs: int) -> Optional[Outcome]:
    """The verdict on `fix`: stored, else from a run (None when `max_runs`
    runs were made already)."""
    new = edited_source(source, finding, fix)
    if new is None:
        # not tried: shown as a plain fix, never as one that "did not work"
        return Outcome(None, "not tried: the edit could not be made mechanically in this program")
    key = verdict_key(context, new, _target(finding)) if store is not None and context is not None else None
    stored = store.get(key) if store is not None and key is not None else None
    if stored is not None:
        done.cached += 1
        return stored
    if done.runs >= max_runs:
        return None
    done.runs += 1
    outcome = _try(new, script, finding, fix, run)
    if store is not None and key is not None:
        store.put(key, outcome)
    return outcome


def _fixes_of(siblings: list) -> list[FixAdvice]:
    out: list[FixAdvice] = []
    for item in siblings:
        out += [f for f in item.fixes if all(f.title != g.title for g in out)]
    return out


def _try(source: str, script: str, finding: Finding, fix: FixAdvice, run: Callable[[str], Report]) -> Outcome:
    folder = os.path.dirname(os.path.abspath(script))
    # The copy sits beside the original so that its imports and data files
    # resolve the same way; it is removed right after the run.
    fd, path = tempfile.mkstemp(prefix=".fuselens_fix_", suffix=".py", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(source)
        after = run(path)
    except OSError as exc:
        return Outcome(False, f"could not write a copy: {exc}")
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    failed = common.failures(after)
    if failed:
        return Outcome(False, common.clip_text(f"the program failed with it: {failed[0].message}"))
    if still_there(finding, fix, after):
        return Outcome(False, "applied and re-run: the finding is still there")
    return Outcome(True, "applied to a copy and re-run: the program ran and the finding is gone")
