// The torch-free launch entry point of the verify kernels (implemented in verify_kernel.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>

namespace kdengine {

// Function attributes (cudaFuncSetAttribute) belong to the current device's context: a process launching on several
// GPUs must set them on each. configured_here(done): whether the current device's bit is set in `done`; mark_here(done)
// sets it. Devices past 63 have no bit and are configured on every call.
inline unsigned long long device_bit() {
  int dev = 0;
  cudaGetDevice(&dev);
  return dev >= 0 && dev < 64 ? 1ull << dev : 0ull;
}
inline bool configured_here(const std::atomic<unsigned long long>& done) {
  const unsigned long long bit = device_bit();
  return bit != 0 && (done.load(std::memory_order_acquire) & bit) != 0;
}
inline void mark_here(std::atomic<unsigned long long>& done) { done.fetch_or(device_bit(), std::memory_order_release); }

// The MLA shape contract, once for C++ (kdengine/ops/shapes.py mirrors it; the binding exports these and
// Python checks them on load; tests/ops/test_shapes.py compares this header with it on the CPU).
constexpr int DV = 512;             // latent dims; V is the first DV dims of a KV row
constexpr int D_ROPE = 64;          // rope dims appended to the latent
constexpr int D_QK = DV + D_ROPE;   // 576: the dims of q and of a KV row
constexpr int ROWS_PER_GROUP = 16;  // query rows per m16 group
constexpr int MAX_ROW_GROUPS = 4;   // 16-row groups a split-kernel block may hold (1, 2 or 4)
// pingpong values of the mma.sync split kernel are 0 .. NUM_PINGPONGS - 1 (2 and up: col_warps 16 only; see
// launch_verify below and kdengine/ops/cuda_backend.py PINGPONGS): the binding checks against this one constant
constexpr int NUM_PINGPONGS = 16;

// Device pointers and sizes of one call (R = T * H query rows per sequence, W = ceil(T / 32)).
struct VerifyParams {
  const __nv_bfloat16* q;  // [B, R, 576]
  const __nv_bfloat16* kv;  // [P, page_size, 576]
  const int* page_table;  // [B, max_pages]
  const int* prefix_len;  // [B], read on the device only
  const int* mask_bits;  // [B, T, W]
  __nv_bfloat16* part_out;  // [B, nsplit, R, 512] split partials, normalised (bf16: half the merge's bytes)
  float* part_lse;  // [B, nsplit, R] natural log, -inf for an empty split
  __nv_bfloat16* out;  // [B, R, 512]
  float* lse;  // [B, R] natural log
  int B, T, H, R, W;
  int page_size, page_shift, max_pages, nsplit;
  float scale_log2;  // sm_scale * log2(e)
  // 1 = the split kernel lets its programmatic dependent (the merge) launch as soon as every block has started (the
  // merge's blocks then wait on the SMs the split grid leaves idle or frees); 0 = only before its partial writes
  // (sm90 kernel; wide2 / lean mma.sync kernels; the other mma.sync layouts never trigger early)
  int merge_early;
  // 1 = merge 7 (the sm90 path's) discards the L2 lines of the partial rows it has read (discard.global.L2: partials
  // never read again are not written back); launch_verify_sm90 sets it for the sm90 schedules that store them
  // evict_last (sm90_discards_partials). The other merges ignore it.
  int discard;
};

// Query rows per block follow R = T * H: 16, 32 or 64 rows (1, 2 or 4 groups of 16), at most
// 16 * max_row_groups (smaller blocks: more of them per SM, each KV tile read by more blocks from L2).
int row_groups(int R, int max_row_groups);
int row_tiles(int R, int max_row_groups);
// Split-kernel blocks of that layout resident per SM on the current device (occupancy API).
int blocks_per_sm(int R, int col_warps, int max_row_groups, int pingpong);

// Split kernel then log-sum-exp merge, both on `stream`; fills p.out and p.lse. col_warps: warps per
// 16-row group, 2 or 4 (see verify_kernel.cuh), 8 for the wide layout (verify_wide.cuh, 32 or 64
// rows per block) or 16 for its streaming variant "wide2"; combine: 0 = one loop over the splits per
// thread, 1 = splits weighted in parallel first, then batched loads in 4 thread groups, 2 = the same
// in COMBINE_COL_CHUNKS blocks per row of 128 columns each, 8 thread groups over the splits (1 and 2
// need nsplit <= 1024, else 0 is used), 4 = "grouped": one warp per split group keeps its own
// log-sum-exp state, one barrier (any nsplit; verify_kernel.cuh); 7 (both paths' default) = 4 with its blocks spread over the
// SMs (merge_spread.h); 3 (the older grouped merge, slower than 4:
// perf_history/kernel/merge2_b44f69a/, its source in the git history up to d403430) was retired;
// pingpong (wide layouts only): 1 = the two row halves run softmax and P*V in opposite orders; 2 (wide2
// only) = both halves run P*V in two column halves, one beside Q*K^T, one beside the softmax; 3 (wide2 only) =
// the same schedule with less integer work per tile (verify_wide_lean.cuh); 4-11 (wide2 only): its probes
// (kdengine/ops/cuda_backend.py PINGPONGS; 8 the default).
cudaError_t launch_verify(const VerifyParams& p, int col_warps, int max_row_groups, int pingpong, int combine,
                          cudaStream_t stream);

// --- the Hopper path (verify_sm90.cu; sm_90a only) --------------------------------------------------
// Query-row tiles of 64 rows per (sequence, split) of the sm90 kernel.
int sm90_row_tiles(int R);
// nullptr when the sm90 kernel can run this call on the current device, else the reason.
const char* sm90_unsupported(const VerifyParams& p);
// The sm90 split kernel alone (pool_tokens = pages * page_size rows of the KV pool: the TMA bounds);
// schedule (verify_sm90.cuh): 0 = both warpgroups compute S of every tile, 1 = seesaw (they alternate
// S + softmax per tile and share P), 2 = as 0 with the warpgroups' S issue ordered (staggered), 3 = pair
// (each computes S of every other tile, only the row max crosses before P V, both run P V of every tile),
// 4 = half (each computes S of half of every tile's tokens, the row max and P cross, both run P V of all),
// 5 = staggered_small (2 with a smaller consumer loop: the default), 6 = staggered_tail, 7 = seesaw2 (FlashMLA's
// order: each warpgroup computes S of every other tile, 256 threads, no producer warpgroup; its hand-offs between
// the warpgroups on mbarriers), 8 = seesaw2_bar (seesaw2 with those hand-offs on named barriers: a probe).
cudaError_t launch_split_sm90(const VerifyParams& p, long long pool_tokens, int schedule, cudaStream_t stream);
// Whether `schedule` stores its partial rows under an L2 evict_last policy (9 = seesaw2_el), so that its merge discards
// them once read.
bool sm90_discards_partials(int schedule);
// The sm90 split kernel then the merge (the same merge kernels as launch_verify, combine as there;
// combine -1: the split kernel alone, out / lse not written: for timing the merge's share only).
cudaError_t launch_verify_sm90(const VerifyParams& p, long long pool_tokens, int schedule, int combine,
                               cudaStream_t stream);

#ifdef KDENGINE_TIMELINE
// --- the timeline build only (-DKDENGINE_TIMELINE, verify_timeline.cuh) ----------------------------------
// The device address of each translation unit's timeline buffer (timeline::SLOTS records of 16 bytes): the sm90
// kernel's (verify_sm90.cu) and the mma.sync kernels' and merges' (verify_kernel.cu); nullptr on error.
void* timeline_records_sm90();
void* timeline_records_mma();
#endif

}  // namespace kdengine
