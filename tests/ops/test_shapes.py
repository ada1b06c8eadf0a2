"""The MLA shape contract is written once per language and the two agree: csrc/verify_launch.h is
parsed here (no GPU, no compiler), and no other csrc file spells the constants as literals again. On a
GPU the built binding's exported constants are checked too (kdengine.ops.build does it on every load)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from kdengine.ops import build, shapes

CONSTEXPR = re.compile(r"constexpr\s+int\s+(\w+)\s*=\s*([^;]+);")


def header_constants() -> dict[str, int]:
    """The `constexpr int NAME = EXPR;` lines of csrc/verify_launch.h, evaluated in order."""
    values: dict[str, int] = {}
    text = (build.CSRC / "verify_launch.h").read_text()
    for name, expr in CONSTEXPR.findall(text):
        if not re.fullmatch(r"[\w\s+\-*/()]+", expr):
            raise AssertionError(f"{name}: unexpected expression {expr!r}")
        values[name] = int(eval(expr, {"__builtins__": {}}, dict(values)))  # noqa: S307 - integers and names only
    return values


def test_header_matches_the_python_contract():
    assert {k: v for k, v in header_constants().items() if k in shapes.BINDING_CONSTANTS} == shapes.BINDING_CONSTANTS
    assert shapes.D_QK == 576 and shapes.DV == 512 and shapes.D_ROPE == 64


def test_no_second_definition_in_csrc():
    for path in sorted(build.CSRC.iterdir()):
        if path.name == "verify_launch.h" or path.suffix not in (".h", ".cuh", ".cu", ".cpp"):
            continue
        for name, _ in CONSTEXPR.findall(path.read_text()):
            assert name not in shapes.BINDING_CONSTANTS, f"{path.name} defines {name} again"


def test_python_users_import_the_contract():
    from kdengine.ops import cuda_backend, inputs, validate

    assert inputs.D_QK is shapes.D_QK and validate.D_QK is shapes.D_QK and cuda_backend.DV == shapes.DV
    assert cuda_backend.ROW_GROUPS == shapes.ROW_GROUPS


@pytest.mark.parametrize("R", [1, 16, 17, 32, 33, 64, 65, 128, 512])
def test_row_tiles_mirror_csrc(R):
    m = shapes.ROWS_PER_GROUP * shapes.row_groups(R)
    assert shapes.row_tiles(R) == -(-R // m) and shapes.row_tiles(R, 1) == -(-R // 16)


def test_check_binding_names_each_difference():
    good = SimpleNamespace(**shapes.BINDING_CONSTANTS, row_tiles=shapes.row_tiles)
    shapes.check_binding(good)
    bad = SimpleNamespace(**{**shapes.BINDING_CONSTANTS, "DV": 448}, row_tiles=lambda R, g: 1)
    with pytest.raises(RuntimeError, match=r"DV: Python 512, binding 448.*row_tiles\("):
        shapes.check_binding(bad)
    with pytest.raises(RuntimeError, match="row_tiles: not exported"):
        shapes.check_binding(SimpleNamespace(**shapes.BINDING_CONSTANTS))


@pytest.mark.gpu
def test_built_binding_exports_the_contract():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    module = build.load_extension()  # raises on a mismatch
    assert shapes.binding_differences(module) == []
