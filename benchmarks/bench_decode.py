"""asv: engine decode throughput. track_tok_per_s is tok/s, HIGHER IS BETTER (direction "higher");
mean accepted length and verify attention's share of a step are tracked beside it for context."""

from __future__ import annotations

from benchmarks import common
from kdengine.bench import workloads as W


class Decode:
    """GPU: decode/<backend>/ctx<N> (kimi-k2-tp8-rank, 8 layers, budget 63, acceptance replay, uniform
    routing). `version` replaces asv's source hash for every metric of the class: bump it by hand when
    the workload behind them changes (the gate then starts a new series instead of comparing across)."""

    params = (list(W.DECODE_BACKENDS), list(W.CONTEXTS))
    param_names = ["backend", "context"]
    timeout = 1200
    version = "uniform-routing-1"  # was the source hash under random (router) routing

    def setup(self, backend, context):
        self.workload = common.require(W.decode_workload(backend, context))

    def _record(self, *params):
        return common.record(self.workload, "bench_decode.Decode.track_tok_per_s", params)

    def track_tok_per_s(self, *params):
        return self._record(*params)["median"]

    def track_mean_accept(self, *params):
        return self._record(*params)["extra"]["mean_accept"]

    def track_attention_share(self, *params):
        """% of a step spent in verify attention (the profiler's `verify-attention` phase)."""
        return 100.0 * self._record(*params)["extra"]["phase_share"].get("verify-attention", float("nan"))

    def track_step_over_floor(self, *params):
        """Step time / the step's memory floor (weights and experts touched, KV, drafter, over the
        measured copy bandwidth; kdengine.engine.run): 1.0 = at the floor."""
        return self._record(*params)["extra"].get("step_over_floor", float("nan"))

    common.metric(track_tok_per_s, "tok/s", "higher")
    common.metric(track_mean_accept, "tokens", "higher")
    common.metric(track_attention_share, "percent", "info")
    common.metric(track_step_over_floor, "ratio", "info")


class CpuDecode:
    """CPU default (machines without a GPU): cpu-decode/reference/ctx256 on the tiny config."""

    timeout = 300

    def setup(self):
        self.workload = common.require(W.cpu_decode_workload())

    def _record(self):
        return common.record(self.workload, "bench_decode.CpuDecode.track_tok_per_s", ())

    def track_tok_per_s(self):
        return self._record()["median"]

    def track_mean_accept(self):
        return self._record()["extra"]["mean_accept"]

    common.metric(track_tok_per_s, "tok/s", "higher")
    common.metric(track_mean_accept, "tokens", "higher")


class TreeBuild:
    """GPU: tree/device/budget63, the DDTree build and its ancestor mask at budget 63 from one drafter
    output (kimi drafter: 16 positions x top-8), graph-replayed; seconds, lower is better (target 0.2 ms)."""

    timeout = 300

    def setup(self):
        self.workload = common.require(W.tree_workload("cuda"))

    def track_time(self):
        return common.record(self.workload, "bench_decode.TreeBuild.track_time", ())["median"]

    common.metric(track_time, "seconds", "lower")


class CpuTreeBuild:
    """CPU default: cpu-tree/device/budget15 (tiny drafter: top-4)."""

    timeout = 300

    def setup(self):
        self.workload = common.require(W.tree_workload("cpu"))

    def track_time(self):
        return common.record(self.workload, "bench_decode.CpuTreeBuild.track_time", ())["median"]

    common.metric(track_time, "seconds", "lower")


class DecodeInt4:
    """GPU: decode-int4/<backend>/ctx<N>: the whole 61-layer kimi-k2-tp8-rank with INT4 experts (W4A16
    kernel) under uniform routing, budget 63, acceptance replay mean 5; tok/s, higher is better."""

    params = (list(W.DECODE_INT4_BACKENDS), list(W.CONTEXTS))
    param_names = ["backend", "context"]
    timeout = 1800

    def setup(self, backend, context):
        self.workload = common.require(W.decode_int4_workload(backend, context))

    def _record(self, *params):
        return common.record(self.workload, "bench_decode.DecodeInt4.track_tok_per_s", params)

    def track_tok_per_s(self, *params):
        return self._record(*params)["median"]

    def track_moe_share(self, *params):
        """% of a step spent in the MoE phase (router, routed experts, shared expert)."""
        return 100.0 * self._record(*params)["extra"]["moe"].get("moe_share", float("nan"))

    def track_experts_touched(self, *params):
        """Local experts that got a token per step, summed over the 60 MoE layers."""
        return self._record(*params)["extra"]["moe"].get("experts_touched", float("nan"))

    common.metric(track_tok_per_s, "tok/s", "higher")
    common.metric(track_moe_share, "percent", "info")
    common.metric(track_experts_touched, "count", "info")
