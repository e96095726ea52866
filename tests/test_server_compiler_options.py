"""The server's `fuselens.compilerOptions` setting: read like `fuselens report
--set` (validated by the compiler's options dataclass), sent with every run,
and a bad value told to the user instead of silently dropped."""

from __future__ import annotations

from lsp_workspaces.harness import command, open_file, session, wait_until

from fuselens.compiler.options import OPTION_NAMES
from fuselens.server.planning import run_options
from fuselens.server.settings import Settings

PROGRAM = """import torch


def f(x):
    return (x.sin() + 1).cos() * 2


torch.compile(f, backend="fuselens")(torch.randn(64))
"""


def test_compiler_options_setting_is_typed_and_reaches_the_run_options():
    s = Settings().merged({"fuselens.compilerOptions": {"fusion": "off", "max_fusion_size": 8}})
    assert s.compiler_options == {"fusion": False, "max_fusion_size": 8} and s.problems == ()
    assert run_options(s, None)["compiler_options"] == {"fusion": False, "max_fusion_size": 8}
    assert run_options(Settings(), None)["compiler_options"] is None
    kept = s.merged({"fuselens": {"runOn": "open"}})  # another section keeps them
    assert kept.compiler_options == s.compiler_options


def test_bad_compiler_options_are_left_out_and_each_named_in_problems():
    s = Settings().merged({"fuselens": {"compilerOptions": {"fusion": False, "max_fusion_size": 0, "nope": 1}}})
    assert s.compiler_options == {"fusion": False}
    assert s.problems == (
        "fuselens.compilerOptions: option max_fusion_size must be >= 1",
        "fuselens.compilerOptions: unknown fuselens compiler option(s) 'nope'; valid options: "
        + ", ".join(OPTION_NAMES),
    )
    assert Settings().merged({"compilerOptions": "fusion=off"}).problems[0].startswith(
        "fuselens.compilerOptions must be an object")


async def test_server_says_a_bad_compiler_option_and_runs_with_the_good_ones(tmp_path):
    (tmp_path / "prog.py").write_text(PROGRAM)
    init = {"trusted": True, "runOn": "manual", "compilerOptions": {"fusion": False, "max_fusion_size": -1}}
    async with session(tmp_path, init=init) as client:
        told = await wait_until(lambda: [m for m in client.messages if "max_fusion_size" in m.message], 10)
        assert told[0].message == "fuselens.compilerOptions: option max_fusion_size must be >= 1"
        doc = open_file(client, tmp_path / "prog.py")
        summary = await command(client, "fuselens.analyze", doc, timeout=240)
        assert summary["status"] == "ok", summary
        kernel = await command(client, "fuselens.kernelSource", doc, "cpp_fused_sin_0")
        assert kernel.get("error") is None, kernel  # fusion off: one kernel per op
