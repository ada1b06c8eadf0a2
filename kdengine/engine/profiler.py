"""Per-phase step timing and the MoE expert-load histogram.

Phases (ms per step, they add up to the step): draft, tree, mask, verify-attention (the
verify_attention calls), verify-moe (router + experts + shared expert), other (the rest of the target
forward: projections, norms, embedding, LM head) and accept/commit. The whole target forward is timed
as `verify` and reported as those three parts. On CUDA each phase is a pair of CUDA
events resolved once at summary() (no host sync per step); on the CPU, perf_counter. A phase that
occurs several times in a step (once per layer) is summed. Expert load: tokens routed to each local
expert per step, summed over MoE layers; imbalance = max / mean per step; experts touched = local
experts with at least one token, summed over MoE layers (the step's loads are kept per layer).
"""

from __future__ import annotations

import contextlib
import time

import torch

PHASES = ("draft", "tree", "mask", "verify-attention", "verify-moe", "other", "accept/commit")
VERIFY = "verify"  # timed around the whole target forward; reported as its three parts
COMM = "all-reduce"  # TP collectives, timed inside the phases above: reported apart by comm_ms()
# The ops of the target forward outside attention and MoE ("other"), timed by the model's timer calls.
# op_ms() reports each (summed over layers) and OTHER_REST for the part of "other" no op covers
# (the feature layers' residual adds, event gaps). attn-norm and post-norm include the residual add
# fused into them (model.add_rms_norm).
OTHER_OPS = ("embed", "attn-norm", "post-norm", "qkv-down-proj", "q/kv-norm", "q-up-proj", "rope", "kv-write", "absorb-q",
             "absorb-o", "o-proj", "dense-mlp", "lm-head")
OTHER_REST = "other-rest"
# The parts of verify-moe, timed by the MoE module (its expert path's parts where it has them);
# moe_op_ms() reports each (summed over layers) and MOE_REST for the rest of verify-moe.
MOE_OPS = ("moe-route", "moe-dispatch", "moe-gate-up", "moe-down", "moe-combine", "moe-shared")
MOE_REST = "moe-rest"


class Profiler:
    def __init__(self, device, enabled: bool = True):
        self.cuda = torch.device(device).type == "cuda"
        self.enabled = enabled
        self.steps: list[list[tuple[str, object, object]]] = []
        self.loads: list[torch.Tensor] = []
        self.current: list = []

    @contextlib.contextmanager
    def phase(self, name: str):
        if not self.enabled:
            yield
            return
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
        else:
            start = time.perf_counter()
            yield
            end = time.perf_counter()
        self.current.append((name, start, end))

    def timer(self, name: str):
        """The callable the model takes to time its inner phases."""
        return self.phase(name)

    def add_replayed(self, marks: list[tuple[str, float]]) -> None:
        """Ops timed inside a graph replay (GraphOpTimer.read()), as (name, ms) pairs of this step."""
        if self.enabled:
            self.current.extend((name, ms, None) for name, ms in marks)

    def end_step(self, expert_load: torch.Tensor | None = None) -> None:
        if self.enabled:
            self.steps.append(self.current)
            if expert_load is not None:
                self.loads.append(expert_load.detach().clone())
        self.current = []

    def reset(self) -> None:
        self.steps, self.loads, self.current = [], [], []

    # ------------------------------------------------------------------ results

    def elapsed_ms(self, start, end) -> float:
        if end is None:  # resolved already (add_replayed)
            return start
        return start.elapsed_time(end) if self.cuda else (end - start) * 1e3

    def phase_ms(self) -> dict[str, float]:
        """Mean ms per step of each phase of PHASES (0.0 for a phase never entered)."""
        if self.cuda:
            torch.cuda.synchronize()
        totals = dict.fromkeys((*PHASES, VERIFY), 0.0)
        for step in self.steps:
            for name, start, end in step:
                totals[name] = totals.get(name, 0.0) + self.elapsed_ms(start, end)
        n = max(len(self.steps), 1)
        means = {k: v / n for k, v in totals.items()}
        means["other"] = max(means.pop(VERIFY) - means["verify-attention"] - means["verify-moe"], 0.0)
        return {k: means[k] for k in PHASES}  # ops (op_ms) and COMM (comm_ms) are reported apart

    def op_ms(self) -> dict[str, float]:
        """Mean ms per step of each op of OTHER_OPS that was timed, then OTHER_REST (the rest of
        "other"); empty when no op was timed (graph replays, or a model without op timers)."""
        return self._parts(OTHER_OPS, "other", OTHER_REST)

    def moe_op_ms(self) -> dict[str, float]:
        """Mean ms per step of each op of MOE_OPS that was timed, then MOE_REST (the rest of
        verify-moe: the all-reduce, event gaps); empty when none was timed."""
        return self._parts(MOE_OPS, "verify-moe", MOE_REST)

    def _parts(self, names, phase: str, rest: str) -> dict[str, float]:
        """Mean ms per step of each of `names` that was timed, then `rest`: what `phase` holds besides."""
        totals = self._sums(names)
        if not totals:
            return {}
        n = max(len(self.steps), 1)
        out = {k: totals[k] / n for k in names if k in totals}
        out[rest] = max(self.phase_ms()[phase] - sum(out.values()), 0.0)
        return out

    def _sums(self, names) -> dict[str, float]:
        if self.cuda:
            torch.cuda.synchronize()
        totals: dict[str, float] = {}
        for step in self.steps:
            for name, start, end in step:
                if name in names:
                    totals[name] = totals.get(name, 0.0) + self.elapsed_ms(start, end)
        return totals

    def verify_ms(self) -> float:
        """Mean ms per step of the whole target forward (VERIFY)."""
        return sum(self._sums((VERIFY,)).values()) / max(len(self.steps), 1)

    def comm_ms(self) -> float:
        """Mean ms per step spent in TP collectives (already inside the phases of phase_ms)."""
        if self.cuda:
            torch.cuda.synchronize()
        total = sum(self.elapsed_ms(a, b) for step in self.steps for name, a, b in step if name == COMM)
        return total / max(len(self.steps), 1)

    def _loads(self) -> torch.Tensor:
        """[steps, layers, E] (a [E] load per step counts as one layer)."""
        loads = torch.stack(self.loads).float()
        return loads[:, None] if loads.dim() == 2 else loads

    def moe_load(self) -> list[float]:
        """Mean tokens per local expert per step (summed over MoE layers)."""
        if not self.loads:
            return []
        return self._loads().sum(1).mean(0).tolist()

    def experts_touched(self) -> float:
        """Mean over steps of the local experts that got a token, summed over MoE layers."""
        if not self.loads:
            return 0.0
        return float((self._loads() > 0).sum((1, 2)).float().mean())

    def moe_imbalance(self) -> float:
        """Mean over steps of max/mean expert load (1.0 = perfectly balanced; 0 without MoE)."""
        if not self.loads:
            return 0.0
        loads = self._loads().sum(1)
        ratio = loads.max(1).values / loads.mean(1).clamp_min(1e-9)
        return float(ratio.mean())


class GraphOpTimer:
    """The model's op timer for a CUDA graph capture: each timed region records a pair of external
    timing events (torch.cuda.Event(external=True)) into the graph, so every replay re-records them
    around the replayed kernels. read() after a replay returns this replay's (name, ms) pairs (one
    host sync: a profiling pass, not the timed steps), each less the cost of the event nodes inside
    it (overhead_ms per event node: its own end event and two per nested region; see
    event_overhead_ms). start() forgets the marks of an earlier forward (the capture's warm-up runs)."""

    def __init__(self):
        self.marks: list[tuple[str, object, object, int]] = []
        self.overhead_ms = 0.0

    def start(self) -> None:
        self.marks = []

    @contextlib.contextmanager
    def __call__(self, name: str):
        start, end = (torch.cuda.Event(enable_timing=True, external=True) for _ in range(2))
        before = len(self.marks)
        start.record()
        yield
        end.record()
        self.marks.append((name, start, end, len(self.marks) - before))  # regions nested inside this one

    def read(self) -> list[tuple[str, float]]:
        torch.cuda.synchronize()
        return [(name, corrected_ms(a.elapsed_time(b), nested, self.overhead_ms)) for name, a, b, nested in self.marks]


def event_overhead_ms(profiled_ms: float, replayed_ms: float, pairs: int) -> float:
    """The cost of one event node in a replayed graph: the time the op-timed graph takes beyond the
    plain one, over its 2 * pairs event nodes (0 when it is not slower)."""
    return max(profiled_ms - replayed_ms, 0.0) / (2 * pairs) if pairs else 0.0


def corrected_ms(raw_ms: float, nested: int, overhead_ms: float) -> float:
    """A region's time less its event nodes: its end event and the two of each nested region."""
    return max(raw_ms - overhead_ms * (1 + 2 * nested), 0.0)


# ---------------------------------------------------------------------------- attribution


def leaf_profile(extra: dict) -> dict[str, float]:
    """The additive parts of a decode result's step, ms: its phases, with "other" replaced by its
    ops ("other/<op>") when the result carries op_ms. `extra`: a decode record's extra dict (or a
    DecodeResult.to_dict()) with phase_ms and optionally op_ms."""
    phases = dict(extra.get("phase_ms") or {})
    ops = extra.get("op_ms") or {}
    if ops:
        phases.pop("other", None)
        phases.update({f"other/{k}": v for k, v in ops.items()})
    return phases


def attribute(base_extra: dict, head_extra: dict) -> list[dict]:
    """Which phases and ops moved between a base and a head decode result: one row per part of the
    step {op, base_ms, head_ms, delta_ms, share_of_change}, largest |delta| first. share_of_change =
    delta / (sum of all deltas) (the rows' shares add up to 1; a part that moved against the net
    change has a negative share). When only one side has op_ms, both are compared by phase."""
    base, head = leaf_profile(base_extra), leaf_profile(head_extra)
    if set(base) != set(head) and ("op_ms" in base_extra) != ("op_ms" in head_extra):
        base = leaf_profile({"phase_ms": base_extra.get("phase_ms")})
        head = leaf_profile({"phase_ms": head_extra.get("phase_ms")})
    names = list(dict.fromkeys([*base, *head]))
    deltas = {k: head.get(k, 0.0) - base.get(k, 0.0) for k in names}
    total = sum(deltas.values())
    rows = [
        {"op": k, "base_ms": base.get(k, 0.0), "head_ms": head.get(k, 0.0), "delta_ms": d,
         "share_of_change": d / total if total else 0.0}
        for k, d in deltas.items()
    ]
    return sorted(rows, key=lambda r: -abs(r["delta_ms"]))
