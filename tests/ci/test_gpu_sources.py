"""The device-run sources under ci/gpu that are not csrc: they compile with this toolchain (nvcc on the CPU machines), so
a device session does not find them broken, and their PTX holds the operations their numbers are about."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


@pytest.mark.nvcc
def test_stream_floor_compiles_for_sm90a_with_the_kernels_tma_ring():
    ptx = subprocess.run(["nvcc", "-ptx", "-std=c++17", "-O3", "-arch=sm_90a", "-I", str(ROOT / "csrc"), "-o", "-",
                          str(ROOT / "ci/gpu/stream_floor.cu")], capture_output=True, text=True, check=True,
                         timeout=300).stdout
    entries = {e.split("(")[0].split()[-1]: e for e in re.split(r"(?=\.entry )", ptx)[1:]}
    stream = next(body for name, body in entries.items() if "stream_kernel" in name)
    # the pages as the sm90 kernel loads them (2-D TMA boxes counted on mbarriers), the prefetch it tries, the waits
    for op in ("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes",
               "cp.async.bulk.prefetch.tensor.2d.L2.global", "mbarrier.try_wait.parity", "mbarrier.arrive.expect_tx"):
        assert op in stream, op
    assert "%globaltimer" in ptx and "%clock64" in stream  # the calibration's step and the hold's clock


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_90a", "sm_120", "sm_80"])
def test_mma_peak_compiles_with_the_kernels_mma_and_ldmatrix(arch):
    ptx = subprocess.run(["nvcc", "-ptx", "-std=c++17", "-O3", f"-arch={arch}", "-I", str(ROOT / "csrc"), "-o", "-",
                          str(ROOT / "ci/gpu/mma_peak.cu")], capture_output=True, text=True, check=True,
                         timeout=300).stdout
    entries = {e.split("(")[0].split()[-1]: e for e in re.split(r"(?=\.entry )", ptx)[1:]}
    loops = {name: body for name, body in entries.items() if "mma_loop" in name}
    assert len(loops) == 6  # chains 1 / 2 / 4 / 8 from registers, 8 fed every 4 and every 2 mma
    fed = 0
    for body in loops.values():
        assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in body  # the mma.sync path's instruction
        fed += "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in body
    assert fed == 2  # only the fed lines read B from shared memory
