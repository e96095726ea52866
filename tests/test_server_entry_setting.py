from fuselens.server.project import ProjectConfig, with_entry_setting
from fuselens.server.settings import Settings


def test_entry_setting_from_editor_is_parsed_into_settings():
    assert Settings().merged({"fuselens": {"entry": "train.py --steps 2"}}).entry == "train.py --steps 2"


def test_entry_setting_overrides_pyproject_entry_and_keeps_its_backend(tmp_path):
    project = ProjectConfig(root=str(tmp_path), entry=["old.py"], backend="eager", max_calls=3)
    merged = with_entry_setting(project, "train.py --steps 2", "/elsewhere")
    assert merged.entry == ["train.py", "--steps", "2"]
    assert (merged.backend, merged.max_calls, merged.root) == ("eager", 3, str(tmp_path))
    assert project.entry == ["old.py"]  # the cached project config is not mutated


def test_entry_setting_without_pyproject_is_relative_to_workspace_root():
    merged = with_entry_setting(None, "-m pkg.train", "/work/ws")
    assert merged.root == "/work/ws" and merged.entry == ["-m", "pkg.train"]
