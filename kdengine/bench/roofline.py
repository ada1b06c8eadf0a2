"""Roofline of a verify workload: its bytes and FLOPs against this machine's measured ceilings.

One verify call of one layer, one rank (H heads), context N, T tree tokens:
    bytes = N*576*2 (the latent KV, read once) + T*H*576*2 (q) + T*H*512*2 (out)
    FLOPs = 2*T*H*N*1088 (QK^T over 576 dims plus PV over 512 dims)
floor = max(bytes / copy bandwidth, FLOPs / matmul rate); `percent_of_floor` = floor / time * 100.
The ceilings (copy bandwidth, bf16 matmul on a GPU; fp32 on the CPU, where the reference computes)
are measured once per machine and cached as JSON in kdengine.env.cache_dir(); every front end (asv,
pytest-benchmark, `kdengine bench`, the kernel sweep kdengine.bench.kernel) reads them from here.

The copy ceiling counts the bytes a device copy reads plus the bytes it writes (2 x its size), timed
on launches of the copy between CUDA events, not on a captured graph: a copy_ captured in a CUDA graph
(a memcpy node) moved 2.71 TB/s on the H200, 4 or 1 per replay alike, where the same copy_ launched moved
4.24 TB/s and an elementwise copy kernel 4.27 (ci/gpu/measure_core.sh at bb20326). Both ceilings before
COPY_METHOD v2 (the asv suite's and the kernel sweep's) timed the captured copy: their "% of floor" read
~1.57x high.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass

import torch

from kdengine import env
from kdengine.bench import fingerprint, timer
from kdengine.ops.shapes import D_QK, DV

BYTES_BF16 = 2
# How the ceilings are measured; part of the cache key, so a machine measured another way measures again.
COPY_METHOD = "v2: launched device copy (copy_ and an elementwise kernel, best), read + write bytes, best sample"
_CACHE_VERSION = "v2"


@dataclass(frozen=True)
class Ceilings:
    copy_bytes_per_s: float  # read + write bytes moved per second by a device copy
    matmul_flops_per_s: float  # dense matmul rate (bf16 on a GPU, fp32 on the CPU)
    machine: str
    dtype: str
    method: str = COPY_METHOD


def verify_bytes(*, N: int, T: int, H: int) -> int:
    """DRAM bytes of one verify call: the KV once, q in, out back."""
    return N * D_QK * BYTES_BF16 + T * H * D_QK * BYTES_BF16 + T * H * DV * BYTES_BF16


def verify_flops(*, N: int, T: int, H: int) -> int:
    """FLOPs of one verify call: 2*T*H*N*(576 + 512)."""
    return 2 * T * H * N * (D_QK + DV)


def floor_seconds(bytes_: float, flops: float, ceilings: Ceilings) -> float:
    """The roofline floor: the slower of moving the bytes and doing the math."""
    return max(bytes_ / ceilings.copy_bytes_per_s, flops / ceilings.matmul_flops_per_s)


def percent_of_floor(seconds: float, floor: float) -> float:
    """floor / seconds * 100: 100 means at the roofline."""
    if seconds <= 0:
        raise ValueError(f"seconds: expected a positive time, got {seconds}")
    return 100.0 * floor / seconds


# --- measured ceilings ----------------------------------------------------------------------------


def copy_bandwidth_gpu(device: torch.device, nbytes: int = 2**30) -> dict[str, float]:
    """Read + write bytes per second of a launched device copy of `nbytes` (far over the L2), best
    sample, for the two ways torch copies: copy_ (cudaMemcpyAsync) and an elementwise kernel."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    ways = {"copy_": lambda i: dst.copy_(src), "elementwise": lambda i: torch.mul(src, 1, out=dst)}
    moved = 2 * src.numel() * src.element_size()
    return {name: moved / min(timer.time_gpu(fn, samples=20, launches=4, use_graph=False, device=device).samples)
            for name, fn in ways.items()}


def _measure_gpu(device: torch.device) -> tuple[float, float]:
    copy = max(copy_bandwidth_gpu(device).values())
    n = 8192
    a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    mm = timer.time_gpu(lambda i: torch.mm(a, b), samples=20, launches=4, device=device)
    # best sample: a ceiling is what the machine can do, not its typical time
    return copy, 2 * n**3 / min(mm.samples)


def _measure_cpu() -> tuple[float, float]:
    # Sizes big enough for the BLAS to reach its rate (a 512 matmul reads ~30% low), best of several
    # samples: a ceiling measured while the machine is busy would let "% of floor" exceed 100.
    src = torch.randn(16 * 2**20)  # 64 MiB fp32
    dst = torch.empty_like(src)
    copy = timer.time_cpu(lambda: dst.copy_(src), samples=9, warmup=2)
    n = 1536
    a, b = torch.randn(n, n), torch.randn(n, n)
    mm = timer.time_cpu(lambda: torch.mm(a, b), samples=9, warmup=2)
    return 2 * src.numel() * 4 / min(copy.samples), 2 * n**3 / min(mm.samples)


def _cache_path(machine: str):
    return env.cache_dir() / f"ceilings-{_CACHE_VERSION}-{machine}-torch{torch.__version__}.json"


def ceilings(device: torch.device | str = "cpu", *, refresh: bool = False) -> Ceilings:
    """This machine's ceilings, measured on first use and cached per machine and torch version."""
    device = torch.device(device)
    on_gpu = device.type == "cuda"
    machine = fingerprint.machine_name() if on_gpu else fingerprint.machine_name({"gpu": "cpu"})
    path = _cache_path(machine)
    if path.exists() and not refresh:
        try:
            cached = Ceilings(**json.loads(path.read_text()))
            if cached.method == COPY_METHOD:
                return cached
        except (ValueError, TypeError):
            pass  # a damaged cache (or one measured another way) is measured again
    bw, rate = _measure_gpu(device) if on_gpu else _measure_cpu()
    result = Ceilings(copy_bytes_per_s=bw, matmul_flops_per_s=rate, machine=machine,
                      dtype="bfloat16" if on_gpu else "float32")
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(asdict(result), fh, indent=1)
    os.replace(tmp, path)
    return result


def verify_floor(*, N: int, T: int, H: int, ceil: Ceilings) -> float:
    """The floor of one verify call: the slower of its bytes and its FLOPs against the ceilings."""
    return floor_seconds(verify_bytes(N=N, T=T, H=H), verify_flops(N=N, T=T, H=H), ceil)


def verify_roofline(seconds: float, *, N: int, T: int, H: int, ceil: Ceilings) -> dict:
    """Bytes, FLOPs, floor and % of floor of one measured verify call."""
    b, f = verify_bytes(N=N, T=T, H=H), verify_flops(N=N, T=T, H=H)
    floor = floor_seconds(b, f, ceil)
    return {
        "bytes": b,
        "flops": f,
        "floor_s": floor,
        "bound": "memory" if b / ceil.copy_bytes_per_s >= f / ceil.matmul_flops_per_s else "compute",
        "roofline_pct": percent_of_floor(seconds, floor),
    }
