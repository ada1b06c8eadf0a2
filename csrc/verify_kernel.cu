// Host launchers of the verify kernels (no torch here: this translation unit also compiles alone
// to PTX for the CI check in tests/ops/test_ptx.py).
#include <atomic>

#include "merge_spread.h"
#include "static_switch.h"
#include "verify_kernel.cuh"
#include "verify_launch.h"
#include "verify_wide.cuh"
#include "verify_wide_lean.cuh"

namespace kdengine {

int row_groups(int R, int max_row_groups) {
  const int needed = R <= 16 ? 1 : (R <= 32 ? 2 : 4);
  return needed < max_row_groups ? needed : max_row_groups;
}

int row_tiles(int R, int max_row_groups) {
  const int m = 16 * row_groups(R, max_row_groups);
  return (R + m - 1) / m;
}

template <class C>
static auto kernel_of() {
  if constexpr (C::WIDE) {
    if constexpr (C::LEAN)
      return verify_split_kernel_lean<C>;
    else
      return verify_split_kernel_wide<C>;
  } else {
    return verify_split_kernel<C>;
  }
}

// A kernel's dynamic shared memory ceiling `smem` and, as its carveout, as much shared memory as the SM has (so two
// blocks fit where the SM allows; sm_90: 227 KB); once per device (`done`: the attributes are per function and device).
template <class Kernel>
static cudaError_t configure_once(std::atomic<unsigned long long>& done, Kernel kernel, int smem) {
  if (configured_here(done)) return cudaSuccess;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err == cudaSuccess) err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
  if (err == cudaSuccess) mark_here(done);
  return err;
}

template <class C>
static cudaError_t configure() {
  static std::atomic<unsigned long long> configured{0};
  return configure_once(configured, kernel_of<C>(), C::SMEM);
}

template <class C>
static cudaError_t launch_split(const VerifyParams& p, cudaStream_t stream) {
  const cudaError_t err = configure<C>();
  if (err != cudaSuccess) return err;
  const dim3 grid((p.R + C::BLOCK_M - 1) / C::BLOCK_M, p.nsplit, p.B);
  kernel_of<C>()<<<grid, C::THREADS, C::SMEM, stream>>>(p);
  return cudaGetLastError();
}

// The split-kernel configuration of (R, col_warps, max_row_groups, pingpong) handed to `fn` as a
// type: col_warps 2 or 4 -> Cfg<RG, CW>; 8 -> the wide layout (at least 32 rows per block), its row
// halves in opposite phase orders when `pingpong`; 16 -> the same with the streaming loader and lazy
// rescaling ("wide2"); 32 -> wide2 with 16 warps and 64 rows per block ("wide2x16"), its row halves
// (8 warps each) in opposite phase orders when `pingpong`. pingpong 2 (wide2 only, "wide2pp2"): the
// halves' P*V split in two column halves around the barrier (WideCfg::SPLIT_PV); pingpong 3: the same
// schedule in its lean form (WideCfg::LEAN, verify_wide_lean.cuh: "wide2pp2_lean") for 64-row blocks,
// wide2pp2 for 32-row blocks; 4: the lean form for 32-row blocks too; 5-11: lean probes (WideCfg::LV) for
// 64-row blocks, wide2pp2 for 32-row blocks (8, all five probe bits); 12-15: the probes of branch mma6 (the same
// at 32 rows; 12, 8 with Q staged through shared memory: the default) (16-17, branch mma8: 12 with less of P*V beside
// Q*K^T, measured even with 12 and dropped: perf_history/kernel/mma8_e949c85/).
template <class F>
static auto with_config(int R, int col_warps, int max_row_groups, int pingpong, F&& fn) {
  return ROWGROUPS_SWITCH(row_groups(R, max_row_groups), RG, [&] {
    return COLWARPS_SWITCH(col_warps, CW, [&] {
      constexpr int WRG = RG < 2 ? 2 : RG;
      if constexpr (CW == 8) {
        return pingpong ? fn(WideCfg<WRG, true>{}) : fn(WideCfg<WRG, false>{});
      } else if constexpr (CW == 16) {  // pingpong 2: both halves split P*V around the barrier (SPLIT_PV)
        // the lean form for 64-row blocks only: at 32 rows (128 registers) it spills more than wide2pp2
        // (sm_90a 60 / 52 bytes against 20 / 28) and was never timed there, so those blocks run wide2pp2
        if constexpr (WRG == 4) {
          if (pingpong == 3 || pingpong == 4) return fn(WideCfg<WRG, true, true, 8, true, true>{});
          // the lean probes of branch mma4 (WideCfg::LV bits): 5 K fragments a k-step ahead (1), 6 tail branch once
          // (2), 7 late KV copy (4), 8 all (31), 9 short softmax (8: shuffles on demand, 16: ex2.approx.ftz),
          // 10 all but 1, 11 all but 2
          if (pingpong == 5) return fn(WideCfg<WRG, true, true, 8, true, true, 1>{});
          if (pingpong == 6) return fn(WideCfg<WRG, true, true, 8, true, true, 2>{});
          if (pingpong == 7) return fn(WideCfg<WRG, true, true, 8, true, true, 4>{});
          if (pingpong == 8) return fn(WideCfg<WRG, true, true, 8, true, true, 31>{});
          if (pingpong == 9) return fn(WideCfg<WRG, true, true, 8, true, true, 24>{});
          if (pingpong == 10) return fn(WideCfg<WRG, true, true, 8, true, true, 30>{});
          if (pingpong == 11) return fn(WideCfg<WRG, true, true, 8, true, true, 29>{});
          // the probes of branch mma6: 8 with Q staged through shared memory (32: all rows after KV tile 0, 64: a row
          // half at a time around tiles 0-2); 12 the default since
          if (pingpong == 12) return fn(WideCfg<WRG, true, true, 8, true, true, 31 | 32>{});
          if (pingpong == 13) return fn(WideCfg<WRG, true, true, 8, true, true, 31 | 64>{});
          // 14: the page-table row pointer warp-uniform (128); 15: 12 + 14
          if (pingpong == 14) return fn(WideCfg<WRG, true, true, 8, true, true, 31 | 128>{});
          if (pingpong == 15) return fn(WideCfg<WRG, true, true, 8, true, true, 31 | 32 | 128>{});
        } else {  // pingpong 4: the lean form at 32 rows too (to time it against wide2pp2 there)
          if (pingpong == 4) return fn(WideCfg<WRG, true, true, 8, true, true>{});
        }
        if (pingpong >= 2) return fn(WideCfg<WRG, true, true, 8, true>{});
        return pingpong ? fn(WideCfg<WRG, true, true>{}) : fn(WideCfg<WRG, false, true>{});
      } else if constexpr (CW == 32) {  // 16 warps: always 64 rows per block
        return pingpong ? fn(WideCfg<4, true, true, 16>{}) : fn(WideCfg<4, false, true, 16>{});
      } else {  // (the discarded branches are still instantiated: outside a template)
        return fn(Cfg<RG, CW == 2 ? 2 : 4>{});
      }
    });
  });
}

int blocks_per_sm(int R, int col_warps, int max_row_groups, int pingpong) {
  int blocks = 0;
  with_config(R, col_warps, max_row_groups, pingpong, [&](auto cfg) {
    using C = decltype(cfg);
    if (configure<C>() == cudaSuccess)
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel_of<C>(), C::THREADS, C::SMEM);
    return 0;
  });
  return blocks;
}

// A merge kernel as a programmatic dependent of the split kernel where the device has it (sm_90+):
// its blocks launch while the split grid drains and wait (pdl_wait_primary) before reading.
template <class Kernel>
static cudaError_t launch_dependent(Kernel kernel, dim3 grid, dim3 block, size_t smem, const VerifyParams& p,
                                    cudaStream_t stream) {
  static int major = -1;  // of the first device launched on; PDL is an optimisation, never needed
  if (major < 0) {
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = major >= 9 ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, p);
}

// Merge 7 (both paths' default; 5 and 6 were merges since removed): the grouped merge with its dynamic shared memory
// raised so that at most k = ceil(blocks / SMs) blocks fit on an SM. Launched as a dependent of the split kernel, the
// merge's blocks otherwise fill the first SMs the split grid frees (up to 4 blocks of 256 threads at T = 16, by
// registers) and the rest of the SMs take none: the timeline of the dispatched call at 65k (perf_history/kernel/
// timeline_e949c85/) had its 256 / 1024 blocks on 66-128 / 92-124 SMs, and the work after the wait release took
// longer the fewer SMs held it (2.6 us on 128 SMs, 3.8-4.1 on 66-74 at T = 16). Measured (perf_history/kernel/
// spread_591e4a6/, spread2_0117714/): on 128-130 SMs every time; after the mma.sync split kernel 1.2-1.4 us faster at
// 4k and 16k T = 16, 0.4 us at T = 64 there, equal at 65k: that path's merge since. After seesaw2 1.6-2.6 us slower at
// 65k T = 64 in the sweep's form (8 calls back to back per graph replay), but equal there at one call per replay and
// faster in the decode engine at every context measured, on both paths (perf_history/kernel/merge_ab_999594e/): the sm90
// path's merge too since. Measured on the H200 only (as merge 4 was). (The first run's merge 7 shared merge 4's kernel, so its
// carveout preference carried over to the merge 4 rows timed after it; their figures equal the first rows'.)
// The padding: merge_spread.h (host arithmetic, tested on its own).
// The current device's limits (a few attribute reads: host lookups, and no host code runs in a graph replay). A failed
// read comes back zero (merge 7 then runs unpadded) with its error cleared, so that the next launch's
// cudaGetLastError does not report it as its own.
static SmemLimits smem_limits() {
  SmemLimits d;
  int dev = 0;
  const bool ok = cudaGetDevice(&dev) == cudaSuccess &&
                  cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess &&
                  cudaDeviceGetAttribute(&d.per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) == cudaSuccess &&
                  cudaDeviceGetAttribute(&d.optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess &&
                  cudaDeviceGetAttribute(&d.reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev) == cudaSuccess;
  if (ok) return d;
  cudaGetLastError();
  return SmemLimits{};
}

// The log-sum-exp merge of the split partials (either split kernel): 7 = 4 spread over the SMs (both paths', above), 4 =
// grouped (any nsplit), 2 =
// chunked (both PDL on sm_90+), 1 = splits weighted in parallel, 0 = one loop per thread (also past
// COMBINE_MAX_NSPLIT for 1 and 2). 3 (the older grouped merge, slower than 4: perf_history/kernel/merge2_b44f69a/)
// was retired; the binding refuses it.
static cudaError_t launch_combine(const VerifyParams& p, int combine, cudaStream_t stream) {
  if (combine == 4) {
    const int groups = merge_groups(p.nsplit);
    return launch_dependent(verify_combine_grouped2_kernel<false>, dim3(p.R, p.B, MERGE_COL_CHUNKS),
                            dim3(32 * groups), merge_smem_bytes(groups), p, stream);
  }
  if (combine == 7) {  // its own instantiation: merge 4's attributes stay as they are
    const int groups = merge_groups(p.nsplit);
    const SmemLimits d = smem_limits();
    static std::atomic<unsigned long long> configured{0}, configured_discard{0};  // the ceiling at the opt-in maximum
    const auto kernel = p.discard ? verify_combine_grouped2_kernel<true, true> : verify_combine_grouped2_kernel<true>;
    if (d.optin > 0) {  // (limits unread: unpadded, within the default ceiling)
      const cudaError_t err = configure_once(p.discard ? configured_discard : configured, kernel, d.optin);
      if (err != cudaSuccess) return err;
    }
    return launch_dependent(kernel, dim3(p.R, p.B, MERGE_COL_CHUNKS), dim3(32 * groups),
                            merge_spread_smem(d, (long long)p.R * p.B * MERGE_COL_CHUNKS, merge_smem_bytes(groups)),
                            p, stream);
  }
  if (combine == 2 && p.nsplit <= COMBINE_MAX_NSPLIT)
    return launch_dependent(verify_combine_chunked_kernel, dim3(p.R, p.B, COMBINE_COL_CHUNKS),
                            dim3(COMBINE_CHUNK_THREADS), 0, p, stream);
  if (combine >= 1 && p.nsplit <= COMBINE_MAX_NSPLIT)
    verify_combine_parallel_kernel<<<dim3(p.R, p.B), COMBINE_PAR_THREADS, 0, stream>>>(p);
  else
    verify_combine_kernel<<<dim3(p.R, p.B), COMBINE_THREADS, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_verify(const VerifyParams& p, int col_warps, int max_row_groups, int pingpong, int combine,
                          cudaStream_t stream) {
  const cudaError_t err = with_config(p.R, col_warps, max_row_groups, pingpong, [&](auto cfg) {
    return launch_split<decltype(cfg)>(p, stream);
  });
  if (err != cudaSuccess) return err;
  return launch_combine(p, combine, stream);
}

cudaError_t launch_verify_sm90(const VerifyParams& params, long long pool_tokens, int schedule, int combine,
                               cudaStream_t stream) {
  VerifyParams p = params;
  p.discard = sm90_discards_partials(schedule) ? 1 : 0;
  const cudaError_t err = launch_split_sm90(p, pool_tokens, schedule, stream);
  if (err != cudaSuccess || combine < 0) return err;
  return launch_combine(p, combine, stream);
}

#ifdef KDENGINE_TIMELINE
KDENGINE_TIMELINE_EXPORT(timeline_records_mma)  // this unit's timeline buffer (verify_timeline.cuh)
#endif

}  // namespace kdengine
