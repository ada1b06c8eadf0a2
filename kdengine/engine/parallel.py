"""Tensor and expert parallelism on top of torch.distributed (NCCL on GPUs, gloo on CPU), launched by
torchrun: the process group, this process's slice and device, the torchrun (re)launch of
`kdengine decode --tp N`, the check that every rank made the same decisions, and the per-rank
profile (phases, MoE load, all-reduce time) gathered on every rank with its imbalance across ranks.

The model already holds the split: ModelConfig.tp_rank/tp_size pick this rank's heads, routed
experts, dense/shared MLP columns and vocab rows (config.head_range, expert_range, vocab_range), and
the model all-reduces after attention, after the MLP/MoE and after the vocab-parallel embedding,
and all-gathers the per-shard argmax of the LM head (model.all_reduce, model.greedy_tokens). Each
rank keeps its own KV cache (the one latent MLA head is replicated, as in the deployment).

Replicated decisions: the drafter, tree, mask and acceptance run on every rank instead of once plus
a broadcast. Their inputs are the same on every rank by construction: drafter weights, synthetic
context and replay policy come from the same seeds, and what they read from the target (features,
greedy tokens) is the output of an all-reduce or all-gather, which hands every rank the same bits.
check_replicated() is the runtime proof: run_decode compares digests of the committed lengths and
the root token across ranks once per run (a mismatch raises), and the tests compare every step.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from dataclasses import replace

import torch
import torch.distributed as dist

from kdengine import env
from kdengine.engine.config import ModelConfig

# NVLink multicast (NVLS) off in every launched process: it can take a shared host's GPUs out of service.
NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

# ---------------------------------------------------------------------------- process group


def backend_for(device) -> str:
    """nccl for a CUDA device, gloo for anything else."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def init_tp(backend: str | None = None, init_method: str = "env://", rank: int | None = None, world_size: int | None = None):
    """Join (or start) the default process group; returns it. backend: nccl on CUDA, else gloo."""
    if not dist.is_initialized():
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        kwargs = {} if rank is None else {"rank": rank, "world_size": world_size}
        dist.init_process_group(backend, init_method=init_method, **kwargs)
    return dist.group.WORLD


def resolve_device(name) -> torch.device:
    """`auto` = cuda when available, else cpu; any other name as torch.device."""
    if str(name) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def join_group(tp: int, device="auto"):
    """The one process-group setup of a run: (None, device) for tp == 1; else join (or reuse) the
    default group (nccl on CUDA, gloo otherwise), check that it has tp processes, and return it with
    this process's device (its GPU under nccl). Raises ValueError naming `tp` on a size mismatch."""
    device = resolve_device(device)
    if tp < 1:
        raise ValueError(f"tp: expected >= 1, got {tp}")
    if tp == 1:
        return None, device
    group = init_tp(backend_for(device))
    if dist.get_world_size(group) != tp:
        raise ValueError(f"tp: expected the process group size {dist.get_world_size(group)}, got {tp}")
    return group, (local_device(group) if device.type == "cuda" else device)


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
    """This process's GPU under NCCL (torchrun's LOCAL_RANK, else the group rank, modulo the visible
    GPUs), made current; the CPU otherwise."""
    if group is None or dist.get_backend(group) != "nccl":
        return torch.device("cpu")
    local = env.launcher_local_rank()
    index = (dist.get_rank(group) if local is None else local) % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def finish_tp() -> None:
    """Leave the default process group (after the last collective of the process)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def under_launcher() -> bool:
    """True inside a torchrun-launched process or an already started process group."""
    return env.launcher_world_size() is not None or dist.is_initialized()


# ---------------------------------------------------------------------------- launch


def launch_env(base: dict | None = None) -> dict[str, str]:
    """The environment of launched ranks: `base` (default os.environ) with NVLink multicast off."""
    return {**(os.environ if base is None else base), **NVLS_OFF}


def torchrun_command(nproc: int, argv: list[str]) -> list[str]:
    """`python -m torch.distributed.run` running `python -m kdengine.cli <argv>` in nproc processes
    on this host."""
    if nproc < 1:
        raise ValueError(f"nproc: expected >= 1, got {nproc}")
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "kdengine.cli", *argv]


def relaunch(nproc: int, argv: list[str]) -> int:
    """Run `kdengine <argv>` under torchrun with nproc processes; the launcher's exit status."""
    cmd = torchrun_command(nproc, argv)
    shown = " ".join(f"{k}={v}" for k, v in NVLS_OFF.items()) + " " + " ".join(cmd)
    print(f"kdengine: launching {nproc} ranks: {shown}", file=sys.stderr, flush=True)
    return subprocess.run(cmd, env=launch_env(), check=False).returncode


def argv_from(args, parser) -> list[str]:
    """The options of `parser` whose parsed values in `args` differ from their defaults, as a
    command line that parses back to the same values (prefixed with the subcommand's name)."""
    out = [parser.prog.split()[-1]]
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        value = getattr(args, action.dest, action.default)
        if value == action.default:
            continue
        flag = action.option_strings[-1]
        if action.nargs == 0:  # store_true / store_false
            out.append(flag)
        else:
            out.extend([flag, str(value)])
    return out


# ---------------------------------------------------------------------------- replicated decisions


def digest(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over the names, dtypes, shapes and bytes of the tensors (moved to the CPU)."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        h.update(f"{name}:{t.dtype}:{list(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def check_replicated(group, **tensors: torch.Tensor) -> None:
    """Raise RuntimeError (on every rank) unless every rank holds the same values of `tensors`."""
    if group is None:
        return
    mine = digest(tensors)
    every: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, mine, group=group)
    if len(set(every)) != 1:
        differ = [r for r, d in enumerate(every) if d != every[0]]
        raise RuntimeError(f"tensor parallel: ranks {differ} disagree with rank 0 on {sorted(tensors)}")


# ---------------------------------------------------------------------------- per-rank profile


def gather_profiles(mine: dict, group) -> list[dict]:
    """Every rank's profile dict, in rank order, on every rank."""
    if group is None:
        return [mine]
    every: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, mine, group=group)
    return every


def imbalance(values: list[float]) -> float:
    """max / mean of non-negative values (1.0 = balanced; 0.0 when all are zero or there are none)."""
    if not values:
        return 0.0
    mean = sum(values) / len(values)
    return max(values) / mean if mean > 0 else 0.0


def summarize_ranks(ranks: list[dict]) -> dict[str, float]:
    """Imbalance (max/mean) across ranks of: tokens routed to each rank's experts, MoE time,
    attention time and all-reduce time (a rank that waits for the others shows a longer all-reduce)."""
    return {
        "moe_tokens": imbalance([sum(r["moe_load"]) for r in ranks]),
        "moe_ms": imbalance([r["phase_ms"].get("verify-moe", 0.0) for r in ranks]),
        "attention_ms": imbalance([r["phase_ms"].get("verify-attention", 0.0) for r in ranks]),
        "all_reduce_ms": imbalance([r.get("all_reduce_ms", 0.0) for r in ranks]),
    }
