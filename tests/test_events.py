import json

import pytest

from fuselens.events import (
    SCHEMA_VERSION,
    ErrorEntry,
    GraphBreak,
    Kernel,
    Report,
    RunInfo,
    SourceLocation,
    decode_event,
    encode_event,
)
from report_helpers import demo_report


def test_report_round_trips_through_json_unchanged():
    report = Report(
        run=RunInfo(target="demo.py"),
        graph_breaks=[GraphBreak(location=SourceLocation("demo.py", 3, cell=1), reason="print", hints=["h"])],
        kernels=[Kernel(name="k0", kind="cpp", source_lines=[SourceLocation("demo.py", 4)])],
    )
    assert Report.from_json(report.to_json()) == report


def test_streamed_event_decodes_to_its_dataclass():
    event = Kernel(name="k0", kind="extern", ops=["aten.mm"])
    assert decode_event(encode_event(event)) == event


def test_reader_ignores_fields_it_does_not_know():
    data = Report(run=RunInfo(target="x.py")).to_dict()
    data["run"]["added_in_a_later_minor"] = 1
    assert Report.from_dict(data).run.target == "x.py"



def test_the_demo_report_round_trips_through_json_unchanged():
    report = demo_report()
    text = report.to_json()
    assert Report.from_json(text) == report
    assert Report.from_json(text).to_json() == text


def test_the_wire_format_is_fields_in_declaration_order():
    event = ErrorEntry("fallback", "aten.foo", location=SourceLocation("/p/a.py", 3, "f"), ranks=[1])
    assert encode_event(event) == (
        '{"type": "ErrorEntry", "data": {"kind": "fallback", "message": "aten.foo", "location": '
        '{"file": "/p/a.py", "line": 3, "function": "f", "code": "", "cell": null, "column": 0}, '
        '"traceback": "", "compile_id": "", "ranks": [1], "explained": ""}}'
    )


def test_reader_ignores_unknown_keys_at_every_level_and_fills_missing_ones_with_defaults():
    data = demo_report().to_dict()
    data["added_in_a_later_minor"] = {"x": 1}
    data["graph_breaks"][0]["location"]["added"] = True
    del data["graph_breaks"][0]["hints"], data["ranks"]
    report = Report.from_dict(data)
    assert report.graph_breaks[0].hints == [] and report.ranks == []
    assert report.graph_breaks[0].location == demo_report().graph_breaks[0].location


def test_a_newer_schema_version_is_refused():
    data = Report(run=RunInfo(target="x.py")).to_dict()
    data["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(ValueError, match=f"report schema {SCHEMA_VERSION + 1} is newer"):
        Report.from_json(json.dumps(data))


def test_a_kind_added_by_a_newer_writer_loads_as_written():
    line = encode_event(Kernel(name="k0", kind="cpp")).replace('"cpp"', '"metal"')
    assert decode_event(line).kind == "metal"


def test_a_value_of_the_wrong_type_is_refused_naming_where_it_is():
    data = Report(run=RunInfo(target="x.py"), errors=[ErrorEntry("exception", "boom")]).to_dict()
    data["errors"][0]["ranks"] = "0-1"
    data["run"]["exit_code"] = "1"
    with pytest.raises(ValueError) as raised:
        Report.from_dict(data)
    assert "Report.run.exit_code" in str(raised.value) and "Report.errors[0].ranks" in str(raised.value)
    with pytest.raises(ValueError):
        decode_event('{"type": "Kernel", "data": {"name": "k0", "kind": "cpp", "calls": "many"}}')
