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
    cached = list(tmp_path.glob(f"ceilings-{rl._CACHE_VERSION}-cpu-*.json"))
    assert len(cached) == 1 and json.loads(cached[0].read_text())["matmul_flops_per_s"] == 7e10
    rl.ceilings("cpu", refresh=True)
    assert calls == [1, 1]


def test_a_ceiling_measured_another_way_is_measured_again(tmp_path, monkeypatch):
    """Caches of the one-way / graph-captured copy ceiling (no method, or an older one) are not reused."""
    monkeypatch.setenv("KDENGINE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(rl, "_measure_cpu", lambda: (4.2e12, 7.5e14))
    path = rl._cache_path(rl.fingerprint.machine_name({"gpu": "cpu"}))
    path.write_text(json.dumps({"copy_bytes_per_s": 2.7e12, "matmul_flops_per_s": 8e14, "machine": "m",
                                "dtype": "float32", "method": "v1"}))
    assert rl.ceilings("cpu").copy_bytes_per_s == 4.2e12
    assert json.loads(path.read_text())["method"] == rl.COPY_METHOD


def test_issue_floor_at_65k():
    """DESIGN: at 65k on the H200 (4.18 TB/s counted read + write, 750 TF/s) the floor is 24 us at
    T=16 and 97 us at T=64, both compute-bound; the bytes alone take 18 us."""
    h200 = rl.Ceilings(copy_bytes_per_s=4.18e12, matmul_flops_per_s=7.5e14, machine="m", dtype="bfloat16")
    assert rl.verify_floor(N=65536, T=16, H=8, ceil=h200) == pytest.approx(24.3e-6, rel=0.01)
    assert rl.verify_floor(N=65536, T=64, H=8, ceil=h200) == pytest.approx(97.4e-6, rel=0.01)
    assert rl.verify_bytes(N=65536, T=16, H=8) / h200.copy_bytes_per_s == pytest.approx(18.1e-6, rel=0.01)
