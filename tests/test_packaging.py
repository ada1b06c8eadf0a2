"""Packaging: the wheel holds the kdengine package with its CUDA sources (kdengine/_csrc) and no top-level
`ci`; installed into a fresh venv (torch borrowed from this environment), the JIT build finds the packaged
sources and nvcc compiles them to PTX there. `python -m ci` runs from the checkout."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SOURCES = {"verify_api.cpp", "verify_kernel.cu", "verify_kernel.cuh", "verify_wide.cuh", "verify_wide_lean.cuh",
           "verify_launch.h", "static_switch.h", "verify_sm90.cu", "verify_sm90.cuh"}


def test_package_list_is_complete_and_excludes_ci():
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "kdengine").rglob("__init__.py")}
    assert listed == on_disk | {"kdengine._csrc"}, "add new kdengine subpackages to [tool.setuptools] packages"
    assert PYPROJECT["tool"]["setuptools"]["package-dir"] == {"kdengine._csrc": "csrc"}
    assert not any(p == "ci" or p.startswith("ci.") for p in listed)


def test_python_m_ci_runs_from_the_checkout():
    proc = subprocess.run([sys.executable, "-m", "ci", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0 and "record" in proc.stdout, proc.stderr
    import ci

    assert Path(ci.__file__).resolve().parent == ROOT / "ci"  # the checkout's, not an installed copy


def build_wheel(tmp: Path) -> Path:
    """A wheel built from a copy of the tracked files (the checkout stays free of build outputs)."""
    src = tmp / "src"
    for rel in subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.splitlines():
        if (ROOT / rel).is_file() and not rel.startswith(("perf_history/", "tests/")):
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp / "dist"), str(src)], check=True, capture_output=True, text=True, timeout=600)
    return next((tmp / "dist").glob("kdengine-*.whl"))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.mark.slow
def test_wheel_contents(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[-1] for n in names if n.startswith("kdengine/_csrc/")} >= SOURCES
    assert not [n for n in names if n.startswith("ci/")], "the repository tool must not be installed"
    assert "kdengine/ops/build.py" in names and "kdengine/py.typed" in names


@pytest.mark.slow
@pytest.mark.nvcc
def test_fresh_venv_installs_the_wheel_and_compiles_ptx(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # torch and friends from this environment, as plain path entries (its editable kdengine is not loaded)
    (site / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True,
                   capture_output=True, text=True, timeout=300)
    out = tmp_path / "verify_kernel.ptx"
    script = (
        "import subprocess, sys\n"
        "from kdengine.ops import build\n"
        f"assert str(build.CSRC).startswith({str(site)!r}), build.CSRC\n"
        "build.extension_name(('90',), False)  # hashes every packaged source\n"
        "subprocess.run(['nvcc', '-ptx', '-std=c++17', '-O3', '-arch=sm_90', '-I', str(build.CSRC), '-o', "
        f"{str(out)!r}, str(build.CSRC / 'verify_kernel.cu')], check=True)\n"
        "print(build.CSRC)\n"
    )
    proc = subprocess.run([str(py), "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == str(site / "kdengine" / "_csrc")
    ptx = out.read_text()
    assert ".visible .entry" in ptx and "mma.sync" in ptx
    no_ci = subprocess.run([str(py), "-c", "import ci"], cwd=tmp_path, capture_output=True, text=True)
    assert "No module named 'ci'" in no_ci.stderr
