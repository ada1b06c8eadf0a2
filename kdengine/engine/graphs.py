"""CUDA graph mechanics for the engine's fixed-shape phases (drafter forward, tree + mask, target verify
forward): CapturedFn captures a function of device tensors once and replays it at any context length
(every length the forwards read is a device buffer the engine updates in place; the verify kernel's
host-side checks are skipped while capturing, kdengine.ops.validate). This module knows nothing of the
step: kdengine.engine.step decides what is captured and when a phase replays (the one graph-or-eager
choice), so there is no import from the step back into here.

Needs a graph-safe verify backend (not `reference`, which reads lengths on the host) and a graph-safe
MoE expert path (grouped_mm, or dense where torch._grouped_mm does not run). Under tensor parallelism
the verify graph holds the NCCL all-reduces and the all-gather of the LM head (NCCL collectives are
captured by stream capture; the warm-up runs initialise the communicator first); every rank captures
the same graphs in the same order.
"""

from __future__ import annotations

import torch

from kdengine.engine.config import ModelConfig
from kdengine.engine.model import torch_dtype

WARMUP_RUNS = 3


# ---------------------------------------------------------------------------- expert path


def grouped_mm_works(device: torch.device, dtype: torch.dtype) -> bool:
    """True when torch._grouped_mm runs here for this dtype and matches per-group matmuls."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    try:
        gen = torch.Generator(device=device).manual_seed(0)
        a = torch.randn(40, 64, generator=gen, device=device).to(dtype)
        b = torch.randn(3, 48, 64, generator=gen, device=device).to(dtype)  # [E, N, K] like the weights
        offs = torch.tensor([8, 8, 40], dtype=torch.int32, device=device)
        out = torch._grouped_mm(a, b.transpose(1, 2), offs=offs)
        ref = torch.cat([a[:8] @ b[0].t(), a[8:40] @ b[2].t()])
        return bool(torch.allclose(out.float(), ref.float(), rtol=2e-2, atol=2e-2))
    except (RuntimeError, NotImplementedError, TypeError):
        return False


def choose_expert_impl(cfg: ModelConfig, device: torch.device) -> str:
    """loop on the CPU (exact groups, host counts); on CUDA grouped_mm if it runs, else dense."""
    device = torch.device(device)
    if device.type != "cuda":
        return "loop"
    return "grouped_mm" if grouped_mm_works(device, torch_dtype(cfg.dtype)) else "dense"


# ---------------------------------------------------------------------------- capture / replay


class CapturedFn:
    """fn(*static_inputs) captured in a CUDA graph; calling copies new inputs in and replays."""

    def __init__(self, fn, example_inputs: list[torch.Tensor]):
        self.static = [x.clone() for x in example_inputs]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.no_grad():
            for _ in range(WARMUP_RUNS):
                fn(*self.static)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), torch.no_grad():
            self.outputs = fn(*self.static)

    def __call__(self, *inputs: torch.Tensor):
        for i, (s, x) in enumerate(zip(self.static, inputs, strict=True)):
            if x.shape != s.shape or x.dtype != s.dtype:  # a copy_ would cast or broadcast silently
                raise ValueError(f"inputs[{i}]: expected {s.dtype} {list(s.shape)} (as captured), got {x.dtype} {list(x.shape)}")
            s.copy_(x)
        self.graph.replay()
        return self.outputs


def graph_blocker(cache_device: torch.device, backend: str, expert_impls: set[str], group) -> str | None:
    """Why a step with these parts cannot be captured, or None."""
    if torch.device(cache_device).type != "cuda":
        return "not on a CUDA device"
    if backend == "reference":
        return "the reference verify backend reads lengths on the host"
    if "loop" in expert_impls:
        return "the loop expert path reads counts on the host"
    if group is not None and torch.distributed.get_backend(group) != "nccl":
        return f"{torch.distributed.get_backend(group)} collectives cannot be captured (NCCL's can)"
    return None


def capture(fn, example_inputs: list[torch.Tensor], notes: list[str], what: str) -> CapturedFn | None:
    """CapturedFn(fn, example_inputs), or None with a note when an op cannot be captured."""
    try:
        return CapturedFn(fn, example_inputs)
    except (RuntimeError, TypeError) as exc:  # a backend or op that cannot be captured (or an older torch): eager, say so
        notes.append(f"cuda graphs: {what} capture failed, running eagerly ({str(exc).splitlines()[0][:200]})")
        torch.cuda.synchronize()
        return None


__all__ = ["CapturedFn", "capture", "choose_expert_impl", "graph_blocker", "grouped_mm_works"]
