"""Mixture of experts of one tensor-parallel rank: the router and its routing policies, the routed
experts in the config dtype (bf16) or INT4 (compressed-tensors pack-quantized, group 32, as Kimi K2.x
ships them), the shared expert, and the byte count of what a step reads. MoE.forward returns this
rank's partial sum; the caller all-reduces it (TP: experts and shared expert).

Routing policies (cfg.routing), all graph-safe (no host sync) and seeded:
- random: the router as trained (here random weights: correlated hidden states pile onto few experts);
- uniform: each token's top-k experts a uniformly random k-subset of all n_experts;
- skewed[:r]: each token's k experts drawn without replacement (Gumbel top-k) from a Zipf distribution
  over a per-layer permutation of the experts, its exponent set so that the expected load of the most
  popular expert is r times the mean load k/n_experts (r = 1 is uniform; default 2).
Synthetic policies keep the router's weights for the chosen experts (its matmul is paid), and draw from
a counter-based hash (MoE call, layer, token row, expert): the same call sequence gives the same routing,
eager or replayed, but the draw does not depend on the token, so spec == plain greedy holds only for `random`.

Letters: N tokens (B*T), k top-k, E local experts, D hidden, I expert intermediate, G group size.
"""

from __future__ import annotations

import contextlib
import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from kdengine.engine import fused_ops
from kdengine.engine.config import ModelConfig, expert_bytes, expert_range, parse_routing


class DenseMLP(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cfg.n_experts, cfg.hidden))
        self.e_score_correction_bias = nn.Parameter(torch.zeros(cfg.n_experts))

    def fp32_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(weight, bias) in fp32, converted once per weight version (a load bumps it), so a step
        reads the fp32 copy instead of converting [n_experts, D] every layer; built before a graph
        capture (warm-up runs) and only read inside it."""
        w, b = self.weight, self.e_score_correction_bias
        key = (w.data_ptr(), w._version, b.data_ptr(), b._version)
        if getattr(self, "_fp32_key", None) != key:
            self._fp32 = (w.detach().float(), b.detach().float())
            self._fp32_key = key
        return self._fp32


# ---------------------------------------------------------------------------- routing


def route(x, moe: MoE):
    """x [N, D] -> ids [N, k] (global expert ids), weights [N, k] fp32. noaux_tc routing (one group):
    sigmoid scores, top-k on score + bias (or the policy's draw), normalized weights."""
    cfg = moe.cfg
    weight, bias = moe.gate.fp32_weights()
    if fused_ops.fused_available(x):  # sigmoid, top-k (or the policy's draw), normalise: one launch
        draw = None
        if moe.policy != "random":
            moe.calls += 1  # as draw_experts: on the device, advances inside a replayed graph too
            draw = (moe.log_p, moe.calls, moe.salt)
        return fused_ops.moe_route(F.linear(x.float(), weight), bias, cfg.top_k, cfg.routed_scaling, draw)
    scores = torch.sigmoid(F.linear(x.float(), weight))  # [N, E_total]
    if moe.policy == "random":
        ids = torch.topk(scores + bias, cfg.top_k, dim=-1).indices
    else:
        ids = draw_experts(moe, x.shape[0])
    w = scores.gather(1, ids)
    return ids, w / w.sum(-1, keepdim=True) * cfg.routed_scaling


def draw_experts(moe: MoE, n: int) -> torch.Tensor:
    """Gumbel top-k over log_p with counter-hash noise: [n, k] distinct global expert ids."""
    moe.calls += 1  # on the device: advances inside a replayed graph too
    u = hash_uniform(moe.calls, moe.salt, n, moe.cfg.n_experts)
    gumbel = -torch.log(-torch.log(u))
    return torch.topk(moe.log_p + gumbel, moe.cfg.top_k, dim=-1).indices


def _wrap(c: int) -> int:
    return c - (1 << 64) if c >= 1 << 63 else c


_GOLDEN, _MIX1, _MIX2 = _wrap(0x9E3779B97F4A7C15), _wrap(0xBF58476D1CE4E5B9), _wrap(0x94D049BB133111EB)


def _shr(z: torch.Tensor, s: int) -> torch.Tensor:
    return (z >> s) & ((1 << (64 - s)) - 1)  # logical shift of int64


def hash_uniform(counter: torch.Tensor, salt: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """[n, m] fp32 in (0, 1): splitmix64 of (counter, salt, row, column), int64 wrap-around math."""
    dev = counter.device
    z = (counter * 1_000_003 + salt) * 1_000_000_007 + torch.arange(n, device=dev)[:, None] * 65_537
    z = z * m + torch.arange(m, device=dev)[None, :] + _GOLDEN
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    z = z ^ _shr(z, 31)
    return ((_shr(z, 40).float() + 0.5) / float(1 << 24)).clamp(1e-7, 1 - 1e-7)


@functools.lru_cache(maxsize=32)
def zipf_exponent(imbalance: float, n_experts: int, k: int, draws: int = 8192) -> float:
    """Zipf exponent s with P(expert 0 among a token's k) = imbalance * k / n_experts under Gumbel top-k
    from p_i ~ (i + 1)^-s (Monte Carlo with common random numbers, bisection)."""
    if imbalance <= 1.0:
        return 0.0
    gen = torch.Generator().manual_seed(0)
    g = -torch.log(-torch.log(torch.rand(draws, n_experts, generator=gen).clamp(1e-7, 1 - 1e-7)))
    ranks = torch.log(torch.arange(1, n_experts + 1, dtype=torch.float32))

    def hot_share(s: float) -> float:
        top = torch.topk(-s * ranks + g, k, dim=-1).indices
        return float((top == 0).any(-1).float().mean()) * n_experts / k

    lo, hi = 0.0, 8.0
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if hot_share(mid) < imbalance else (lo, mid)
    return (lo + hi) / 2


def policy_log_p(cfg: ModelConfig, salt: int, seed: int) -> torch.Tensor:
    """Log-popularity [n_experts] of the routing policy for one layer (zeros: uniform)."""
    name, imbalance = parse_routing(cfg.routing)
    if name != "skewed":
        return torch.zeros(cfg.n_experts)
    s = zipf_exponent(imbalance, cfg.n_experts, cfg.top_k)
    perm = torch.randperm(cfg.n_experts, generator=torch.Generator().manual_seed(seed * 7919 + salt))
    log_p = torch.empty(cfg.n_experts)
    log_p[perm] = -s * torch.log(torch.arange(1, cfg.n_experts + 1, dtype=torch.float32))
    return log_p


# ---------------------------------------------------------------------------- the module


class MoE(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        E, I, D = cfg.local_experts, cfg.moe_intermediate, cfg.hidden
        self.cfg = cfg
        self.gate = Router(cfg)
        if cfg.expert_quant == "int4":
            G = cfg.expert_group
            int32 = dict(dtype=torch.int32)
            self.experts_gate_up_packed = nn.Parameter(torch.empty(E, 2 * I, D // 8, **int32), requires_grad=False)
            self.experts_gate_up_scale = nn.Parameter(torch.empty(E, 2 * I, D // G))  # [E, 2I, D/G]
            self.experts_down_packed = nn.Parameter(torch.empty(E, D, I // 8, **int32), requires_grad=False)
            self.experts_down_scale = nn.Parameter(torch.empty(E, D, I // G))  # [E, D, I/G]
        else:
            self.experts_gate_up = nn.Parameter(torch.empty(E, 2 * I, D))  # [E, 2I, D]
            self.experts_down = nn.Parameter(torch.empty(E, D, I))  # [E, D, I]
        self.shared_experts = DenseMLP(D, cfg.local_shared_intermediate)
        self.impl = "loop"  # loop (eager, exact groups) | grouped_mm | dense | w4a16 (graph-safe)
        self.policy = parse_routing(cfg.routing)[0]
        self.register_buffer("log_p", torch.zeros(cfg.n_experts), persistent=False)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64), persistent=False)
        self.register_buffer("salt", torch.zeros((), dtype=torch.int64), persistent=False)

    @property
    def int4(self) -> bool:
        return self.cfg.expert_quant == "int4"

    def reset_routing(self, salt: int, seed: int = 0) -> None:
        """Set this layer's policy state (after materialize: buffers start uninitialized)."""
        self.log_p.copy_(policy_log_p(self.cfg, salt, seed))
        self.calls.zero_()
        self.salt.fill_(salt)

    def forward(self, x, step, timer=None):
        timer = timer or _null_timer
        B, T, D = x.shape
        flat = x.reshape(-1, D)
        E = self.cfg.local_experts
        with timer("moe-route"):
            ids, w = route(flat, self)
            lo, _ = expert_range(self.cfg)
            if self.impl == "grouped_mm" and fused_ops.fused_available(flat):  # sort + load count: one launch
                plan = fused_ops.moe_plan(ids, lo, E, step.next_load_row())
            else:
                local = ids - lo  # [N, k]; outside [0, E) = another rank's expert
                valid = (local >= 0) & (local < E)
                step.count_experts(local, valid)
        if self.impl == "grouped_mm" and fused_ops.fused_available(flat):
            out = experts_planned(self, flat, plan, w, timer)
        else:
            out = EXPERT_IMPLS[self.impl](self, flat, local, w, valid, timer)
        with timer("moe-shared"):
            return (out + self.shared_experts(flat)).view(B, T, D)  # this rank's partial sum

    def dequantized(self, e=slice(None), dtype=None):
        """(gate_up [.., 2I, D], down [.., D, I]) of experts e in dtype (INT4: q * scale; else the params)."""
        if not self.int4:
            return self.experts_gate_up[e], self.experts_down[e]
        from kdengine.ops.int4 import dequantize_int4

        dtype = dtype or self.experts_gate_up_scale.dtype
        G = self.cfg.expert_group
        gu = dequantize_int4(self.experts_gate_up_packed[e], self.experts_gate_up_scale[e], dtype, G)
        return gu, dequantize_int4(self.experts_down_packed[e], self.experts_down_scale[e], dtype, G)


# ---------------------------------------------------------------------------- expert paths
# Each path: (moe, x [N, D], local [N, k], w [N, k], valid [N, k], timer) -> [N, D]; timer(name) times
# the path's parts (MOE_OPS in kdengine.engine.profiler) where the path has them.


@contextlib.contextmanager
def _null(_name):
    yield


def _null_timer(name):
    return _null(name)



def swiglu(h: torch.Tensor) -> torch.Tensor:
    g, u = h.chunk(2, dim=-1)
    return F.silu(g) * u


def experts_loop(moe: MoE, x, local, w, valid, timer=_null_timer):
    """Eager grouped compute: one matmul pair per active expert (reads counts on the host)."""
    out = torch.zeros_like(x, dtype=torch.float32)
    rows, slots = valid.nonzero(as_tuple=True)
    experts = local[rows, slots]
    for e in experts.unique().tolist():
        sel = experts == e
        r = rows[sel]
        gate_up, down = moe.dequantized(e, x.dtype)
        h = swiglu(x[r] @ gate_up.t()) @ down.t()
        out.index_put_((r,), h.float() * w[r, slots[sel]][:, None], accumulate=True)
    return out.to(x.dtype)


def sort_assignments(local, valid, E: int):
    """Assignments sorted by local expert (other ranks' experts last): order [N*k], offs [E] int32."""
    key = torch.where(valid, local, torch.full_like(local, E)).flatten()
    order = torch.sort(key, stable=True).indices
    counts = torch.zeros(E + 1, dtype=torch.int32, device=local.device).scatter_add_(
        0, key, torch.ones_like(key, dtype=torch.int32)
    )
    return order, key[order], torch.cumsum(counts[:E], 0, dtype=torch.int32)


def experts_grouped_mm(moe: MoE, x, local, w, valid, timer=_null_timer):
    """Graph-safe grouped GEMM (torch._grouped_mm) over assignments sorted by expert (INT4 experts
    are dequantized whole first: a reference path, not a fast one)."""
    E, k = moe.cfg.local_experts, local.shape[1]
    with timer("moe-dispatch"):
        order, key, offs = sort_assignments(local, valid, E)
        rows = order // k
        a = x[rows]  # [N*k, D]
    y = grouped_ffn(moe, a, offs, timer)  # [N*k, D]
    with timer("moe-combine"):
        if fused_ops.fused_available(x):  # one launch; reads only the valid slots' rows
            inv = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=x.device))
            return fused_ops.moe_combine(y, inv.view(-1, k), w, valid)
        scale = w.flatten()[order].float()
        y = torch.where((key < E)[:, None], y.float() * scale[:, None], torch.zeros((), device=x.device))
        # Un-sort with a permutation (unique indices) and sum each token's k rows: deterministic, no atomics.
        unsorted = torch.empty_like(y).index_copy_(0, order, y)
        return unsorted.view(-1, k, y.shape[-1]).sum(1).to(x.dtype)


def experts_planned(moe: MoE, x, plan, w, timer=_null_timer):
    """The grouped_mm path from a fused_ops.moe_plan (slots already sorted by expert, loads counted):
    gather the sorted rows, the two grouped GEMMs, and the fused combine."""
    rows, inv, offs, valid = plan
    with timer("moe-dispatch"):
        a = x[rows]  # [N*k, D]
    y = grouped_ffn(moe, a, offs, timer)
    with timer("moe-combine"):
        return fused_ops.moe_combine(y, inv, w, valid)


def grouped_ffn(moe: MoE, a, offs, timer=_null_timer):
    """SwiGLU experts over rows a [N*k, D] grouped by expert (offs [E]: end of each group) -> [N*k, D]
    (rows past offs[-1] are not written)."""
    gate_up, down = moe.dequantized(dtype=a.dtype)
    with timer("moe-gate-up"):
        h = swiglu(torch._grouped_mm(a, gate_up.transpose(1, 2), offs=offs))
    with timer("moe-down"):
        return torch._grouped_mm(h, down.transpose(1, 2), offs=offs)


def experts_dense(moe: MoE, x, local, w, valid, timer=_null_timer):
    """Graph-safe fallback: every local expert on every token, weighted by the routing (reads all
    E experts' weights; use only where grouped_mm is unavailable)."""
    E = moe.cfg.local_experts
    slot = torch.where(valid, local, E)  # [N, k]; E collects other ranks' experts
    gates = torch.zeros(x.shape[0], E + 1, device=x.device).scatter_add_(1, slot, w.float())[:, :E]  # [N, E]
    gate_up, down = moe.dequantized(dtype=x.dtype)
    h = swiglu(torch.einsum("nd,efd->enf", x, gate_up))
    y = torch.einsum("enf,edf->end", h, down)
    return torch.einsum("end,ne->nd", y.float(), gates).to(x.dtype)


def experts_w4a16(moe: MoE, x, local, w, valid, timer=_null_timer):
    """INT4 experts through the Triton W4A16 grouped kernel (kdengine.ops.moe_w4a16; graph-safe)."""
    if not moe.int4:
        raise ValueError("impl: 'w4a16' needs INT4 experts (cfg.expert_quant='int4'), got dense experts")
    from kdengine.ops.moe_w4a16 import moe_w4a16

    return moe_w4a16(x, local, valid, w, moe.experts_gate_up_packed, moe.experts_gate_up_scale,
                     moe.experts_down_packed, moe.experts_down_scale, group=moe.cfg.expert_group)


EXPERT_IMPLS = {"loop": experts_loop, "grouped_mm": experts_grouped_mm, "dense": experts_dense, "w4a16": experts_w4a16}


# ---------------------------------------------------------------------------- what a step reads


def moe_bytes(cfg: ModelConfig, experts_touched: float, moe_layers: int) -> float:
    """Bytes one step's MoE layers read: router and shared expert of every MoE layer plus the weights
    of every expert touched (summed over layers); activations are not counted (a few MB)."""
    e = 2 if cfg.dtype == "bfloat16" else (4 if cfg.dtype == "float32" else 8)
    fixed = e * (cfg.n_experts * cfg.hidden + 3 * cfg.hidden * cfg.local_shared_intermediate)
    return moe_layers * fixed + experts_touched * expert_bytes(cfg)


def moe_report(cfg: ModelConfig, touched_per_step: float, moe_ms: float, step_ms: float) -> dict:
    """The MoE numbers of a decode result: experts touched per step (all layers), per layer, bytes read
    per step, MoE share of the step, and the MoE phase's effective bandwidth (bytes / phase time)."""
    layers = max(cfg.n_layers - cfg.first_dense, 0)
    b = moe_bytes(cfg, touched_per_step, layers) if layers else 0.0
    return {
        "experts_touched": touched_per_step,
        "experts_touched_per_layer": touched_per_step / layers if layers else 0.0,
        "moe_bytes_per_step": b,
        "moe_share": moe_ms / step_ms if step_ms > 0 else 0.0,
        "moe_gbps": b / (moe_ms * 1e-3) / 1e9 if moe_ms > 0 else 0.0,
    }


def expected_touched(n_assign_local: float, E: int) -> float:
    """Experts touched when n assignments fall uniformly on E experts: E * (1 - (1 - 1/E)^n)."""
    return E * (1 - math.pow(1 - 1 / E, n_assign_local))


# ---------------------------------------------------------------------------- engine settings


WEIGHTS = {"dense": "none", "int4": "int4"}  # --weights value -> cfg.expert_quant


def expert_quant_for(weights: str) -> str:
    if weights not in WEIGHTS:
        raise ValueError(f"weights: expected one of {sorted(WEIGHTS)}, got {weights!r}")
    return WEIGHTS[weights]


def expert_impl_for(cfg: ModelConfig, device_impl: str) -> str:
    """The expert path for this config given the device's dense choice (graphs.choose_expert_impl):
    INT4 experts take the W4A16 kernel wherever a graph-safe path was chosen (CUDA), else the loop."""
    if cfg.expert_quant == "int4" and device_impl != "loop":
        return "w4a16"
    return device_impl
