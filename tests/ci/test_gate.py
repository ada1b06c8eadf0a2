"""The gate on fixtures with known verdicts (tests/ci/fixtures, made by make_fixtures.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from make_fixtures import EXPECTED, MACHINE, sha  # noqa: E402

from ci import gate, history  # noqa: E402
from ci.__main__ import main as ci_main  # noqa: E402

FIX = Path(__file__).parent / "fixtures"


def verdicts(result: dict) -> dict[str, str]:
    return {b["name"]: b["verdict"] for b in result["benchmarks"]}


def test_known_verdicts_time_and_tok_s():
    result = gate.run_gate(str(FIX / "verdicts"), sha("b5"), sha("head"), MACHINE)
    assert verdicts(result) == EXPECTED
    assert result["exit_code"] == 1
    assert sorted(result["regressed"]) == ["decode/cuda/ctx4096", "verify/triton/ctx4096/T16"]
    rows = {b["name"]: b for b in result["benchmarks"]}
    assert rows["decode/cuda/ctx4096"]["direction"] == "higher"  # tok/s: lower value = worse
    assert rows["decode/cuda/ctx4096"]["change"] < 0 < rows["decode/cuda/ctx4096"]["worse"]
    assert rows["verify/triton/ctx4096/T16"]["p_value"] < 0.01


def test_cli_exit_codes_and_outputs(tmp_path):
    out_json, out_md = tmp_path / "g.json", tmp_path / "g.md"
    rc = ci_main(["gate", "--results-dir", str(FIX / "verdicts"), "--base", sha("b5")[:10], "--head",
                  sha("head"), "--json", str(out_json), "--markdown", str(out_md)])
    assert rc == 1
    data = json.loads(out_json.read_text())
    assert data["counts"]["regressed"] == 2 and data["counts"]["missing"] == 1
    md = out_md.read_text()
    assert "| `verify/triton/ctx4096/T16` |" in md and "regressed" in md and "p-value" in md


def test_threshold_override_turns_regression_into_noisy_or_unchanged(tmp_path):
    toml = tmp_path / "t.toml"
    toml.write_text('[defaults]\nthreshold = 0.05\n[thresholds]\n"verify/triton/ctx4096/*" = 0.30\n')
    result = gate.run_gate(str(FIX / "verdicts"), sha("b5"), sha("head"), MACHINE, thresholds=str(toml))
    assert verdicts(result)["verify/triton/ctx4096/T16"] == "unchanged"
    assert verdicts(result)["decode/cuda/ctx4096"] == "regressed"


def test_fingerprint_change_never_compares():
    result = gate.run_gate(str(FIX / "fingerprint"), sha("b2"), sha("head"))
    assert result["exit_code"] == 0
    assert set(verdicts(result).values()) == {"new"}
    assert "driver" in result["machines"][0]["notes"][0]


def test_throttled_base_is_refused():
    result = gate.run_gate(str(FIX / "throttled"), sha("base"), sha("head"))
    note = result["machines"][0]["notes"][0]
    assert "throttled" in note and sha("b2")[:8] in note
    assert "regressed" not in verdicts(result).values() and "improved" not in verdicts(result).values()


def test_history_spread_without_samples():
    result = gate.run_gate(str(FIX / "nosamples"), sha("b11"), sha("head"))
    v = verdicts(result)
    assert v["bench_verify.Verify.time_verify('triton', 4096, 16)"] == "regressed"
    assert sum(x == "regressed" for x in v.values()) == 1


def test_corrupt_file_is_named_exit_2(capsys):
    rc = ci_main(["gate", "--results-dir", str(FIX / "corrupt"), "--base", sha("b0"), "--head", sha("b1")])
    assert rc == 2
    assert f"{sha('b1')[:8]}-existing-py.json" in capsys.readouterr().err


def test_usage_error_exit_2():
    with pytest.raises(SystemExit) as exc:
        ci_main(["gate", "--results-dir", str(FIX / "verdicts")])
    assert exc.value.code == 2
    assert ci_main(["gate", "--results-dir", str(FIX / "verdicts"), "--base", "b5", "--head", "f00"]) == 2


def test_direction_from_unit():
    assert history.direction_for_unit("seconds") == "lower"
    assert history.direction_for_unit("tok/s") == "higher"
    assert gate.worse_fraction(100.0, 90.0, "higher") == pytest.approx(0.1)
    assert gate.worse_fraction(1.0, 1.1, "lower") == pytest.approx(0.1)
