"""Peers: the state of the art timed on our verify shapes in the same run, so every record carries the
ratio of ours to it. Optional (`pip install kdengine[peers]`; on a GPU runner the wheel goes in with
--no-deps): where a peer is absent its workloads are skipped, never failed.

FlashMLA (the sgl-flash-mla wheel, dense bf16 decoding on its legacy SM90 kernels):
    q [B, T, H, 576] bf16, the KV pool viewed [P, page_size, 1, 576], page_table as block_table,
    cache_seqlens = prefix_len + T, causal=True: tree token i sees the prefix and tree tokens 0..i (a
    chain, the densest tree of T tokens), against our ancestor mask of a random tree. Same bytes, same
    FLOPs up to the masked tail.
"""

from __future__ import annotations

import importlib

import torch

from kdengine.ops.shapes import DV

PEERS = ("flashmla",)
_MODULES = {"flashmla": "flash_mla"}


def _import(peer: str):
    return importlib.import_module(_MODULES[peer])


def unavailable_reason(peer: str, device: torch.device | str = "cuda") -> str | None:
    """None when `peer` can run on `device`, else a one-line reason (never raises)."""
    if peer not in _MODULES:
        return f"unknown peer {peer!r} (known: {', '.join(PEERS)})"
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return "needs a CUDA GPU"
    if torch.cuda.get_device_capability(device) != (9, 0):
        return "FlashMLA's dense bf16 decoding (legacy kernels) runs on sm_90 only"
    try:
        module = _import(peer)
    except Exception as exc:  # noqa: BLE001 - ImportError, or a library that will not load on this torch
        return f"{_MODULES[peer]} not importable ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); pip install kdengine[peers]"
    if not getattr(module, "has_legacy", lambda: True)():
        return "this flash_mla build has no legacy (SM90 dense) kernels"
    return None


def flashmla_call(q, kv_cache, page_table, prefix_len, *, sm_scale: float):
    """A launch of FlashMLA on our inputs: returns call() -> out [B, T, H, 512]. The scheduler metadata
    is made on the first (eager) call and reused after, so later calls capture in a CUDA graph."""
    flash_mla = _import("flashmla")
    B, T, H, D = q.shape
    P, page_size, _ = kv_cache.shape
    k_cache = kv_cache.view(P, page_size, 1, D)  # [P, page_size, 1 latent head, 576]
    seqlens = (prefix_len + T).to(torch.int32)  # [B]: every KV token, the T tree tokens included
    meta, _ = flash_mla.get_mla_metadata()

    def call():
        out, _lse = flash_mla.flash_mla_with_kvcache(q, k_cache, page_table, seqlens, DV, meta, None,
                                                     softmax_scale=sm_scale, causal=True, use_legacy=True)
        return out

    return call


def verify_call(peer: str):
    """call(inp, bits) -> out for the workload suite: the peer on a workload's inputs (the packed tree
    mask is not read: FlashMLA applies its causal tail). One launcher per input set, made on first use."""
    if peer != "flashmla":
        raise ValueError(f"peer: expected one of {PEERS}, got {peer!r}")
    made: dict[int, object] = {}

    def call(inp, bits):
        key = id(inp)
        if key not in made:
            made[key] = flashmla_call(inp.q, inp.kv_cache, inp.page_table, inp.prefix_len, sm_scale=inp.sm_scale)
        return made[key]()

    return call


# --- the ratio in the records ---------------------------------------------------------------------


def ratio_rows(medians: dict[str, float], ours: tuple[str, ...] = ("cuda", "triton")) -> list[dict]:
    """One row per (ctx, T) where a peer was measured: our backends' times over the peer's.

    medians: workload name -> median seconds, e.g. {"verify/cuda/ctx65536/T16": 1.3e-4,
    "verify-peer/flashmla/ctx65536/T16": 5.6e-5}."""
    rows = []
    for name, peer_s in sorted(medians.items()):
        parts = name.split("/")
        if len(parts) != 4 or parts[0] != "verify-peer" or not peer_s:
            continue
        _, peer, ctx, T = parts
        row = {"ctx": int(ctx.removeprefix("ctx")), "T": int(T.removeprefix("T")), "peer": peer, "peer_s": peer_s}
        for backend in ours:
            mine = medians.get(f"verify/{backend}/{ctx}/{T}")
            row[backend] = (mine, mine / peer_s) if mine else None
        rows.append(row)
    return sorted(rows, key=lambda r: (r["peer"], r["ctx"], r["T"]))


def ratio_lines(medians: dict[str, float], ours: tuple[str, ...] = ("cuda", "triton")) -> list[str]:
    """The records' table of ours / peer (time over time: below 1 = ours is faster), one line a size."""
    rows = ratio_rows(medians, ours)
    if not rows:
        return []
    head = f"{'ctx':>6} {'T':>4}  {'peer':<9} {'peer us':>9}" + "".join(f" {b + ' us':>10} {b + '/peer':>12}" for b in ours)
    lines = ["ours / peer: time of our backend over the peer's, same inputs, same run (below 1: ours is faster)", head]
    for r in rows:
        line = f"{r['ctx']:>6} {r['T']:>4}  {r['peer']:<9} {r['peer_s'] * 1e6:9.1f}"
        for b in ours:
            line += f" {r[b][0] * 1e6:10.1f} {r[b][1]:11.2f}x" if r[b] else f" {'-':>10} {'-':>12}"
        lines.append(line)
    return lines
