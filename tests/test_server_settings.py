"""The server's settings: every bad value is told to the user (a problem per
setting) and leaves the setting as it was; nothing is silently dropped."""

from __future__ import annotations

import pytest

from fuselens.server.settings import Settings

BAD = [
    ("trusted", "yes", "fuselens.trusted: 'yes' is not true or false"),
    ("trustedRoots", ["/a", ""], "fuselens.trustedRoots: ['/a', ''] is not a list of folder paths"),
    ("trustedRoots", {"/a": True}, "fuselens.trustedRoots: {'/a': True} is not a list of folder paths"),
    ("runOn", "sometimes", "fuselens.runOn: 'sometimes' is not one of 'save', 'open', 'manual'"),
    ("inlayHints", 1, "fuselens.inlayHints: 1 is not true or false"),
    ("backend", 3, "fuselens.backend: 3 is not a backend name"),
    ("timeout", -1, "fuselens.timeout: -1 is not a positive number of seconds"),
    ("timeout", "soon", "fuselens.timeout: 'soon' is not a positive number of seconds"),
    ("timeout", True, "fuselens.timeout: True is not a positive number of seconds"),
    ("maxCalls", 2.5, "fuselens.maxCalls: 2.5 is not a positive integer"),
    ("maxCalls", -3, "fuselens.maxCalls: -3 is not a positive integer"),
    ("entry", ["train.py"], "fuselens.entry: ['train.py'] is not a command line like \"train.py --steps 2\""),
]


@pytest.mark.parametrize("key,value,message", BAD)
def test_a_bad_setting_is_named_in_problems_and_leaves_the_setting_as_it_was(key, value, message):
    before = Settings(trusted=True, trusted_roots=("/w",), run_on="open", inlay_hints=True, backend="eager",
                      timeout_s=30.0, max_calls=4, entry="train.py")
    after = before.merged({"fuselens": {key: value}})
    assert after.problems == (message,)
    assert after == Settings(**{**vars(before), "problems": (message,)})


def test_every_bad_setting_of_one_merge_is_named_in_order():
    s = Settings().merged({"trusted": "yes", "fuselens.runOn": "sometimes", "fuselens": {"timeout": 0}})
    assert [p.split(":")[0] for p in s.problems] == ["fuselens.trusted", "fuselens.runOn", "fuselens.timeout"]


def test_good_settings_have_no_problems_and_the_next_merge_forgets_old_ones():
    bad = Settings().merged({"runOn": "sometimes"})
    good = bad.merged({"runOn": "manual", "trustedRoots": "/w", "timeout": 5, "backend": "", "entry": None})
    assert good.problems == ()
    assert (good.run_on, good.trusted_roots, good.timeout_s, good.backend, good.entry) == ("manual", ("/w",), 5.0, None, None)


def test_max_calls_zero_means_no_limit_as_the_vscode_setting_says():
    assert Settings(max_calls=3).merged({"maxCalls": 0}) == Settings(max_calls=None)


def test_the_clients_own_settings_are_not_problems():
    # VS Code sends its whole "fuselens" section: the interpreter and the trace level are the client's
    s = Settings().merged({"fuselens": {"interpreter": ["python3"], "trace": {"server": "off"}}, "workspaceFolder": "/w"})
    assert s == Settings()
