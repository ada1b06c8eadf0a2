"""ci.evaluate on a real asv history (tests/ci/data/blas-benchmarks, see its SOURCE.md): structural facts only;
the gate's own figures are not pinned here (the gate is changing)."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest

from ci import evaluate

DATA = Path(__file__).parent / "data" / "blas-benchmarks"
MACHINE = "gha-aws-graviton"


@pytest.fixture(scope="module")
def result():
    return evaluate.evaluate(DATA, MACHINE)


def test_saved_data_is_the_source_values():
    files = sorted((DATA / MACHINE).glob("*-virtualenv-py3.12.json"))
    sources = json.loads((DATA / "SOURCE_files.json").read_text())
    assert {f.name for f in files} == set(sources)
    row = json.loads((DATA / MACHINE / "00bc05f1-virtualenv-py3.12.json").read_text())["results"]
    assert row["benchmarks.Nrm2.time_nrm2"][0][0] == 6.898395748983188e-07  # as published, never rounded
    for f in files:
        for name, r in json.loads(f.read_text())["results"].items():
            assert all(a <= v <= b for v, a, b in zip(r[0], r[4], r[5], strict=True)), (f.name, name)  # median inside its CI


def test_every_pair_judged_by_both(result):
    (m,) = result["machines"]
    assert m["machine"] == MACHINE and m["runs"] == len(list((DATA / MACHINE).glob("*-*.json")))
    assert m["pairs"] == m["runs"] - 1 == len(m["per_pair"])
    assert m["pairs_judged"] == {"gate": m["pairs"], "asv": m["pairs"]}
    # asv gave a mark for every benchmark of every pair (the suite was renamed once: that pair has both sets)
    assert sum(m["asv_marks"].values()) == sum(m["verdicts"].values()) > 0
    vc = m["version_changed_points"]
    assert vc["asv_not_comparable"] == m["asv_marks"].get("x", 0) > 0  # the published versions did change
    assert 0 <= vc["gate_compared_anyway"] <= vc["asv_not_comparable"]
    heads = [p["head"] for p in m["per_pair"]]
    assert len(set(heads)) == len(heads)


def test_counts_consistent(result):
    (m,) = result["machines"]
    t = result["total"]
    for who in ("gate", "asv"):
        assert 0 <= m["pairs_failing"][who] <= m["pairs"]
        assert m["pairs_failing"][who] == sum(1 for p in m["per_pair"] if p[f"{who}_red"])
        assert 0 <= m["flags"][who]["not_persisting"] <= m["flags"][who]["with_next_run"]
        assert m["spikes"][who] <= m["spikes"]["count"]
        assert m["steps"][f"{who}_caught"] <= m["steps"]["count"]
        assert m["steps"][f"{who}_reflagged_steps"] <= m["steps"]["count"]
        assert 0.0 <= t[f"{who}_pairs_failing_share"] <= 1.0
    assert m["timing_s"]["gate_total"] > 0 and m["timing_s"]["asv_total"] > 0


def test_data_oddities_reported(result):
    notes = result["machines"][0]["data_notes"]
    # the published suite renamed Nrm2.time_dnrm2 -> Nrm2.time_nrm2, DDot -> dot, Dgesdd -> gesdd in June 2024
    assert {n["benchmark"] for n in notes["disappeared"]} == {
        "benchmarks.Nrm2.time_dnrm2", "benchmarks.DDot.time_ddot", "benchmarks.Dgesdd.time_dgesdd"}
    assert len(notes["appeared"]) == 3 and notes["old_format_files"] == []
    # the same names changed their version hash (and parameter grid) twice in June 2024
    assert {n["benchmark"] for n in notes["version_changes"]} >= {"benchmarks.DDot.time_ddot"}


def test_asv_decision_comes_from_asv(tmp_path):
    """A head 30% slower with non-overlapping CIs is red for asv (mark '+'), the same head unchanged is not."""
    d = tmp_path / "results"
    shutil.copytree(DATA, d)
    keep = {"0a6ced33-virtualenv-py3.12.json", "03433efb-virtualenv-py3.12.json"}
    for f in (d / MACHINE).glob("*-*.json"):
        if f.name not in keep:
            f.unlink()
    assert evaluate.evaluate(d, MACHINE)["total"]["asv_pairs_failing"] == 0
    head = d / MACHINE / "03433efb-virtualenv-py3.12.json"
    data = json.loads(head.read_text())
    for row in data["results"].values():
        for k in (0, 4, 5):
            row[k] = [v * 1.3 for v in row[k]]
    head.write_text(json.dumps(data))
    out = evaluate.evaluate(d, MACHINE)
    (pair,) = out["machines"][0]["per_pair"]
    assert out["total"]["asv_pairs_failing"] == 1 and len(pair["asv_red"]) == 22


def test_spike_and_step_rules():
    assert evaluate.find_spikes([1, 1, 1.2, 1, 1], 0.05, "lower") == [2]
    assert evaluate.find_spikes([1, 1, 1.2, 1.2, 1.2], 0.05, "lower") == []
    assert evaluate.find_spikes([1, 1, 0.8, 1, 1], 0.05, "higher") == [2]
    assert evaluate.find_steps([1, 1, 1, 1.2, 1.2, 1.2], 0.05, "lower", 3) == [3]
    assert evaluate.find_steps([1, 1, 1, 1.2, 1, 1], 0.05, "lower", 3) == []
    assert evaluate.find_steps([1, 1, 1, 1.2, 1.2, 1.2], 0.05, "lower", 3, list("aaabbb")) == []  # new version
    assert evaluate.find_spikes([1, 1, 1.2, 1, 1], 0.05, "lower", list("aabbb")) == []


def test_cli_writes_strict_json(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    evaluate.add_parser(parser.add_subparsers())
    out = tmp_path / "eval.json"
    args = parser.parse_args(["evaluate", "--results-dir", str(DATA), "--last", "4", "--json", str(out)])
    assert args.func(args) == 0
    text = out.read_text()
    assert "NaN" not in text and "Infinity" not in text
    data = json.loads(text)
    assert data["total"]["pairs"] == 3
    assert "pairs failing" in capsys.readouterr().out
