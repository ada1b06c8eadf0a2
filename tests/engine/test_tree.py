"""DDTree: budget, order, the most probable prefixes (vs brute force), ancestor masks, host == device."""

from __future__ import annotations

import itertools

import pytest
import torch

from kdengine.engine.tree import build_tree, build_tree_device
from kdengine.ops.mask import is_ancestor_closed


def random_draft(L: int, K: int, seed: int, B: int | None = None):
    gen = torch.Generator().manual_seed(seed)
    shape = (L, K, 50) if B is None else (B, L, K, 50)
    logits = torch.randn(shape[:-2] + (50,), generator=gen) * 2
    top = torch.topk(torch.log_softmax(logits, -1), K, dim=-1)
    return top.values, top.indices


def brute_force(lp: torch.Tensor, budget: int) -> list[float]:
    """Scores of the `budget` best prefixes over every choice sequence."""
    L, K = lp.shape
    scores = []
    for d in range(1, L + 1):
        for choice in itertools.product(range(K), repeat=d):
            scores.append(sum(float(lp[i, k]) for i, k in enumerate(choice)))
    return sorted(scores, reverse=True)[:budget]


def prefix_score(tree, lp, ids, node: int) -> float:
    score = 0.0
    while node > 0:
        pos = int(tree.depths[node]) - 1
        k = int((ids[pos] == tree.tokens[node]).nonzero()[0, 0])
        score += float(lp[pos, k])
        node = int(tree.parents[node])
    return score


@pytest.mark.parametrize("L,K,budget,seed", [(4, 3, 20, 0), (3, 4, 30, 1), (5, 2, 25, 2), (4, 3, 1, 3)])
def test_tree_is_the_best_prefixes(L, K, budget, seed):
    lp, ids = random_draft(L, K, seed)
    tree = build_tree(lp, ids, budget, root_token=7)
    assert tree.size == budget + 1 and int(tree.tokens[0]) == 7 and int(tree.parents[0]) == -1
    assert all(int(tree.parents[i]) < i for i in range(1, tree.size)), "a parent follows its child"
    assert all(int(tree.depths[i]) == int(tree.depths[tree.parents[i]]) + 1 for i in range(1, tree.size))
    got = sorted((prefix_score(tree, lp, ids, i) for i in range(1, tree.size)), reverse=True)
    assert got == pytest.approx(brute_force(lp, budget), abs=1e-9)
    assert bool(is_ancestor_closed(tree.mask[None]).all())


@pytest.mark.parametrize("L,K,budget", [(16, 8, 63), (16, 4, 15), (6, 3, 40)])
def test_device_tree_equals_host_tree(L, K, budget):
    lp, ids = random_draft(L, K, seed=budget, B=3)
    root = torch.tensor([1, 2, 3])
    dev = build_tree_device(lp, ids, budget, root_token=root)
    assert dev.tokens.shape == (3, budget + 1) and dev.mask.shape == (3, budget + 1, budget + 1)
    for b in range(3):
        host = build_tree(lp[b], ids[b], budget, root_token=int(root[b]))
        assert torch.equal(dev.tokens[b], host.tokens)
        assert torch.equal(dev.parents[b], host.parents)
        assert torch.equal(dev.depths[b], host.depths)
        assert torch.equal(dev.mask[b], host.mask)


def test_mask_rows_are_root_paths():
    lp, ids = random_draft(5, 3, seed=9)
    tree = build_tree(lp, ids, 30)
    for i in range(tree.size):
        ancestors, node = {i}, i
        while node > 0:
            node = int(tree.parents[node])
            ancestors.add(node)
        assert set(tree.mask[i].nonzero()[:, 0].tolist()) == ancestors


def test_bad_inputs_raise():
    lp, ids = random_draft(3, 2, seed=0)
    with pytest.raises(ValueError, match="budget"):
        build_tree(lp, ids, 0)
    with pytest.raises(ValueError, match="top_log_probs"):
        build_tree(lp, ids[:, :1], 4)
    with pytest.raises(ValueError, match="budget"):
        build_tree_device(lp, ids, 15)  # only 2 + 4 + 8 = 14 prefixes exist


# ---------------------------------------------------------------------------- the Triton tree + mask kernel

KERNEL_CASES = [  # (B, L, K, budget, seed): the engine's shape, B > 1, odd sizes, several mask words, budget 1
    (2, 16, 8, 63, 0), (3, 5, 3, 40, 1), (1, 4, 3, 1, 2), (2, 6, 2, 50, 3), (1, 3, 5, 100, 4), (2, 16, 4, 33, 5),
]


def kernel_mismatches(device: str) -> list[str]:
    """Run kdengine.ops.tree_build on fresh random drafts (ties included) and compare every output
    with the host heap; the list of mismatches (empty = equal)."""
    from kdengine.ops.mask import pack_tree_mask
    from kdengine.ops.tree_build import build_tree_mask

    bad = []
    for B, L, K, budget, seed in KERNEL_CASES:
        lp, ids = random_draft(L, K, seed + 100, B=B)
        if seed == 3:  # exact ties between siblings and across depths: the heap's tie order decides
            lp = (lp * 4).round() / 4
        root = torch.randint(0, 1000, (B,), generator=torch.Generator().manual_seed(seed))
        tok, par, dep, bits, mask = build_tree_mask(lp.to(device), ids.to(device), budget, root.to(device), with_mask=True)
        for b in range(B):
            host = build_tree(lp[b], ids[b], budget, root_token=int(root[b]))
            for name, got, want in (("tokens", tok, host.tokens), ("parents", par, host.parents), ("depths", dep, host.depths),
                                    ("mask", mask, host.mask), ("bits", bits, pack_tree_mask(host.mask)[0])):
                if not torch.equal(got[b].cpu(), want):
                    bad.append(f"B={B} L={L} K={K} budget={budget} b={b}: {name}")
    return bad


def test_tree_kernel_equals_host_heap_in_the_interpreter():
    """The kernel under TRITON_INTERPRET=1 in a child process (Triton picks interpreter or compiler
    when the module is imported), on the CPU."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    code = "from tests.engine.test_tree import kernel_mismatches as k; print('MISMATCHES', k('cpu'))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "MISMATCHES []" in proc.stdout, proc.stdout[-3000:]


def test_tree_kernel_bad_inputs_raise():
    from kdengine.ops.tree_build import build_tree_mask

    lp, ids = random_draft(3, 2, seed=0, B=2)
    with pytest.raises(ValueError, match="budget"):
        build_tree_mask(lp, ids, 15)  # only 2 + 4 + 8 = 14 prefixes exist
    with pytest.raises(ValueError, match="budget"):
        build_tree_mask(lp, ids, 256)
    with pytest.raises(ValueError, match="top_log_probs"):
        build_tree_mask(lp[0], ids[0], 4)
    with pytest.raises(ValueError, match="root"):
        build_tree_mask(lp, ids, 4, torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="top_log_probs/top_token_ids"):
        build_tree_mask(lp, ids.float(), 4)


def test_tree_and_mask_torch_path_equals_host():
    """Without the kernel (the CPU outside the interpreter) the engine's tree + mask is the torch path."""
    from kdengine.engine.tree import tree_and_mask
    from kdengine.ops.mask import unpack_tree_mask

    lp, ids = random_draft(6, 3, seed=11, B=3)
    root = torch.tensor([9, 8, 7])
    tree, bits = tree_and_mask(lp, ids, 37, root)
    assert tree.mask is None
    for b in range(3):
        host = build_tree(lp[b], ids[b], 37, root_token=int(root[b]))
        assert torch.equal(tree.tokens[b], host.tokens) and torch.equal(tree.parents[b], host.parents)
        assert torch.equal(unpack_tree_mask(bits, 38)[b], host.mask)


@pytest.mark.gpu
def test_tree_kernel_on_the_gpu_and_captured():
    """Compiled kernel equals the host heap; captured in a CUDA graph, it replays on new inputs."""
    from kdengine.engine.graphs import CapturedFn
    from kdengine.engine.step import tree_eager
    from kdengine.ops.mask import unpack_tree_mask

    assert kernel_mismatches("cuda") == []
    lp, ids = random_draft(16, 8, seed=5, B=2)
    root = torch.tensor([4, 5])
    graph = CapturedFn(tree_eager(63), [lp.cuda(), ids.cuda(), root.cuda()])
    lp2, ids2 = random_draft(16, 8, seed=6, B=2)  # replay on new inputs
    tokens, parents, depths, bits = graph(lp2.cuda(), ids2.cuda(), root.cuda())
    mask = unpack_tree_mask(bits, 64)
    for b in range(2):
        host = build_tree(lp2[b], ids2[b], 63, root_token=int(root[b]))
        assert torch.equal(tokens[b].cpu(), host.tokens) and torch.equal(parents[b].cpu(), host.parents)
        assert torch.equal(mask[b].cpu(), host.mask)
