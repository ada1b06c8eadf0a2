"""The workflows' security properties, asserted on the parsed YAML: pinned actions, least privilege per job,
no write token or persisted credential on the self-hosted GPU runner, fork runs only through the approval
environment for the exact head SHA, fresh per-job venv and caches, results always uploaded, one `ci perf`
call; and actionlint and zizmor (offline) report nothing (each skipped where not installed)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
BIN = Path(sys.executable).parent
ACTIONLINT = shutil.which("actionlint") or str(BIN / "actionlint")
ZIZMOR = shutil.which("zizmor") or str(BIN / "zizmor")
PINNED = re.compile(r"^\s*(?:-\s+)?uses:\s+[\w.-]+/[\w./-]+@[0-9a-f]{40}\s+#\s+v\d+(?:\.\d+)*\s*$")


def load(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as True
    return data


PERF = load(ROOT / ".github/workflows/perf.yml")


def jobs() -> list[tuple[str, str, dict]]:
    return [(path.name, name, job) for path in WORKFLOWS for name, job in load(path)["jobs"].items()]


def steps(job: dict) -> list[dict]:
    return job.get("steps", [])


def is_self_hosted(job: dict) -> bool:
    runs_on = job["runs-on"]
    return "self-hosted" in (runs_on if isinstance(runs_on, list) else [runs_on])


def test_every_action_is_pinned_to_a_commit_sha_with_its_tag():
    for path in WORKFLOWS:
        for line in path.read_text().splitlines():
            if re.match(r"^\s*(?:-\s+)?uses:", line):
                assert PINNED.match(line), f"{path.name}: {line.strip()}"


def test_least_privilege_per_job():
    for path in WORKFLOWS:
        assert load(path).get("permissions") == {}, f"{path.name}: workflow default must grant nothing"
    writers = {}
    for wf, name, job in jobs():
        perms = job.get("permissions")
        assert isinstance(perms, dict), f"{wf}/{name}: every job states its permissions"
        for scope, level in perms.items():
            if level == "write":
                writers.setdefault(scope, []).append(name)
        if is_self_hosted(job):
            assert set(perms.values()) <= {"read", "none"}, f"{wf}/{name}: no write token on the GPU runner"
    assert writers == {"contents": ["record"], "pull-requests": ["comment"], "pages": ["pages"],
                       "id-token": ["pages"]}


def test_credentials_persist_only_where_a_job_pushes():
    for wf, name, job in jobs():
        pushes = job.get("permissions", {}).get("contents") == "write"
        for step in steps(job):
            if step.get("uses", "").startswith("actions/checkout@"):
                persist = (step.get("with") or {}).get("persist-credentials", True)
                assert persist is pushes, f"{wf}/{name}: persist-credentials must be {pushes}"
        if is_self_hosted(job):
            assert not pushes


def test_fork_runs_need_an_approved_run_of_the_exact_head_sha():
    triggers = PERF["on"]
    assert "pull_request_target" not in triggers and "workflow_run" not in triggers
    assert "labeled" not in triggers["pull_request"]["types"]  # a label is not an approval of later pushes
    job = PERF["jobs"]["perf"]
    env = job["environment"]["name"]
    assert "perf-fork" in env and "head.repo.full_name != github.repository" in env
    checkout = next(s for s in steps(job) if s.get("uses", "").startswith("actions/checkout@"))
    assert checkout["with"]["ref"] == "${{ env.HEAD_SHA }}"
    assert "github.event.pull_request.head.sha" in job["env"]["HEAD_SHA"]
    assert any('"$(git rev-parse HEAD)" = "$HEAD_SHA"' in s.get("run", "") for s in steps(job))


def test_gpu_job_uses_fresh_per_job_venv_and_caches():
    job = PERF["jobs"]["perf"]
    script = "\n".join(s.get("run", "") for s in steps(job))
    for var in ("HOME", "KDENGINE_CACHE_DIR", "PIP_CACHE_DIR", "TRITON_CACHE_DIR", "KDENGINE_VENV"):
        assert re.search(rf'echo "{var}=\$RUNNER_TEMP/', script), var
    assert "KDENGINE_VENV=none" not in script and "~/.cache" not in script
    assert script.count("python\" -m ci perf") == 1 and "--interleave" not in script
    assert "--confirm-budget" in script and "--base-sha" in script


def test_results_and_report_are_always_uploaded_and_recorded_elsewhere():
    job = PERF["jobs"]["perf"]
    upload = next(s for s in steps(job) if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert upload["if"] == "always()"
    paths = upload["with"]["path"].split()
    assert {"perf-results/", "perf-gate.json", "perf-summary.md"} <= set(paths)
    record = PERF["jobs"]["record"]
    assert record["needs"] == "perf" and "!cancelled()" in record["if"] and not is_self_hosted(record)
    assert any("python -m ci record --from artifact/perf-results --push" in s.get("run", "")
               for s in steps(record))
    assert not any("--force" in s.get("run", "") for _, _, j in jobs() for s in steps(j))


def test_no_expression_is_expanded_inside_a_script():
    for wf, name, job in jobs():
        for step in steps(job):
            assert "${{" not in step.get("run", ""), f"{wf}/{name}: pass values through env, not into run"


@pytest.mark.skipif(not Path(ACTIONLINT).exists(), reason="actionlint not installed (dev extra)")
def test_actionlint_clean():
    proc = subprocess.run([ACTIONLINT], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.skipif(not Path(ZIZMOR).exists(), reason="zizmor not installed (dev extra)")
def test_zizmor_offline_clean():
    proc = subprocess.run([ZIZMOR, "--offline", "--persona=pedantic", ".github/workflows/"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
