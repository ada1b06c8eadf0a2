"""Roofline of a verify workload: its bytes and FLOPs against this machine's measured ceilings.

One verify call of one layer, one rank (H heads), context N, T tree tokens:
    bytes = N*576*2 (the latent KV, read once) + T*H*576*2 (q) + T*H*512*2 (out)
    FLOPs = 2*T*H*N*1088 (QK^T over 576 dims plus PV over 512 dims)
floor = max(bytes / copy bandwidth, FLOPs / matmul rate); `percent_of_floor` = floor / time * 100.
The ceilings (copy bandwidth, bf16 matmul on a GPU; fp32 on the CPU, where the reference computes)
are measured once per machine and cached as JSON in kdengine.env.cache_dir().
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass

import torch

from kdengine import env
from kdengine.bench import fingerprint, timer

D_QK, DV = 576, 512
BYTES_BF16 = 2


@dataclass(frozen=True)
class Ceilings:
    copy_bytes_per_s: float  # read + write bytes moved per second by a device copy
    matmul_flops_per_s: float  # dense matmul rate (bf16 on a GPU, fp32 on the CPU)
    machine: str
    dtype: str


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


def _measure_gpu(device: torch.device) -> tuple[float, float]:
    src = torch.empty(2**30 // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    copy = timer.time_gpu(lambda i: dst.copy_(src), samples=20, launches=4, device=device)
    n = 8192
    a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    mm = timer.time_gpu(lambda i: torch.mm(a, b), samples=20, launches=4, device=device)
    # best sample: a ceiling is what the machine can do, not its typical time
    return 2 * src.numel() * 2 / min(copy.samples), 2 * n**3 / min(mm.samples)


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
    return env.cache_dir() / f"ceilings-{machine}-torch{torch.__version__}.json"


def ceilings(device: torch.device | str = "cpu", *, refresh: bool = False) -> Ceilings:
    """This machine's ceilings, measured on first use and cached per machine and torch version."""
    device = torch.device(device)
    on_gpu = device.type == "cuda"
    machine = fingerprint.machine_name() if on_gpu else fingerprint.machine_name({"gpu": "cpu"})
    path = _cache_path(machine)
    if path.exists() and not refresh:
        try:
            return Ceilings(**json.loads(path.read_text()))
        except (ValueError, TypeError):
            pass  # a damaged cache is measured again
    bw, rate = _measure_gpu(device) if on_gpu else _measure_cpu()
    result = Ceilings(copy_bytes_per_s=bw, matmul_flops_per_s=rate, machine=machine,
                      dtype="bfloat16" if on_gpu else "float32")
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(asdict(result), fh, indent=1)
    os.replace(tmp, path)
    return result


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
