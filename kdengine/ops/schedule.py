"""Split-KV scheduling, computed apart from the run call (FlashMLA's get_mla_metadata, flashinfer's
plan()): the KV split count is a host integer that fixes the grid, so it depends only on host-known
sizes (SM count, T, H, batch and the page-table capacity), never on device lengths. One CUDA graph
therefore replays at any prefix length up to the capacity.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

from kdengine import env

# The seed's value. The default stays 64 for a backend until its automatic mode has been measured at
# least as fast as 64 at every benchmarked size (perf_history/records/verify_kernel_cudagraph.txt);
# then that backend's default becomes "auto".
SEED_NSPLIT = 64
# cuda: auto measured within 1% of (or faster than) the best fixed NSPLIT at every benchmarked size
# on the H200 (perf_history/kernel/verify_kernel_gpu-nvidia-h200-sm90_9f5b1a0.json); for the wide2
# layout within 0.2% of (or faster than) the best of 16/32/64/128 at all six sizes (..._f1344fe.json). Against a finer
# grid (every runnable count from auto / 4 to one wave), both paths, two passes: within 0.7% of the best fixed count
# at all six sizes (perf_history/kernel/nsplit2_e2db55e/).
DEFAULT_NSPLIT: dict[str, int | str] = {"triton": "auto", "cuda": "auto"}

# A split shorter than this many KV tokens costs more in partial-result traffic and merge work than
# it gains in parallelism.
MIN_TOKENS_PER_SPLIT = 256
# Waves of thread blocks to aim for. One: a `triton` split program fills an SM (8 warps at ~255
# registers, ~148 KB of shared memory on sm_90) and the splits hold equal work, so one wave is
# balanced; a second wave would double the partial-result traffic (programs x BLOCK_M x 2 KB, written
# then read by the merge) without adding parallelism.
TARGET_WAVES = 1
MAX_NSPLIT = 1024


@lru_cache(maxsize=8)
def sm_count(device_index: int | None = None) -> int:
    if not torch.cuda.is_available():
        return 1
    return torch.cuda.get_device_properties(device_index or 0).multi_processor_count


def auto_nsplit(
    *, capacity: int, batch: int, row_tiles: int, num_sms: int, min_tokens: int = MIN_TOKENS_PER_SPLIT,
    tile_tokens: int | None = None,
) -> int:
    """NSPLIT from the SM count and the host-known sizes.

    capacity: KV tokens the page table can address (max_pages * page_size), the upper bound of
    prefix_len + T; batch: sequences; row_tiles: blocks of query rows per (sequence, split);
    min_tokens: the shortest split worth its partial-result traffic (a backend may measure its own);
    tile_tokens: when a backend rounds each split's length up to whole KV tiles, the splits that
    would stay empty at full capacity are dropped.

    The grid is rounded down to whole waves: one block past a wave costs a second wave (measured on
    the cuda backend at ctx 65536, T 64: 17 splits x 8 row tiles = 136 blocks on 132 SMs ran 1.7x
    slower than 16 splits).
    """
    blocks_per_split = max(1, batch * row_tiles)
    want = max(1, (TARGET_WAVES * num_sms) // blocks_per_split)
    most = max(1, capacity // min_tokens)
    n = int(max(1, min(want, most, MAX_NSPLIT)))
    if tile_tokens:
        chunk = math.ceil(math.ceil(capacity / n) / tile_tokens) * tile_tokens
        n = max(1, math.ceil(capacity / chunk))
    return n


def check_nsplit(nsplit, name: str = "nsplit") -> int | str | None:
    """Validate an nsplit value: None, 'auto', or an int >= 1 (bool rejected)."""
    if nsplit is None:
        return None
    if isinstance(nsplit, str):
        if nsplit.strip().lower() == "auto":
            return "auto"
        raise ValueError(f"{name}: expected None, 'auto' or an integer >= 1, got {nsplit!r}")
    if isinstance(nsplit, bool) or not isinstance(nsplit, int):
        raise ValueError(f"{name}: expected None, 'auto' or an integer >= 1, got {type(nsplit).__name__} {nsplit!r}")
    if nsplit < 1:
        raise ValueError(f"{name}: expected an integer >= 1, got {nsplit}")
    return nsplit


def resolve_nsplit(
    nsplit, *, backend: str, capacity: int, batch: int, row_tiles: int, device: torch.device,
    min_tokens: int = MIN_TOKENS_PER_SPLIT, tile_tokens: int | None = None,
) -> int:
    """The split count a call runs with: the argument, else KDENGINE_NSPLIT, else the backend default.

    A forced value is used as given: kernels must (and do) handle splits that hold no tokens, since
    the per-sequence lengths live on the device and vary across the batch.
    """
    choice = check_nsplit(nsplit)
    if choice is None:
        choice = env.nsplit_override()
    if choice is None:
        choice = DEFAULT_NSPLIT.get(backend, SEED_NSPLIT)
    if choice == "auto":
        sms = sm_count(device.index) if device.type == "cuda" else 4
        choice = auto_nsplit(capacity=capacity, batch=batch, row_tiles=row_tiles, num_sms=sms, min_tokens=min_tokens,
                             tile_tokens=tile_tokens)
    return int(choice)
