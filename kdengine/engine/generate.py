"""The decode engine at its historical import path: the step (kdengine.engine.step: engine state, draft
-> tree + mask -> verify -> accept -> commit, prefill, greedy and speculative generation) and the run
harness (kdengine.engine.run: settings, timing, profile, results, rank gathering). Tests, benchmarks and
the CLI import run_decode(DecodeSettings(...)) -> DecodeResult from here; new code may import the two
modules directly. Nothing is defined here.
"""

from __future__ import annotations

from kdengine.engine.run import (
    DecodeResult,
    DecodeSettings,
    build_engine,
    check_settings,
    resolve_device,
    run_decode,
    timed_steps,
)
from kdengine.engine.step import (
    Engine,
    accept,
    capture_graphs,
    chain_bits,
    commit,
    draft,
    fill_synthetic_context,
    forward,
    generate_plain,
    generate_speculative,
    make_tree,
    prefill,
    release_graphs,
    replay_or_run,
    reserve,
    setup_engine,
    speculative_step,
    verify,
)

__all__ = [
    "DecodeResult", "DecodeSettings", "Engine", "accept", "build_engine", "capture_graphs", "chain_bits", "check_settings",
    "commit", "draft", "fill_synthetic_context", "forward", "generate_plain", "generate_speculative", "make_tree",
    "prefill", "release_graphs", "replay_or_run", "reserve", "resolve_device", "run_decode", "setup_engine",
    "speculative_step", "timed_steps", "verify",
]
