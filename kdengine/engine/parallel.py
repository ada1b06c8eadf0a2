"""Tensor parallelism on top of torch.distributed (NCCL on GPUs, gloo on CPU; launched by torchrun or
by the caller): which slice a process computes and the process group the model all-reduces over.

The model already holds the split: ModelConfig.tp_rank/tp_size pick this rank's heads, routed
experts, dense/shared MLP columns and vocab rows (config.head_range, expert_range, vocab_range), and
the model all-reduces after attention, after the MLP/MoE and after the vocab-parallel embedding,
and all-gathers the per-shard argmax of the LM head (model.all_reduce, model.greedy_tokens). The
drafter, tree, mask and acceptance run identically on every rank (same seeds, same greedy tokens), so
every rank accepts the same tokens; each rank keeps its own KV cache.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.distributed as dist

from kdengine.engine.config import ModelConfig


def init_tp(backend: str | None = None, init_method: str = "env://", rank: int | None = None, world_size: int | None = None):
    """Join (or start) the default process group; returns it. backend: nccl on CUDA, else gloo."""
    if not dist.is_initialized():
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        kwargs = {} if rank is None else {"rank": rank, "world_size": world_size}
        dist.init_process_group(backend, init_method=init_method, **kwargs)
    return dist.group.WORLD


def rank_config(cfg: ModelConfig, group) -> ModelConfig:
    """cfg for this process: tp_rank = the group rank. tp_size = the group size, except for a rank
    config (tp_size a multiple of the group size, e.g. kimi-k2-tp8-rank on 2 GPUs), which keeps its
    per-rank shapes: each process computes one of its slices, the verify kernel sees the benchmarked
    shapes, and only the all-reduces span fewer processes than the deployment."""
    if group is None:
        return cfg
    world = dist.get_world_size(group)
    size = cfg.tp_size if cfg.tp_size >= world and cfg.tp_size % world == 0 else world
    return replace(cfg, tp_rank=dist.get_rank(group), tp_size=size)


def local_device(group) -> torch.device:
    """This process's GPU (node-local rank) under NCCL, else the CPU."""
    if group is not None and dist.get_backend(group) == "nccl":
        index = dist.get_node_local_rank(fallback_rank=dist.get_rank(group))
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")
