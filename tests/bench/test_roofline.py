"""Roofline arithmetic and the ceilings cache."""

from __future__ import annotations

import json

import pytest

from kdengine.bench import roofline as rl


def test_bytes_and_flops_of_verify():
    assert rl.verify_bytes(N=65536, T=16, H=8) == 65536 * 576 * 2 + 16 * 8 * 576 * 2 + 16 * 8 * 512 * 2
    assert rl.verify_flops(N=65536, T=16, H=8) == 2 * 16 * 8 * 65536 * 1088
    assert rl.verify_flops(N=1000, T=64, H=8) == 4 * rl.verify_flops(N=1000, T=16, H=8)


def test_floor_takes_the_slower_side_and_percent():
    ceil = rl.Ceilings(copy_bytes_per_s=1e12, matmul_flops_per_s=1e14, machine="m", dtype="bfloat16")
    assert rl.floor_seconds(2e9, 1e12, ceil) == pytest.approx(1e-2)  # bytes: 2 ms < math: 10 ms
    assert rl.floor_seconds(2e10, 1e12, ceil) == pytest.approx(2e-2)
    assert rl.percent_of_floor(4e-2, 2e-2) == pytest.approx(50.0)
    with pytest.raises(ValueError, match="seconds"):
        rl.percent_of_floor(0.0, 1.0)
    # T=16, H=8: ~242 FLOP per byte, above this machine's ridge of 100: compute-bound
    out = rl.verify_roofline(1e-3, N=4096, T=16, H=8, ceil=ceil)
    assert out["bound"] == "compute" and out["roofline_pct"] == pytest.approx(100 * out["flops"] / 1e14 / 1e-3)
    fast_math = rl.Ceilings(copy_bytes_per_s=1e12, matmul_flops_per_s=1e15, machine="m", dtype="bfloat16")
    out = rl.verify_roofline(1e-3, N=4096, T=16, H=8, ceil=fast_math)
    assert out["bound"] == "memory" and out["roofline_pct"] == pytest.approx(100 * out["bytes"] / 1e12 / 1e-3)


def test_ceilings_are_measured_once_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("KDENGINE_CACHE_DIR", str(tmp_path))
    calls = []
    monkeypatch.setattr(rl, "_measure_cpu", lambda: calls.append(1) or (5e9, 7e10))
    first = rl.ceilings("cpu")
    second = rl.ceilings("cpu")
    assert calls == [1] and first == second and first.copy_bytes_per_s == 5e9
    cached = list(tmp_path.glob("ceilings-cpu-*.json"))
    assert len(cached) == 1 and json.loads(cached[0].read_text())["matmul_flops_per_s"] == 7e10
    rl.ceilings("cpu", refresh=True)
    assert calls == [1, 1]
