from fuselens.events import (
    GraphBreak,
    Kernel,
    Report,
    RunInfo,
    SourceLocation,
    decode_event,
    encode_event,
)


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
