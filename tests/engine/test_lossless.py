"""Lossless: greedy speculative decoding equals plain greedy decoding of the target, token for token,
with the real tree walk (several prompts, budgets, seeds). An oracle drafter that knows the plain
continuation (ranked at random among its top-K, sometimes missing) makes long acceptances happen."""

from __future__ import annotations

import pytest
import torch

from kdengine.engine.config import ModelConfig
from kdengine.engine.generate import generate_plain, generate_speculative, prefill, setup_engine

N_TOKENS = 24


def make_engine(seed: int, dtype: str = "float64", batch: int = 1):
    cfg = ModelConfig.from_name("tiny", dtype=dtype)
    return setup_engine(cfg, "cpu", batch, 256, backend="reference", seed=seed)


def prompt_for(seed: int, length: int, batch: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 + seed)
    return torch.randint(0, 96, (batch, length), generator=gen)


def oracle_drafter(reference: list[list[int]], prompt_len: int, seed: int, miss: float = 0.25):
    """Draft fn: per block position, K sorted log-probs whose candidates hold the true next token at
    a random rank (or not at all with probability `miss`)."""
    gen = torch.Generator().manual_seed(seed)

    def draft(engine):
        cfg = engine.cfg
        L, K, V = cfg.draft_block, cfg.draft_top_k, cfg.vocab_size
        lps, ids = [], []
        for b, n in enumerate(engine.host_len):
            j = n - prompt_len  # index of the root in the generated sequence
            cand = torch.stack([torch.randperm(V, generator=gen)[:K] for _ in range(L)])  # [L, K]
            for i in range(L):
                if j + 1 + i < len(reference[b]) and float(torch.rand(1, generator=gen)) > miss:
                    true = reference[b][j + 1 + i]
                    cand[i][cand[i] == true] = (true + 1) % V if (cand[i] == (true + 1) % V).sum() == 0 else cand[i][0]
                    cand[i, int(torch.randint(0, K, (1,), generator=gen))] = true
                    cand[i] = unique_row(cand[i], V, true)
            lp = torch.log_softmax(torch.randn(L, K, generator=gen), -1).sort(-1, descending=True).values
            lps.append(lp)
            ids.append(cand)
        return torch.stack(lps).to(torch.float64), torch.stack(ids)

    return draft


def unique_row(row: torch.Tensor, V: int, keep: int) -> torch.Tensor:
    """Make the candidate ids of one position distinct, keeping `keep` where it is."""
    seen, out = set(), []
    spare = (t for t in range(V) if t not in set(row.tolist()))
    for t in row.tolist():
        if t in seen and t != keep:
            t = next(spare)
        seen.add(t)
        out.append(t)
    return torch.tensor(out)


@pytest.mark.parametrize("seed,prompt_len,budget", [(0, 5, 15), (1, 11, 31), (2, 3, 63), (3, 20, 7)])
def test_speculative_equals_plain_greedy_with_oracle_drafter(seed, prompt_len, budget):
    prompt = prompt_for(seed, prompt_len)
    plain = make_engine(seed)
    prefill(plain, prompt)
    reference = generate_plain(plain, N_TOKENS)
    spec = make_engine(seed)
    prefill(spec, prompt)
    spec.draft_fn = oracle_drafter(reference, prompt_len, seed)
    steps = []
    original = spec.draft_fn

    def counting(engine):
        steps.append(1)
        return original(engine)

    spec.draft_fn = counting
    out = generate_speculative(spec, N_TOKENS, budget)
    assert out == reference
    assert len(steps) < N_TOKENS - 1, "no step accepted more than one token: the test did not exercise acceptance"


def test_speculative_equals_plain_greedy_with_real_drafter_batched():
    prompt = prompt_for(7, 9, batch=2)
    plain = make_engine(7, batch=2)
    prefill(plain, prompt)
    reference = generate_plain(plain, 12)
    spec = make_engine(7, batch=2)
    prefill(spec, prompt)
    assert generate_speculative(spec, 12, 15) == reference


def test_prefill_in_chunks_equals_one_pass():
    """A prompt longer than one prefill chunk (two chunks) predicts the same next token as prefilling
    all but the last prompt token and then decoding that token alone."""
    prompt = prompt_for(4, 150)
    a = make_engine(4)
    b = make_engine(4)
    first = prefill(a, prompt)
    prefill(b, prompt[:, :149])
    b.root = prompt[:, 149].clone()
    out = generate_plain(b, 2)
    assert int(first[0]) == out[0][1]
