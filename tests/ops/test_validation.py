"""Every bad input raises ValueError naming the argument, with expected and actual values."""

from __future__ import annotations

import pytest
import torch

from kdengine.ops import pack_tree_mask, verify_attention
from kdengine.ops.inputs import make_verify_inputs


@pytest.fixture
def inp():
    return make_verify_inputs(B=2, T=5, H=2, prefix=[10, 70], page_size=16, seed=1)


def call(inp, **over):
    args = dict(
        q=inp.q, kv_cache=inp.kv_cache, page_table=inp.page_table, prefix_len=inp.prefix_len,
        tree_mask=inp.tree_mask,
    )
    kw = dict(sm_scale=inp.sm_scale, backend="reference")
    for k, v in over.items():
        (args if k in args else kw)[k] = v
    return verify_attention(**args, **kw)


def expect(match, inp, **over):
    with pytest.raises(ValueError, match=match):
        call(inp, **over)


def test_wrong_dtypes(inp):
    expect(r"^q: expected dtype torch.bfloat16, got torch.float32", inp, q=inp.q.float())
    expect(r"^kv_cache: expected dtype torch.bfloat16", inp, kv_cache=inp.kv_cache.half())
    expect(r"^page_table: expected dtype torch.int32, got torch.int64", inp, page_table=inp.page_table.long())
    expect(r"^prefix_len: expected dtype torch.int32", inp, prefix_len=inp.prefix_len.long())
    expect(r"^tree_mask: expected dtype", inp, tree_mask=inp.tree_mask.float())


def test_wrong_shapes(inp):
    expect(r"^q: expected a rank-4 tensor", inp, q=inp.q[0])
    expect(r"^q: expected last dim 576", inp, q=inp.q[..., :512].contiguous())
    expect(r"^kv_cache: expected a rank-3", inp, kv_cache=inp.kv_cache[0])
    expect(r"^page_table: expected 2 rows", inp, page_table=inp.page_table[:1].contiguous())
    expect(r"^prefix_len: expected shape \[2\]", inp, prefix_len=inp.prefix_len[:1].contiguous())
    expect(r"^tree_mask: expected bool shape \[2, 5, 5\]", inp, tree_mask=inp.tree_mask[:, :4, :4].contiguous())
    expect(r"^tree_mask: expected packed int32 shape \[2, 5, 1\]", inp, tree_mask=torch.zeros(2, 5, 2, dtype=torch.int32))


def test_page_size_must_be_power_of_two_in_range(inp):
    kv = torch.randn(8, 24, 576).bfloat16()
    expect(r"^kv_cache: expected page_size .* got 24", inp, kv_cache=kv)


def test_T_bounds():
    big = make_verify_inputs(T=257, H=1, prefix=0, seed=0)
    with pytest.raises(ValueError, match=r"^q: expected T \(dim 1\) in \[1, 256\], got 257"):
        verify_attention(*big.args(), sm_scale=big.sm_scale, backend="reference")
    inp = make_verify_inputs(T=1, H=1, prefix=3, seed=0)
    with pytest.raises(ValueError, match=r"got 0"):
        verify_attention(inp.q[:, :0], *inp.args()[1:], sm_scale=1.0, backend="reference")


def test_non_contiguous(inp):
    q = inp.q.transpose(1, 2).contiguous().transpose(1, 2)
    expect(r"^q: expected a contiguous tensor", inp, q=q)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device type")
def test_mismatched_devices(inp):
    expect(r"^kv_cache: expected device", inp, q=inp.q.cuda())


def test_mismatched_devices_meta(inp):
    expect(r"^kv_cache: expected device meta", inp, q=torch.empty(inp.q.shape, dtype=inp.q.dtype, device="meta"))


def test_prefix_beyond_pages(inp):
    capacity = inp.page_table.shape[1] * inp.kv_cache.shape[1]
    lens = torch.tensor([10, capacity - 4], dtype=torch.int32)
    expect(r"^prefix_len: expected prefix_len \+ T <= max_pages \* page_size", inp, prefix_len=lens)
    expect(r"^prefix_len: expected values >= 0", inp, prefix_len=torch.tensor([-1, 3], dtype=torch.int32))


def test_page_id_outside_pool(inp):
    pt = inp.page_table.clone()
    pt[1, 2] = inp.kv_cache.shape[0]
    expect(r"^page_table: expected page ids in \[0, \d+\) .* page_table\[1, 2\]", inp, page_table=pt)
    pt[1, 2] = -1
    expect(r"^page_table: expected page ids", inp, page_table=pt)


def test_unused_page_slots_may_hold_padding(inp):
    pt = inp.page_table.clone()
    pt[0, -1] = 10**6  # sequence 0 needs ceil(15/16) = 1 page; the rest of its row is padding
    call(inp, page_table=pt)


def test_mask_without_diagonal(inp):
    m = inp.tree_mask.clone()
    m[1, 3, 3] = False
    expect(r"^tree_mask: expected the diagonal set .* tree_mask\[1, 3, 3\]", inp, tree_mask=m)
    expect(r"^tree_mask: expected the diagonal set", inp, tree_mask=pack_tree_mask(m))


def test_mask_not_ancestor_closed_when_checked(inp):
    m = torch.eye(5, dtype=torch.bool).expand(2, 5, 5).clone()
    m[:, 2, 1] = True
    m[:, 1, 0] = True  # 2 sees 1, 1 sees 0, but 2 does not see 0: not transitive
    call(inp, tree_mask=m)  # accepted without check_mask
    expect(r"^tree_mask: expected an ancestor-closed tree mask", inp, tree_mask=m, check_mask=True)
    call(inp, tree_mask=inp.tree_mask, check_mask=True)  # a real tree passes


@pytest.mark.parametrize("bad", [0, -3, 2.5, "x", True])
def test_nsplit_argument(inp, bad):
    expect(r"^nsplit: expected", inp, nsplit=bad)


@pytest.mark.parametrize("bad", ["0", "-1", "abc", "1.5"])
def test_nsplit_env_var(monkeypatch, bad):
    from kdengine import env

    monkeypatch.setenv("KDENGINE_NSPLIT", bad)
    with pytest.raises(ValueError, match=r"^KDENGINE_NSPLIT: expected"):
        env.nsplit_override()


def test_nsplit_env_var_values(monkeypatch):
    from kdengine import env
    from kdengine.ops.schedule import resolve_nsplit

    kw = dict(backend="triton", capacity=65536, batch=1, row_tiles=1, device=torch.device("cpu"))
    monkeypatch.setenv("KDENGINE_NSPLIT", "32")
    assert env.nsplit_override() == 32
    assert resolve_nsplit(None, **kw) == 32
    assert resolve_nsplit(7, **kw) == 7  # the argument wins over the env var
    monkeypatch.setenv("KDENGINE_NSPLIT", "auto")
    assert resolve_nsplit(None, **kw) >= 1
    monkeypatch.delenv("KDENGINE_NSPLIT")
    assert resolve_nsplit(None, **{**kw, "backend": "cuda"}) == resolve_nsplit("auto", **{**kw, "backend": "cuda"})


def test_sm_scale_and_backend(inp):
    expect(r"^sm_scale: expected a finite float > 0", inp, sm_scale=0.0)
    expect(r"^sm_scale: expected a finite float > 0", inp, sm_scale=float("nan"))
    expect(r"^backend: expected one of", inp, backend="nope")


def test_cuda_backend_reports_clear_error_when_absent(inp):
    from kdengine.ops.verify import unavailable_reason

    if unavailable_reason("cuda", "cpu") is None:
        pytest.skip("cuda backend available here")
    with pytest.raises(RuntimeError, match="backend 'cuda' cannot run on cpu"):
        call(inp, backend="cuda")


def test_check_values_false_skips_only_the_device_value_checks(inp):
    """check_values=False gives the same output on valid buffers and still checks shapes and dtypes."""
    checked = call(inp)
    unchecked = call(inp, check_values=False)
    assert torch.equal(checked, unchecked)
    expect(r"^q: expected dtype torch.bfloat16", inp, q=inp.q.float(), check_values=False)
