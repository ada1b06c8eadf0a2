"""asv: verify attention, time per layer (one call, H=8) per backend x context x T, an NSPLIT sweep for
the split-KV backends, the peers on the same shapes, and % of the roofline floor. Times are lower-is-better,
% of floor higher."""

from __future__ import annotations

from benchmarks import common
from kdengine.bench import workloads as W


class Verify:
    """GPU: verify/<backend>/ctx<N>/T<T>."""

    params = (list(W.VERIFY_BACKENDS), list(W.CONTEXTS), list(W.TREE_SIZES))
    param_names = ["backend", "context", "T"]
    timeout = 900

    def setup(self, backend, context, T):
        self.workload = common.require(W.verify_workload(backend, context, T))

    def _record(self, *params):
        return common.record(self.workload, "bench_verify.Verify.track_time", params)

    def track_time(self, *params):
        return self._record(*params)["median"]

    def track_roofline_pct(self, *params):
        return self._record(*params)["extra"]["roofline_pct"]

    common.metric(track_time, "seconds", "lower")
    common.metric(track_roofline_pct, "percent", "info")


class VerifyNsplit:
    """GPU: verify-nsplit/<backend>/ctx65536/T<T>/s<S>, the KV split count forced to S."""

    params = (list(W.NSPLIT_BACKENDS), list(W.TREE_SIZES), list(W.NSPLITS))
    param_names = ["backend", "T", "nsplit"]
    timeout = 900

    def setup(self, backend, T, nsplit):
        self.workload = common.require(W.nsplit_workload(backend, T, nsplit))

    def track_time(self, *params):
        return common.record(self.workload, "bench_verify.VerifyNsplit.track_time", params)["median"]

    common.metric(track_time, "seconds", "lower")


class CpuVerify:
    """CPU default (machines without a GPU): cpu-verify/reference/ctx<N>/T<T>."""

    params = (list(W.CPU_CONTEXTS), list(W.CPU_TREE_SIZES))
    param_names = ["context", "T"]
    timeout = 300

    def setup(self, context, T):
        self.workload = common.require(W.cpu_verify_workload(context, T))

    def _record(self, *params):
        return common.record(self.workload, "bench_verify.CpuVerify.track_time", params)

    def track_time(self, *params):
        return self._record(*params)["median"]

    def track_roofline_pct(self, *params):
        return self._record(*params)["extra"]["roofline_pct"]

    common.metric(track_time, "seconds", "lower")
    common.metric(track_roofline_pct, "percent", "info")


class VerifyPeer:
    """GPU: verify-peer/<peer>/ctx<N>/T<T>, the state of the art on the same shapes in the same run
    (FlashMLA, causal tail; kdengine.bench.peers). Skipped where the peer is not installed."""

    params = (list(W.PEER_BACKENDS), list(W.CONTEXTS), list(W.TREE_SIZES))
    param_names = ["peer", "context", "T"]
    timeout = 900

    def setup(self, peer, context, T):
        self.workload = common.require(W.peer_workload(peer, context, T))

    def _record(self, *params):
        return common.record(self.workload, "bench_verify.VerifyPeer.track_time", params)

    def track_time(self, *params):
        return self._record(*params)["median"]

    def track_roofline_pct(self, *params):
        return self._record(*params)["extra"]["roofline_pct"]

    common.metric(track_time, "seconds", "lower")
    common.metric(track_roofline_pct, "percent", "info")
