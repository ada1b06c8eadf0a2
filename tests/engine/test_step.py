"""The step's one graph-or-eager choice, the captured-input guard, and the one process-group setup."""

from __future__ import annotations

import pytest
import torch

from kdengine.engine import parallel
from kdengine.engine.config import ModelConfig
from kdengine.engine.graphs import CapturedFn
from kdengine.engine.step import replay_or_run, setup_engine, speculative_step


def tiny_engine():
    return setup_engine(ModelConfig.from_name("tiny"), "cpu", 1, 256, backend="reference", seed=0)


def test_replay_or_run_replays_only_a_captured_phase():
    engine = tiny_engine()
    calls = []
    eager = lambda x: calls.append("eager") or x + 1  # noqa: E731
    assert replay_or_run(engine, "draft", eager, torch.ones(2)).tolist() == [2.0, 2.0]
    engine.graphs = {"draft": lambda x: calls.append("graph") or x * 10}
    assert replay_or_run(engine, "draft", eager, torch.ones(2)).tolist() == [10.0, 10.0]
    assert replay_or_run(engine, "verify", eager, torch.ones(1)).tolist() == [2.0]  # no graph for verify
    assert calls == ["eager", "graph", "eager"]


def test_a_step_at_another_budget_than_the_graphs_raises():
    engine = tiny_engine()
    engine.graphs, engine.budget = {"verify": object()}, 15
    with pytest.raises(ValueError, match="budget"):
        speculative_step(engine, 7)


def test_captured_fn_refuses_inputs_it_would_cast():
    fn = CapturedFn.__new__(CapturedFn)  # the guard runs before any replay: no GPU needed
    fn.static = [torch.zeros(2, 3, dtype=torch.float32)]
    with pytest.raises(ValueError, match=r"inputs\[0\]"):
        fn(torch.zeros(2, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"inputs\[0\]"):
        fn(torch.zeros(1, 3, dtype=torch.float32))


def test_join_group_is_the_one_setup():
    group, device = parallel.join_group(1, "cpu")
    assert group is None and device == torch.device("cpu")
    with pytest.raises(ValueError, match="tp"):
        parallel.join_group(0, "cpu")
    assert parallel.resolve_device("cpu") == torch.device("cpu")
