"""Machine names, nvidia-smi parsing, and the throttled rule."""

from __future__ import annotations

import platform

import pytest

from kdengine.bench import fingerprint as fp


def test_machine_names():
    assert fp.machine_name({"gpu": "NVIDIA H200", "sm_count": 132, "capability": "sm_90"}) == "gpu-nvidia-h200-sm90"
    assert fp.machine_name({"gpu": "NVIDIA RTX PRO 6000 Blackwell", "sm_count": 188, "capability": "sm_120"}) == (
        "gpu-nvidia-rtx-pro-6000-blackwell-sm120")
    assert fp.machine_name({"gpu": "cpu", "sm_count": 0}) == f"cpu-{platform.machine()}"


def test_collect_has_the_recorded_fields():
    info = fp.collect()
    for key in ("torch", "triton", "cuda", "gpu", "sm_count", "commit", "dirty"):
        assert key in info
    assert info["commit"] is None or len(info["commit"]) == 40


def test_a_named_commit_keeps_gits_reading_and_does_not_claim_a_clean_tree():
    info = {"commit": "a" * 40, "dirty": True, "gpu": "cpu"}
    named = fp.named_commit(info, "b" * 40)
    assert named == {"commit": "b" * 40, "dirty": None, "git_head": "a" * 40, "git_dirty": True, "gpu": "cpu"}
    assert info["commit"] == "a" * 40  # the input is not changed


def test_collect_records_the_overrides_that_change_what_is_measured(monkeypatch):
    from kdengine import env

    for name in env.MEASUREMENT_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(env.CACHE_DIR_VAR, "/tmp/kdengine-fp-test")  # where files go: not an override
    assert fp.collect()["overrides"] == ""
    monkeypatch.setenv(env.NSPLIT_VAR, " 32 ")
    monkeypatch.setenv(env.CUDA_PATH_VAR, "mma")
    assert fp.collect()["overrides"] == "KDENGINE_CUDA_PATH=mma,KDENGINE_NSPLIT=32"


def test_gpu_uuid_spelled_as_nvidia_smi_prints_it():
    class Props:
        uuid = "8c7e2f0a-1b2c-4d5e-8f90-123456789abc"

    assert fp.gpu_uuid(Props()) == "GPU-8c7e2f0a-1b2c-4d5e-8f90-123456789abc"
    Props.uuid = "GPU-1234"
    assert fp.gpu_uuid(Props()) == "GPU-1234"
    assert fp.gpu_uuid(object()) is None


def test_parse_nvidia_smi_line():
    state = fp.parse_smi_line("1980, 3201, 45, 120.50, 0x0000000000000024")
    assert state["sm_mhz"] == 1980 and state["mem_mhz"] == 3201 and state["power_w"] == 120.5
    assert state["throttle_reasons"] == ["sw_power_cap", "sw_thermal"]
    with pytest.raises(ValueError, match="nvidia-smi line"):
        fp.parse_smi_line("1980, 3201")


@pytest.mark.parametrize("start, end, expected", [
    ({"sm_mhz": 1980, "throttle_mask": 0}, {"sm_mhz": 1980, "throttle_mask": 0}, False),
    ({"sm_mhz": 1980, "throttle_mask": 0x1}, {"sm_mhz": 1960, "throttle_mask": 0x2}, False),  # idle, app clocks
    ({"sm_mhz": 1980, "throttle_mask": 0}, {"sm_mhz": 1700, "throttle_mask": 0}, True),  # clock fell 14%
    ({"sm_mhz": 1980, "throttle_mask": 0}, {"sm_mhz": 1980, "throttle_mask": 0x40}, True),  # hw thermal
    ({}, {}, False),  # no GPU
])
def test_throttled(start, end, expected):
    assert fp.throttled(start, end) is expected


def test_clocks_empty_without_gpu():
    import torch

    if torch.cuda.is_available():
        assert "source" in fp.clocks()
    else:
        assert fp.clocks() == {}


def test_idle_start_is_not_a_clock_change():
    """A run whose first reading found the GPU idle (clock parked at 345 MHz) is not throttled by
    the clock-change rule; a busy-to-busy drop still is, and a power cap always is."""
    from kdengine.bench.fingerprint import throttled

    idle = {"sm_mhz": 345, "throttle_mask": 0x1}
    busy = {"sm_mhz": 1980, "throttle_mask": 0}
    assert not throttled(idle, busy)
    assert throttled(busy, {"sm_mhz": 1500, "throttle_mask": 0})
    assert throttled(idle, {"sm_mhz": 1980, "throttle_mask": 0x4})


def test_collect_jsonl_rederives_throttled_from_raw_clocks(tmp_path):
    import json

    from kdengine.bench.samples import collect_jsonl

    idle = {"sm_mhz": 345, "throttle_mask": 0x1}
    busy = {"sm_mhz": 1980, "throttle_mask": 0}
    rec = {"name": "decode/x/ctx4096", "unit": "tok/s", "direction": "higher", "median": 1.0, "samples": [1.0],
           "throttled": True, "fingerprint": {"clocks_start": idle, "clocks_end": busy, "throttled": True}}
    capped = dict(rec, name="decode/y/ctx4096", fingerprint={"clocks_start": busy, "clocks_end": {"sm_mhz": 1400, "throttle_mask": 0x4}})
    path = tmp_path / "run.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (rec, capped)) + "\n")
    side = collect_jsonl(path, "a" * 40, "gpu-test")
    assert side["results"]["decode/x/ctx4096"]["throttled"] is False
    assert side["results"]["decode/y/ctx4096"]["throttled"] is True
    assert side["fingerprint"]["throttled"] is True


def test_the_ci_tools_do_not_import_torch():
    """ci record/gate read fingerprints and samples: torch's import (seconds) is paid only where it is used."""
    import subprocess
    import sys

    modules = "ci.gate, ci.record, ci.history, kdengine.bench.fingerprint, kdengine.bench.samples"
    code = f"import sys, {modules}; print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=fp.REPO_ROOT).stdout
    assert out.strip() == "[]"


def test_throttle_fraction_from_the_violation_counters():
    """The capped share of a span: the larger of the power and thermal counters' advance over the time
    between the readings; None without counters or timestamps (older records, nvidia-smi readings)."""
    start = {"t_s": 100.0, "power_violation_ns": 5_000_000_000, "thermal_violation_ns": 0}
    end = {"t_s": 102.0, "power_violation_ns": 5_500_000_000, "thermal_violation_ns": 100_000_000}
    assert fp.throttle_fraction(start, end) == pytest.approx(0.25)
    assert fp.throttle_fraction(start, {**end, "t_s": 100.0}) is None
    assert fp.throttle_fraction({"sm_mhz": 1980}, {"sm_mhz": 1980}) is None
    assert fp.throttle_fraction({"t_s": 1.0}, {"t_s": 2.0}) is None
    clean = {"throttle_mask": 0, "sm_mhz": 1980}
    assert fp.throttled({**start, **clean}, {**end, **clean}) is True  # capped for a quarter of the span
    brief = {**end, "power_violation_ns": start["power_violation_ns"] + 50_000_000, "thermal_violation_ns": 0}
    assert fp.throttle_fraction(start, brief) == pytest.approx(0.025)
    assert fp.throttled({**start, **clean}, {**brief, **clean}) is False  # 2.5%: under VIOLATION_LIMIT
    assert fp.throttled({**clean}, {**clean}) is False  # no counters: the instant reasons only, as before
