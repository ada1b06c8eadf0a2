"""Merge 7's padding (csrc/merge_spread.h, host arithmetic): compiled with the host C++ compiler and checked on the
shared-memory limits of the GPUs the kernels target, over every grid size up to 40 blocks per SM:
the padded block lets exactly k = ceil(blocks / SMs) blocks onto an SM, in the fewest whole 128-byte steps, and
never passes the opt-in maximum; where no step does that, or the limits are unknown, the merge keeps its own bytes."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parents[2] / "csrc"
DRIVER = r"""
#include <cstdio>
#include "merge_spread.h"
int main() {
  kdengine::SmemLimits d;
  long long blocks, own;
  while (std::scanf("%d %d %d %d %lld %lld", &d.sms, &d.per_sm, &d.optin, &d.reserved, &blocks, &own) == 6)
    std::printf("%zu\n", kdengine::merge_spread_smem(d, blocks, static_cast<size_t>(own)));
}
"""
# (SMs, bytes per SM, opt-in maximum per block, reserved per block): H200 (sm_90), RTX PRO 6000 Blackwell (sm_120,
# 188 SMs) and a 170-SM part of the same family, A100 (sm_80), an sm_89 part
LIMITS = {"sm_90": (132, 233472, 232448, 1024), "sm_120": (188, 102400, 101376, 1024),
          "sm_120_170": (170, 102400, 101376, 1024), "sm_80": (108, 167936, 166912, 1024),
          "sm_89": (128, 102400, 101376, 1024)}
OWNS = (1152, 2304, 4608, 9216, 16896)  # the grouped merge's own bytes at 1, 2, 4, 8, 16 warp groups (sizes of note)


@pytest.fixture(scope="module")
def padding(tmp_path_factory):
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("needs a host C++ compiler")
    work = tmp_path_factory.mktemp("merge_spread")
    (work / "driver.cpp").write_text(DRIVER)
    exe = work / "driver"
    subprocess.run([cxx, "-std=c++17", "-O1", "-I", str(CSRC), str(work / "driver.cpp"), "-o", str(exe)], check=True,
                   capture_output=True, text=True, timeout=120)

    def run(cases):
        text = "".join(" ".join(str(v) for v in case) + "\n" for case in cases)
        out = subprocess.run([str(exe)], input=text, capture_output=True, text=True, check=True, timeout=120).stdout
        return [int(x) for x in out.split()]

    return run


@pytest.mark.parametrize("gpu", sorted(LIMITS))
def test_the_padding_lets_exactly_k_blocks_onto_an_sm(padding, gpu):
    sms, per_sm, optin, reserved = LIMITS[gpu]
    cases = [(sms, per_sm, optin, reserved, blocks, own) for own in OWNS for blocks in range(1, 40 * sms + 1)]
    padded = 0
    for (*_, blocks, own), smem in zip(cases, padding(cases), strict=True):
        k = -(-blocks // sms)
        assert own <= smem <= max(own, optin), (gpu, blocks, own, smem)
        fits = lambda s: per_sm // (s + reserved)  # blocks of s bytes (+ reserved) on one SM
        if smem == own:
            # unpadded only where own already caps an SM at k, or where no whole step fits k but not k + 1
            step = -(-(per_sm // (k + 1) + 1 - reserved) // 128) * 128
            assert fits(own) <= k or step <= own or step > optin or fits(step) < k, (gpu, blocks, own)
            continue
        padded += 1
        assert smem % 128 == 0 and fits(smem) == k, (gpu, blocks, own, smem, fits(smem))
        assert fits(smem - 128) > k or smem - 128 <= own, (gpu, blocks, own, smem)  # the fewest steps
    assert padded > 0


def test_unknown_limits_and_empty_grids_keep_the_merges_own_bytes(padding):
    cases = [(0, 0, 0, 0, 256, 4608), (132, 0, 232448, 1024, 256, 4608), (132, 233472, 0, 1024, 256, 4608),
             (132, 233472, 232448, 1024, 0, 4608)]
    assert padding(cases) == [4608] * 4
    # the case found by review: 170 SMs of 100 KB, k = 23, own 1152: 23 blocks, not 22
    sms, per_sm, optin, reserved = LIMITS["sm_120_170"]
    (smem,) = padding([(sms, per_sm, optin, reserved, 23 * sms, 1152)])
    assert per_sm // (smem + reserved) == 23
