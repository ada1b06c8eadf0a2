"""JSONL records -> sidecar dict -> atomic, exclusive sidecar file of one run (perf_history/README.md schema 2)."""

from __future__ import annotations

import json

import pytest

from kdengine.bench import samples as S


def record(name, median, run="r", throttled=False, clocks=None):
    fp = {"gpu": "cpu", "commit": "abc", "clocks_start": clocks or {}, "clocks_end": clocks or {}}
    return S.make_record(name=name, unit="seconds", direction="lower", median=median, samples=[median, median * 1.1],
                         throttled=throttled, fingerprint=fp, asv_name="bench_verify.Verify.track_time",
                         asv_params=["'triton'", "65536", "16"], extra={"nsplit": 64}, run=run)


def test_collect_and_write_sidecar(tmp_path):
    jsonl = tmp_path / "s.jsonl"
    S.append_record(record("verify/triton/ctx65536/T16", 3e-5, clocks={"sm_mhz": 1980}), jsonl)
    S.append_record(record("verify/cuda/ctx65536/T16", 2e-5, throttled=True), jsonl)
    S.append_record(record("verify/triton/ctx65536/T16", 4e-5), jsonl)  # the last one wins
    data = S.collect_jsonl(jsonl, "f" * 40, "cpu-x86_64", env="existing-py")
    assert data["schema"] == 2 and data["commit"] == "f" * 40 and data["machine"] == "cpu-x86_64"
    assert S.RUN_ID.match(data["run_id"]) and data["env"] == "existing-py"
    assert list(data["results"]) == ["verify/cuda/ctx65536/T16", "verify/triton/ctx65536/T16"]
    entry = data["results"]["verify/triton/ctx65536/T16"]
    assert set(entry) == set(S.RESULT_FIELDS) and entry["median"] == 4e-5 and entry["direction"] == "lower"
    assert data["fingerprint"]["throttled"] is True and data["fingerprint"]["clocks_start"] == {"sm_mhz": 1980}
    path = S.write_sidecar(data, tmp_path / "perf_history")
    assert path == tmp_path / "perf_history" / "samples" / "cpu-x86_64" / f"{'f' * 40}-{data['run_id']}.json"
    assert json.loads(path.read_text()) == data
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left behind
    with pytest.raises(ValueError, match="already written"):  # one run is written once, never replaced
        S.write_sidecar(data, tmp_path / "perf_history")
    again = S.collect_jsonl(jsonl, "f" * 40, "cpu-x86_64", env="existing-py")  # a rerun: its own file
    assert again["run_id"] != data["run_id"]
    S.write_sidecar(again, tmp_path / "perf_history")
    assert len(list(path.parent.iterdir())) == 2


def test_find_record_by_run(tmp_path):
    jsonl = tmp_path / "s.jsonl"
    S.append_record(record("a", 1.0, run="one"), jsonl)
    S.append_record(record("a", 2.0, run="two"), jsonl)
    assert S.find_record("a", "one", jsonl)["median"] == 1.0
    assert S.find_record("a", "three", jsonl) is None
    assert S.find_record("a", "one", tmp_path / "absent.jsonl") is None


def test_bad_input_names_the_argument(tmp_path):
    with pytest.raises(ValueError, match="direction"):
        S.make_record(name="a", unit="s", direction="up", median=1, samples=[1], throttled=False, fingerprint={})
    with pytest.raises(ValueError, match="unknown unit 's'"):
        S.make_record(name="a", unit="s", direction="lower", median=1, samples=[1], throttled=False, fingerprint={})
    with pytest.raises(ValueError, match="samples"):
        S.make_record(name="a", unit="seconds", direction="lower", median=1, samples=[], throttled=False,
                      fingerprint={})
    for bad in (float("nan"), float("inf"), 0.0, -1.0):
        with pytest.raises(ValueError, match="record a"):
            S.make_record(name="a", unit="seconds", direction="lower", median=1, samples=[1, bad],
                          throttled=False, fingerprint={})
    with pytest.raises(ValueError, match="commit"):
        S.collect_jsonl(tmp_path / "x.jsonl", "", "cpu-x86_64")
    with pytest.raises(ValueError, match="data"):
        S.write_sidecar({"schema": 1}, tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"name": "a"}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        S.read_jsonl(bad)


def test_append_is_a_no_op_without_a_path(monkeypatch):
    monkeypatch.delenv("KDENGINE_SAMPLES_OUT", raising=False)
    assert S.append_record(record("a", 1.0)) is None


def test_run_to_run_spread(tmp_path):
    one, two = tmp_path / "1.jsonl", tmp_path / "2.jsonl"
    S.append_record(record("a", 10.0), one)
    S.append_record(record("only-in-one", 1.0), one)
    S.append_record(record("a", 11.0), two)
    spread = S.run_to_run_spread(one, two)
    assert list(spread) == ["a"]
    assert spread["a"]["rel_diff"] == pytest.approx(0.1) and spread["a"]["unit"] == "seconds"
    assert spread["a"]["rel_iqr_1"] > 0


HOSTILE_NAME = "verify/<script>/ctx1/T1"


def test_hostile_names_are_refused_where_records_are_made(tmp_path):
    with pytest.raises(ValueError, match=r"^name: .*'<>'"):
        record(HOSTILE_NAME, 1.0)
    jsonl = tmp_path / "s.jsonl"
    S.append_record(record("verify/triton/ctx65536/T16", 1.0), jsonl)
    for machine in (HOSTILE_NAME, "gpu/../escape", ".hidden", "", None):
        with pytest.raises(ValueError, match=r"^machine: "):
            S.collect_jsonl(jsonl, "f" * 40, machine)

