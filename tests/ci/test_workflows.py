"""The workflows pass actionlint (skipped where it is not installed) and keep the promised shape."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ACTIONLINT = shutil.which("actionlint") or str(Path(sys.executable).parent / "actionlint")


@pytest.mark.skipif(not Path(ACTIONLINT).exists(), reason="actionlint not installed (dev extra)")
def test_actionlint_clean():
    proc = subprocess.run([ACTIONLINT], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_perf_workflow_shape():
    text = (ROOT / ".github/workflows/perf.yml").read_text()
    for needle in ("runs-on: [self-hosted, linux, x64, gpu]", "fetch-depth: 0", "perf-ok", "[skip perf]",
                   "concurrency:", "permissions:", "--interleave", "python -m ci publish", "kdengine build",
                   "GITHUB_STEP_SUMMARY", "gh pr comment"):
        assert needle in text, needle
