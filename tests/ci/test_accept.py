"""Intended trades (ci/accept.py): a `Perf-Accepted:` trailer in a commit being judged turns that benchmark's
slowdown, within the named bound, from "regressed" into "accepted"; everything else about the verdict stays.
Each test builds a real git repository and an asv history whose head is slower on one benchmark."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import asvdata  # noqa: E402
from make_fixtures import MACHINE  # noqa: E402

from ci import accept, gate, report  # noqa: E402
from ci.__main__ import main as ci_main  # noqa: E402

W = "verify/cuda/ctx4096/T16"  # the benchmark the head slows down
OTHER = "verify/triton/ctx4096/T16"  # unchanged


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def commit(repo: Path, message: str) -> str:
    git(repo, "commit", "-q", "--allow-empty", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def history(tmp_path: Path, head_message: str, slowdown: float = 1.04, older_message: str = "c0",
            mid_message: str = "c5") -> tuple:
    """A repository of 7 commits (the first with older_message, the sixth with mid_message, the last with head_message)
    and their results: 6 runs at one level, the head `slowdown` times slower on W. Returns (repo, results, shas)."""
    repo, results = tmp_path / "repo", tmp_path / "results"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "ci@example.com")
    git(repo, "config", "user.name", "ci")
    messages = {0: older_message, 5: mid_message, 6: head_message}
    shas = [commit(repo, messages.get(i, f"c{i}")) for i in range(7)]
    asvdata.write_benchmarks(results)
    rng = np.random.default_rng(3)
    for i, sha in enumerate(shas):
        level = slowdown if i == len(shas) - 1 else 1.0
        run = lambda f: list(1e-4 * f * (1 + 0.002 * rng.standard_normal()) * (1 + 0.001 * rng.standard_normal(20)))
        asvdata.write_run(results, MACHINE, sha, 1_000 + i, {W: run(level), OTHER: run(1.0)})
    return repo, results, shas


def rows(result: dict) -> dict[str, dict]:
    return {b["name"]: b for b in result["benchmarks"]}


def test_without_a_trailer_the_slowdown_is_red(tmp_path):
    repo, results, shas = history(tmp_path, "slower on purpose, but not said")
    result = gate.run_gate(str(results), shas[-2], shas[-1], MACHINE, repo=str(repo))
    assert rows(result)[W]["verdict"] == "regressed" and result["exit_code"] == 1
    assert "accepted" not in result


def test_a_named_trade_within_its_bound_is_accepted_and_green(tmp_path):
    msg = f"merge 7\n\nfaster elsewhere\n\nPerf-Accepted: {W} 6% merge 7 is faster at the other sizes"
    repo, results, shas = history(tmp_path, msg)
    result = gate.run_gate(str(results), shas[-2], shas[-1], MACHINE, repo=str(repo))
    row = rows(result)[W]
    assert row["verdict"] == "accepted" and result["exit_code"] == 0 and result["regressed"] == []
    assert row["acceptance"] == {"commit": shas[-1], "name": W, "bound": 0.06,
                                 "reason": "merge 7 is faster at the other sizes"}
    assert "intended trade" in row["reason"] and "+4." in row["reason"]  # the measured change is still said
    assert rows(result)[OTHER]["verdict"] == "unchanged" and result["counts"]["accepted"] == 1
    md = report.render_markdown(result)
    assert "accepted as intended" in md and "☑️ accepted" in md and "no regression" in md
    # the CLI reads the trailers from --repo: exit 0; without --repo nothing is accepted: exit 1
    base = ["gate", "--results-dir", str(results), "--base", shas[-2], "--head", shas[-1]]
    assert ci_main([*base, "--repo", str(repo)]) == 0
    assert ci_main(base) == 1


def test_a_trade_past_its_bound_stays_red_and_names_the_bound(tmp_path):
    repo, results, shas = history(tmp_path, f"trade\n\nPerf-Accepted: {W} 2% a smaller trade than it is")
    result = gate.run_gate(str(results), shas[-2], shas[-1], MACHINE, repo=str(repo))
    row = rows(result)[W]
    assert row["verdict"] == "regressed" and result["exit_code"] == 1
    assert "past the accepted bound" in row["reason"] and "up to 2.0%" in row["reason"]


def test_the_confirmed_figure_is_held_to_the_bound():
    """`ci perf` applies acceptances after its rounds: the confirmed slowdown decides, not the first pass."""
    acc = [{"commit": "ab" * 20, "name": W, "bound": 0.03, "reason": "r"}]

    def result_with(first: float, confirmed: float | None, verdict: str = "regressed") -> dict:
        row = {"name": W, "verdict": verdict, "worse": first, "threshold": 0.01, "reason": "x"}
        if confirmed is not None:
            row["confirmation"] = {"rounds": 4, "worse": confirmed, "first_pass": "regressed"}
        return gate.summarize("a" * 40, "b" * 40, [{"machine": MACHINE, "notes": [], "benchmarks": [row]}], acc)

    assert result_with(0.05, 0.025)["benchmarks"][0]["verdict"] == "accepted"  # first pass past, confirmed within
    assert result_with(0.02, 0.045)["exit_code"] == 1  # first pass within, confirmed past
    unsettled = result_with(0.02, 0.02, verdict="noisy")  # past the floor after every round: amber without it
    assert unsettled["benchmarks"][0]["verdict"] == "accepted" and unsettled["exit_code"] == 0
    improved = gate.summarize("a" * 40, "b" * 40, [{"machine": MACHINE, "notes": [], "benchmarks": [
        {"name": W, "verdict": "improved", "worse": -0.05, "reason": "x"}]}], acc)
    assert improved["benchmarks"][0]["verdict"] == "improved"  # only slowdowns are accepted
    assert any("no slowdown of it needed accepting" in n for n in improved["accept_notes"])


def test_an_undecided_or_missing_row_is_not_called_a_row_that_needed_no_acceptance():
    """A confirmation cut short leaves a first-pass slowdown "noisy" with no rounds (the H200 stop check,
    perf_history/gate/gpu_stop_fff7dcd/): the trailer's note must not say that no slowdown needed accepting."""
    acc = [{"commit": "ab" * 20, "name": W, "bound": 0.1, "reason": "r"},
           {"commit": "ab" * 20, "name": "verify/cuda/ctx1/T1", "bound": 0.1, "reason": "r"}]
    row = {"name": W, "verdict": "noisy", "worse": 0.044, "threshold": 0.01, "reason": "not measured again"}
    out = gate.summarize("a" * 40, "b" * 40, [{"machine": MACHINE, "notes": [], "benchmarks": [row]}], acc)
    assert out["benchmarks"][0]["verdict"] == "noisy" and out["exit_code"] == 0
    first, second = out["accept_notes"]
    assert "undecided here (noisy)" in first and "needed accepting" not in first
    assert second.endswith("not measured here")


def test_two_trailers_for_one_benchmark_the_widest_decides_and_the_other_is_named_as_such():
    acc = [{"commit": "ab" * 20, "name": W, "bound": 0.03, "reason": "narrow"},
           {"commit": "cd" * 20, "name": W, "bound": 0.06, "reason": "wide"}]
    row = {"name": W, "verdict": "regressed", "worse": 0.05, "threshold": 0.01, "reason": "x"}
    out = gate.summarize("a" * 40, "b" * 40, [{"machine": MACHINE, "notes": [], "benchmarks": [row]}], acc)
    assert out["benchmarks"][0]["verdict"] == "accepted" and out["benchmarks"][0]["acceptance"]["commit"] == "cd" * 20
    assert out["accept_notes"] == [f"{accept.TRAILER} in {'ab' * 5} for {W} (up to 3.0%): the wider bound in "
                                   f"{'cd' * 5} (up to 6.0%) decided"]


@pytest.mark.parametrize("bounds", [(0.02, 0.10), (0.10, 0.02), (0.06, 0.06)])
def test_two_trailers_of_one_commit_for_one_benchmark_each_shown(bounds):
    """One commit naming a benchmark twice (the H200 gate check of perf_history/gate/gpu_accept_621ee6a/): the other
    trailer's note names the bound that decided; keyed by (commit, name) it had no note at all."""
    acc = [{"commit": "ab" * 20, "name": W, "bound": b, "reason": f"r{k}"} for k, b in enumerate(bounds)]
    row = {"name": W, "verdict": "regressed", "worse": 0.05, "threshold": 0.01, "reason": "x"}
    out = gate.summarize("a" * 40, "b" * 40, [{"machine": MACHINE, "notes": [], "benchmarks": [row]}], acc)
    top = max(bounds)
    assert out["benchmarks"][0]["acceptance"]["bound"] == top
    assert out["benchmarks"][0]["verdict"] == ("accepted" if top >= 0.05 else "regressed")
    which = "the wider bound" if min(bounds) < top else "the same bound, named again"
    assert out["accept_notes"] == [f"{accept.TRAILER} in {'ab' * 5} for {W} (up to {min(bounds):.1%}): {which} in "
                                   f"{'ab' * 5} (up to {top:.1%}) decided"]


def test_a_trailer_of_an_older_commit_does_not_carry_over(tmp_path):
    """Accepted at the commit that made the trade, never for a later commit's own slowdown."""
    repo, results, shas = history(tmp_path, "an unrelated slowdown", older_message=f"old\n\nPerf-Accepted: {W} 9% old")
    result = gate.run_gate(str(results), shas[-2], shas[-1], MACHINE, repo=str(repo))
    assert rows(result)[W]["verdict"] == "regressed" and result["exit_code"] == 1


def test_every_commit_between_base_and_head_counts(tmp_path):
    """A pull request judged against its base: the trade may sit in any of its commits, not only the last."""
    repo, results, shas = history(tmp_path, "the PR's last commit", mid_message=f"the trade\n\nPerf-Accepted: {W} 6% r")
    result = gate.run_gate(str(results), shas[-3], shas[-1], MACHINE, repo=str(repo))  # base..head: 2 commits
    assert rows(result)[W]["verdict"] == "accepted" and rows(result)[W]["acceptance"]["commit"] == shas[-2]
    result = gate.run_gate(str(results), shas[-2], shas[-1], MACHINE, repo=str(repo))  # the trade is in the base
    assert rows(result)[W]["verdict"] == "regressed"


@pytest.mark.parametrize("value, why", [
    (f"{W} a reason but no bound", "expected '<benchmark> <bound>% <reason>'"),
    (f"{W} 6%", "expected '<benchmark> <bound>% <reason>'"),  # no reason
    (f"{W} 50% far past the cap", "at most 10%"),
    (f"{W} 0% nothing", "more than 0%"),
    ("verify/<script>alert(1)</script>/ctx1/T1 3% hostile", "not allowed"),
    ("verify/cuda/* 3% a pattern", "not allowed"),
    (f"{W} 3% looks fine \u202egnirts desrever", "printable characters"),  # a bidi override in the reason
])
def test_a_malformed_trailer_accepts_nothing_and_says_why(tmp_path, value, why):
    repo, results, shas = history(tmp_path, f"trade\n\nPerf-Accepted: {value}")
    result = gate.run_gate(str(results), shas[-2], shas[-1], MACHINE, repo=str(repo))
    assert rows(result)[W]["verdict"] == "regressed" and result["exit_code"] == 1
    assert "accepted" not in result
    (note,) = result["accept_notes"]
    assert note.startswith(f"Perf-Accepted in {shas[-1][:10]} accepts nothing") and why in note
    md = report.render_markdown(result)
    assert "<script>" not in md and "accepts nothing" in md


def test_the_reason_is_escaped_in_every_report(tmp_path):
    reason = "see [here](https://evil.example) <img src=x onerror=alert(1)> @maintainer #12 `x` | y"
    repo, results, shas = history(tmp_path, f"trade\n\nPerf-Accepted: {W} 6% {reason}")
    result = gate.run_gate(str(results), shas[-2], shas[-1], MACHINE, repo=str(repo))
    assert rows(result)[W]["verdict"] == "accepted"
    md = report.render_markdown(result)
    assert "<img" not in md and "](https" not in md and "@maintainer" not in md and "#12" not in md
    html = report.render_html(result)
    assert "<img" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html


def test_no_base_or_an_a_a_pair_reads_no_trailers(tmp_path):
    repo, _, shas = history(tmp_path, f"trade\n\nPerf-Accepted: {W} 6% r")
    assert accept.read(str(repo), None, shas[-1]) == ([], [])
    assert accept.read(str(repo), shas[-1], shas[-1]) == ([], [])
    found, notes = accept.read(str(repo), shas[-2], shas[-1])
    assert [a.name for a in found] == [W] and notes == []
    found, notes = accept.read(str(tmp_path / "not-a-repo"), shas[-2], shas[-1])
    assert found == [] and "nothing is accepted" in notes[0]


def test_the_cap_comes_from_the_thresholds_file(tmp_path):
    cfg = tmp_path / "t.toml"
    cfg.write_text("[defaults]\nmax_accept = 0.2\n")
    repo, results, shas = history(tmp_path, f"trade\n\nPerf-Accepted: {W} 15% a big trade", slowdown=1.12)
    result = gate.run_gate(str(results), shas[-2], shas[-1], MACHINE, thresholds=str(cfg), repo=str(repo))
    assert rows(result)[W]["verdict"] == "accepted"
    assert rows(gate.run_gate(str(results), shas[-2], shas[-1], MACHINE, repo=str(repo)))[W]["verdict"] == "regressed"


@pytest.mark.parametrize("cap", ["0", "-0.1", "11", "nan"])
def test_a_cap_out_of_range_is_a_data_error(tmp_path, cap):
    cfg = tmp_path / "t.toml"
    cfg.write_text(f"[defaults]\nmax_accept = {cap}\n")
    with pytest.raises(gate.DataError, match="max_accept"):
        gate.load_thresholds(cfg)
