"""The SARIF view: the required properties of SARIF 2.1.0 and what GitHub
code scanning needs from each result (checked without network access)."""

from __future__ import annotations

import json

from fuselens.events import ErrorEntry, FusionDecision, GraphBreak, Report, RunInfo, SourceLocation
from fuselens.report.sarif import FINGERPRINT_KEY, RULES, render_sarif
from report_helpers import demo_report

LEVELS = {"none", "note", "warning", "error"}


def check_sarif(log: dict) -> None:
    """Required properties of the SARIF 2.1.0 schema (sarifLog, run, tool,
    toolComponent, reportingDescriptor, result, message, location,
    physicalLocation, artifactLocation, region) plus GitHub's upload rules:
    every result has a ruleId, message text and a physical location with a
    relative URI and a start line; rules have short descriptions."""
    assert log["version"] == "2.1.0"
    assert isinstance(log.get("$schema"), str) and "sarif" in log["$schema"]
    assert isinstance(log["runs"], list) and log["runs"]
    for run in log["runs"]:
        driver = run["tool"]["driver"]
        assert isinstance(driver["name"], str) and driver["name"]
        rules = driver.get("rules", [])
        ids = [r["id"] for r in rules]
        assert len(ids) == len(set(ids)), "rule ids must be unique"
        for r in rules:
            assert isinstance(r["id"], str) and r["id"]
            assert r["shortDescription"]["text"] and r["fullDescription"]["text"]
            assert r["helpUri"].startswith("https://")
            assert r["help"]["text"]
            assert r["defaultConfiguration"]["level"] in LEVELS
        bases = run.get("originalUriBaseIds", {})
        for base in bases.values():
            assert base["uri"].startswith("file://") and base["uri"].endswith("/")
        for res in run.get("results", []):
            assert res["ruleId"] in ids
            assert ids[res["ruleIndex"]] == res["ruleId"]
            assert res["level"] in LEVELS
            assert isinstance(res["message"]["text"], str) and res["message"]["text"]
            assert res["locations"], "GitHub rejects results without a location"
            for loc in res["locations"] + res.get("relatedLocations", []):
                phys = loc["physicalLocation"]
                art = phys["artifactLocation"]
                assert isinstance(art["uri"], str) and art["uri"]
                if "uriBaseId" in art:
                    assert art["uriBaseId"] in bases
                    assert not art["uri"].startswith(("/", "file:")), "relative to the base"
                assert isinstance(phys["region"]["startLine"], int) and phys["region"]["startLine"] >= 1
            fps = res["partialFingerprints"]
            assert fps and all(isinstance(v, str) for v in fps.values())
        for inv in run.get("invocations", []):
            assert isinstance(inv["executionSuccessful"], bool)


def sarif(report: Report, root: str = "/repo") -> dict:
    return json.loads(render_sarif(report, root=root))


def test_demo_report_is_valid_sarif_for_code_scanning():
    log = sarif(demo_report())
    check_sarif(log)
    results = log["runs"][0]["results"]
    by_rule: dict[str, int] = {}
    for r in results:
        by_rule[r["ruleId"]] = by_rule.get(r["ruleId"], 0) + 1
    assert by_rule == {"graph-break": 3, "recompile": 2, "recompile-limit": 1, "fusion-blocked": 2, "error": 1}


def test_graph_break_result_points_at_the_user_line_with_reason_and_hint():
    log = sarif(demo_report())
    gb = next(r for r in log["runs"][0]["results"] if r["ruleId"] == "graph-break"
              and r["locations"][0]["physicalLocation"]["region"]["startLine"] == 16)
    loc = gb["locations"][0]["physicalLocation"]
    assert loc["artifactLocation"] == {"uri": "examples/demo.py", "uriBaseId": "%SRCROOT%"}
    assert gb["level"] == "warning"
    assert "Unsupported Tensor.item() call" in gb["message"]["text"]
    assert "Hint: Set `torch._dynamo.config.capture_scalar_outputs = True`" in gb["message"]["text"]
    assert gb["properties"]["count"] == 3 and gb["properties"]["registryId"] == "GB0124"
    assert gb["relatedLocations"][0]["physicalLocation"]["region"]["startLine"] == 46


def test_absolute_paths_become_relative_to_the_repo_root_and_results_outside_it_are_dropped():
    r = Report(run=RunInfo(target="/repo/train.py"), graph_breaks=[
        GraphBreak(SourceLocation("/repo/src/my model.py", 7, "f"), "reason"),
        GraphBreak(SourceLocation("/elsewhere/lib.py", 3, "g"), "reason"),
    ])
    log = sarif(r, root="/repo")
    check_sarif(log)
    arts = [x["locations"][0]["physicalLocation"]["artifactLocation"] for x in log["runs"][0]["results"]]
    assert arts[0] == {"uri": "src/my%20model.py", "uriBaseId": "%SRCROOT%"}
    assert len(arts) == 1  # code scanning shows only the repository's files
    assert log["runs"][0]["originalUriBaseIds"]["%SRCROOT%"]["uri"] == "file:///repo/"


def test_fingerprints_survive_line_moves_and_stay_unique():
    def fp(line: int) -> list[str]:
        r = Report(run=RunInfo(target="t.py"), graph_breaks=[
            GraphBreak(SourceLocation("t.py", line, "f"), "same reason"),
            GraphBreak(SourceLocation("t.py", line + 5, "f"), "same reason"),
        ])
        return [x["partialFingerprints"][FINGERPRINT_KEY] for x in sarif(r)["runs"][0]["results"]]

    assert fp(10) == fp(40)
    assert len(set(fp(10))) == 2


def test_errors_without_location_become_tool_notifications():
    r = Report(run=RunInfo(target="-m pkg.mod", exit_code=-9),
               errors=[ErrorEntry("timeout", "killed after 5 s"),
                       ErrorEntry("compile", "inductor failed", SourceLocation("/repo/m.py", 3, "f"))])
    log = sarif(r)
    check_sarif(log)
    run = log["runs"][0]
    assert [x["ruleId"] for x in run["results"]] == ["compile-fallback"]
    note = run["invocations"][0]["toolExecutionNotifications"][0]
    assert note["level"] == "error" and "killed after 5 s" in note["message"]["text"]
    assert run["invocations"][0]["exitCode"] == -9


def test_fusion_blocked_falls_back_to_the_graph_location_and_skips_fused():
    report = demo_report()
    report.fusion = [FusionDecision("not_fused", ["a", "b"], "why", graph_id=report.graphs[0].graph_id),
                     FusionDecision("fused", ["c", "d"], "ok", kernel="k")]
    results = sarif(report)["runs"][0]["results"]
    fusion = [x for x in results if x["ruleId"] == "fusion-blocked"]
    assert len(fusion) == 1
    assert fusion[0]["locations"][0]["physicalLocation"]["region"]["startLine"] == report.graphs[0].location.line
    assert fusion[0]["level"] == "note"


def test_every_rule_links_to_the_pytorch_docs():
    assert {r.id for r in RULES} >= {"graph-break", "recompile", "recompile-limit", "fusion-blocked", "error"}
    assert all(r.help_uri.startswith("https://docs.pytorch.org/") for r in RULES)
