"""Paged KV cache: no leaked or doubly owned pages over random alloc/free/relocate, contents follow
their pages, and verify attention is bit-identical before and after Tier 1 relocation."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kdengine.engine.kv_cache import PagedKVCache
from kdengine.ops import mask_from_parents, verify_attention
from kdengine.ops.inputs import random_parents

B, PAGES, PAGE, MAX_PAGES = 3, 24, 16, 10

ops = st.lists(
    st.tuples(st.sampled_from(["alloc", "free_tail", "free", "relocate"]), st.integers(0, B - 1), st.integers(0, 6)),
    max_size=40,
)


def stamp(cache: PagedKVCache, pages: list[int], values: list[int]) -> None:
    for p, v in zip(pages, values, strict=True):
        cache.pool[:, p] = float(v)


def check_contents(cache: PagedKVCache, expected: list[list[int]]) -> None:
    for b in range(B):
        ids = cache.page_table[b, : len(cache.pages[b])].long()
        got = cache.pool[0, ids, 0, 0].tolist()
        assert got == [float(v) for v in expected[b]], f"sequence {b} contents moved with the wrong pages"


@settings(max_examples=60, deadline=None)
@given(ops)
def test_random_alloc_free_relocate_keeps_ownership(sequence):
    cache = PagedKVCache(1, PAGES, PAGE, B, MAX_PAGES, "cpu")
    expected: list[list[int]] = [[] for _ in range(B)]
    counter = 1
    for op, b, n in sequence:
        if op == "alloc":
            n = min(n, len(cache.free), MAX_PAGES - len(cache.pages[b]))
            new = cache.alloc(b, n)
            values = list(range(counter, counter + n))
            counter = counter % 200 + n
            stamp(cache, new, values)
            expected[b] += values
        elif op == "free_tail":
            keep = min(n, len(cache.pages[b]))
            cache.free_tail(b, keep * PAGE)
            expected[b] = expected[b][:keep]
        elif op == "free":
            cache.free_sequence(b)
            expected[b] = []
        else:
            moved = cache.relocate(b)
            if moved:
                assert cache.is_contiguous(b)
        cache.check_ownership()
        check_contents(cache, expected)


def test_tier0_pages_come_out_contiguous_after_frees():
    cache = PagedKVCache(1, 16, PAGE, 2, 8, "cpu")
    cache.alloc(0, 4)
    cache.alloc(1, 4)
    cache.free_sequence(0)
    assert cache.alloc(1, 3) == [0, 1, 2]  # lowest free ids, in order
    cache.check_ownership()


def test_attention_bit_identical_after_relocation():
    gen = torch.Generator().manual_seed(0)
    cache = PagedKVCache(2, 40, PAGE, 2, 20, "cpu")
    # Interleave two sequences so sequence 0's pages are scattered, then free sequence 1's.
    for _ in range(6):
        cache.alloc(0, 1)
        cache.alloc(1, 2)
    cache.free_sequence(1)
    cache.alloc(0, 2)
    cache.pool.copy_(torch.randn(cache.pool.shape, generator=gen).to(torch.bfloat16))
    n_tokens, T, H = 6 * PAGE + 9, 7, 3
    assert not cache.is_contiguous(0)
    q = torch.randn(1, T, H, 576, generator=gen).to(torch.bfloat16)
    mask = mask_from_parents(random_parents(T, gen))[None]
    prefix = torch.tensor([n_tokens], dtype=torch.int32)

    def attend(layer: int):
        return verify_attention(q, cache.pool[layer], cache.page_table[:1], prefix, mask, sm_scale=0.1, backend="reference")

    before = [attend(layer) for layer in range(2)]
    old = list(cache.pages[0])
    assert cache.relocate(0)
    assert cache.is_contiguous(0) and cache.pages[0] != old
    cache.check_ownership()
    for layer in range(2):
        assert torch.equal(attend(layer), before[layer])


def test_compact_moves_accepted_rows_and_advances():
    cache = PagedKVCache(1, 8, PAGE, 1, 8, "cpu")
    cache.ensure_capacity(0, 40)
    cache.lengths[0] = 10
    rows = torch.arange(8, dtype=torch.float32)[:, None].expand(8, 576).to(torch.bfloat16)
    cache.write(0, rows[None], torch.arange(10, 18)[None])
    path = torch.tensor([[0, 3, 6, 3, 4, 5, 6, 7]])  # accepted nodes 0, 3, 6; identity past count
    cache.compact(path, torch.tensor([3]))
    assert int(cache.lengths[0]) == 13
    got = cache.pool[0, 0, 10:13, 0].tolist()  # page 0 holds tokens 0..15
    assert got == [0.0, 3.0, 6.0]
