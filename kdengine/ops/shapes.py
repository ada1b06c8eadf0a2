"""The MLA shape contract, written once for Python: csrc/verify_launch.h holds the same constants for
C++, the CUDA binding exports them and kdengine.ops.build checks them on load (check_binding), and
tests/ops/test_shapes.py parses the header so CI catches drift without a GPU.

    D_QK = DV + D_ROPE     a latent KV row: 512 latent dims (also V) + 64 rope dims
    PAGE_SIZE              tokens per KV page by default (the kernels take any power of two)
    ROWS_PER_GROUP         query rows per m16 tensor-core tile; a block holds 1, 2 or 4 such groups
"""

from __future__ import annotations

DV = 512  # latent dims; V is the first DV dims of a KV row
D_ROPE = 64  # rope dims appended to the latent
D_QK = DV + D_ROPE  # 576: the dims of q and of a KV row
PAGE_SIZE = 64  # default tokens per KV page
ROWS_PER_GROUP = 16  # query rows (row = t * H + head) per m16 group
ROW_GROUPS = (1, 2, 4)  # groups of 16 rows a split-kernel block may hold
MAX_ROW_GROUPS = max(ROW_GROUPS)
# pingpong values of the mma.sync split kernel: 0 .. NUM_PINGPONGS - 1 (kdengine.ops.cuda_backend.PINGPONGS; csrc
# verify_launch.h holds the same count and the binding rejects others)
NUM_PINGPONGS = 16

# Constants the binding exports (module attribute name -> the value here).
BINDING_CONSTANTS = {"D_QK": D_QK, "DV": DV, "D_ROPE": D_ROPE, "ROWS_PER_GROUP": ROWS_PER_GROUP,
                     "MAX_ROW_GROUPS": MAX_ROW_GROUPS, "NUM_PINGPONGS": NUM_PINGPONGS}


def row_groups(R: int, max_row_groups: int = MAX_ROW_GROUPS) -> int:
    """16-row groups per block for R = T * H rows (mirrors csrc row_groups)."""
    needed = 1 if R <= ROWS_PER_GROUP else (2 if R <= 2 * ROWS_PER_GROUP else 4)
    return min(needed, max_row_groups)


def row_tiles(R: int, max_row_groups: int = MAX_ROW_GROUPS) -> int:
    """Row tiles (blocks per split and sequence) for R rows (mirrors csrc row_tiles)."""
    rows = ROWS_PER_GROUP * row_groups(R, max_row_groups)
    return -(-R // rows)


def binding_differences(module) -> list[str]:
    """Where the compiled binding disagrees with this module (empty when it agrees): each exported
    constant, and row_tiles over the row counts the kernels see."""
    problems = []
    for name, value in BINDING_CONSTANTS.items():
        got = getattr(module, name, None)
        if got != value:
            problems.append(f"{name}: Python {value}, binding {got}")
    if hasattr(module, "row_tiles"):
        for R in (1, 8, 16, 17, 32, 33, 64, 128, 512, 2048):
            for g in ROW_GROUPS:
                if module.row_tiles(R, g) != row_tiles(R, g):
                    problems.append(f"row_tiles({R}, {g}): Python {row_tiles(R, g)}, binding {module.row_tiles(R, g)}")
    else:
        problems.append("row_tiles: not exported by the binding")
    return problems


def check_binding(module) -> None:
    """Raise RuntimeError when the CUDA binding's shape constants differ from this module's."""
    problems = binding_differences(module)
    if problems:
        raise RuntimeError("csrc and kdengine.ops.shapes disagree on the MLA shape contract: " + "; ".join(problems))
