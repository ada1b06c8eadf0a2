"""CI check that needs no GPU: compile the kernel translation unit to PTX for sm_120 and sm_90 and
assert that the KV tiles move in 128-bit pieces (16-byte cp.async) and that Q*K^T / P*V run on
tensor cores (mma.sync). The same checker is shown to fail on the scalar-load ablation build."""

from __future__ import annotations

import re

import pytest

from kdengine.ops import build

from .ptx import kernel_bodies, ptxas_spills, unit_ptx

pytestmark = pytest.mark.nvcc

CP_ASYNC = re.compile(r"cp\.async\.(?:ca|cg)\.shared\.global(?:\.\S+)?\s+\[[^\]]+\],\s*\[[^\]]+\],\s*(\d+)")
LD_V4 = re.compile(r"ld\.global(?:\.\w+)*\.(?:v4\.(?:b32|u32|f32|s32)|v2\.(?:b64|u64))")
MMA = re.compile(r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32")


def compile_ptx(arch: str, scalar_loads: bool = False) -> str:
    """PTX of csrc/verify_kernel.cu (torch-free) for one arch."""
    return unit_ptx("verify_kernel.cu", arch, (build.SCALAR_LOADS_MACRO,) if scalar_loads else ())


def split_kernel_bodies(ptx: str) -> str:
    """The PTX of the attention (split) kernel entries only: the merge kernels read the partials
    and would otherwise count as a wide load."""
    return "\n".join(body for name, body in kernel_bodies(ptx).items() if "verify_split_kernel" in name)


def check_vector_loads(ptx: str) -> list[str]:
    """Problems found in the split kernels (empty when their tile loads are all 128-bit and they use
    mma.sync)."""
    ptx = split_kernel_bodies(ptx)
    if not ptx:
        return ["no verify_split_kernel entry in the PTX"]
    problems = []
    widths = [int(w) for w in CP_ASYNC.findall(ptx)]
    wide = sum(w == 16 for w in widths) + len(LD_V4.findall(ptx))
    if wide == 0:
        problems.append("no 128-bit global loads (cp.async 16 bytes or ld.global.v4)")
    narrow = [w for w in widths if w != 16]
    if narrow:
        problems.append(f"{len(narrow)} cp.async copies narrower than 16 bytes (widths {sorted(set(narrow))})")
    if not MMA.search(ptx):
        problems.append("no mma.sync m16n8k16 bf16 instruction")
    return problems


@pytest.mark.parametrize("arch", ["120", "90"])
def test_kv_loads_are_128_bit_and_use_mma(arch):
    ptx = compile_ptx(arch)
    assert check_vector_loads(ptx) == []
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx
    assert "wgmma" not in ptx and "cp.async.bulk" not in ptx  # portable to sm_120


def test_checker_rejects_the_scalar_load_build():
    problems = check_vector_loads(compile_ptx("120", scalar_loads=True))
    assert any("no 128-bit" in p for p in problems)
    assert any("narrower than 16 bytes" in p for p in problems)


# The mma.sync path's default kernel for 64-row blocks: pingpong 12, the lean layout (verify_wide_lean.cuh) that
# csrc/verify_kernel.cu with_config instantiates as WideCfg<4, true, true, 8, true, true, 31 | 32>.
DEFAULT_MMA_64_ROWS = "verify_split_kernel_leanINS_7WideCfgILi4ELb1ELb1ELi8ELb1ELb1ELi63EEE"


@pytest.mark.parametrize("arch", ["120", "90"])
def test_the_default_mma_kernel_keeps_its_state_in_registers(arch):
    """The user's fast path on sm_120 (and the mma.sync path on sm_90): the default 64-row kernel compiles without
    register spills (252-254 of 255 registers today); a change that pushes it over spills to local memory inside the tile
    loop, and this catches it without a GPU. (Not asserted: two lean probes, pingpongs 6 and 10, spill 4 bytes on
    sm_90; the 32-row blocks, T * H <= 32, run wide2pp2 at 128 registers, which spills on both arches.)"""
    from kdengine.ops import cuda_backend

    assert cuda_backend.DEFAULT_PINGPONG == 12 and cuda_backend.DEFAULT_COL_WARPS == cuda_backend.WIDE2, \
        "the default mma.sync layout changed: point DEFAULT_MMA_64_ROWS at its kernel"
    ptx = compile_ptx(arch)
    names = [n for n in kernel_bodies(ptx) if DEFAULT_MMA_64_ROWS in n]
    assert len(names) == 1, names
    assert ptxas_spills(ptx, arch, names) == {names[0]: (0, 0)}
