// The KV stream of the sm90 split kernel alone: what its shared-memory ring lets through with no math.
//
// Each block streams its split's KV pages (64 tokens x 576 bf16 = 72 KB, 9 TMA boxes of 64 dims with the
// 128-byte swizzle, as csrc/verify_sm90.cu's pool map) through STAGES buffers of one page, with the kernel's
// launch shape: grid (row tiles, splits), the row tiles of a split adjacent and reading the same pages through a
// shuffled page table, Q (one 72 KB tile per row tile, the same for every split) loaded first when Q = 1.
// - One thread waits for a page, holds its stage for HOLD ns (a %clock64 spin at the SM clock measured first; the
//   hold stands for the time the kernel's readers keep a stage, S to the last P V), then reissues the stage with the
//   page STAGES ahead. HOLD = 0 is the ring's own limit.
// - OW = 1 (the kernel's ring: 2 stages and Q, holds from 1.2 us): each stage has its own thread that waits for its
//   page, holds it and reissues it, so a stage is reissued only after its own hold and its next page is waited for
//   at once (seesaw2's order: a stage is reloaded when its last reader is done, and its next S follows); sweeping
//   HOLD finds the hold at which the stream's period per page takes what the kernel's step takes.
// - PF > 0 (the kernel's ring): row tile 0's block also prefetches into L2, at each reissue, the page PF of its
//   thread's pages past the one reissued (cp.async.bulk.prefetch.tensor, 9 boxes; "a": every block prefetches).
//
// usage: stream_floor [reps]   (H200: nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Icsrc; no -lcuda)
// Prints the device (name, driver and runtime versions), the SM clock and %globaltimer's step, then one line per
// (shape, stages, Q, hold, pf, ow), the "empty" grid (no pages: launch, barrier init, the events' gaps) first: the
// median us of `reps` launches, each after an L2 flush, timed by CUDA events; per block GB/s and the grid's L2 -> SM
// TB/s; from the last launch, the median block's time (its first thread's) per page waiting for it to land and per
// reload issuing its 9 boxes, and its loop's time per page it served (%clock64, at the measured SM clock).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "cuda_check.h"
#include "sm90_ptx.cuh"  // csrc/: the kernel's mbarrier and TMA wrappers

namespace {

constexpr int D = 576, BN = 64, CHUNKS = 9, CHUNK = 64 * BN * 2, TILE = CHUNKS * CHUNK, MAX_TILES = 3;

struct Args {
  int stages, q, tiles;
  long long hold_cycles;
  int prefetch;            // row tile 0's block (every block: prefetch_all) prefetches into L2 the page this many
  int prefetch_all;        //   of its thread's pages past the one it reissues
  int owners;              // 1: stage s has its own thread (lane 0 of warp s) that waits, holds and reissues it
  const int* pages;        // [splits][tiles]
  long long* wait_issue;   // [blocks][3]: the (first) thread's cycles waiting for pages, issuing reloads, in its loop
};

using kdengine::sm90::mbar_expect_tx;
using kdengine::sm90::mbar_init;
using kdengine::sm90::mbar_wait;
using kdengine::sm90::smem_u32;
using kdengine::sm90::tma_load;
using kdengine::sm90::tma_prefetch;

__device__ __forceinline__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void load_tile(uint32_t dst, const CUtensorMap* map, int row, uint32_t bar) {
  mbar_expect_tx(bar, TILE);
  for (int c = 0; c < CHUNKS; ++c) tma_load(dst + c * CHUNK, map, c * 64, row, bar);
}

__device__ __forceinline__ void prefetch_tile(const CUtensorMap* map, int row) {
  for (int c = 0; c < CHUNKS; ++c) tma_prefetch(map, c * 64, row);
}

__global__ void __launch_bounds__(128) stream_kernel(const __grid_constant__ CUtensorMap kv,
                                                     const __grid_constant__ CUtensorMap qmap, Args a) {
  extern __shared__ unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t bars[MAX_TILES + 1];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;  // the 128-byte swizzle's 1 KB alignment
  const uint32_t stage0 = base + (a.q ? TILE : 0);
  const uint32_t bar0 = smem_u32(bars), qbar = bar0 + 8 * MAX_TILES;
  if (threadIdx.x == 0) {
    for (int i = 0; i <= MAX_TILES; ++i) mbar_init(bar0 + 8 * i, 1);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  }
  __syncthreads();
  // one thread serves every stage, or (owners) lane 0 of warp s serves stage s
  const int owner = a.owners ? static_cast<int>(threadIdx.x) / 32 : 0;
  if (a.owners ? threadIdx.x % 32 != 0 || owner >= a.stages : threadIdx.x != 0) return;
  const int step = a.owners ? a.stages : 1;  // the thread's pages: every one, or its stage's
  const int* pages = a.pages + blockIdx.y * a.tiles;
  if (a.q && owner == 0) load_tile(base, &qmap, blockIdx.x * BN, qbar);
  for (int t = owner; t < a.stages && t < a.tiles; t += step)
    load_tile(stage0 + t * TILE, &kv, pages[t] * BN, bar0 + 8 * t);
  const int pf = blockIdx.x == 0 || a.prefetch_all ? a.prefetch : 0;
  for (int t = owner + a.stages; t < owner + a.stages + pf * step && t < a.tiles; t += step)
    prefetch_tile(&kv, pages[t] * BN);
  if (a.q) mbar_wait(qbar, 0);
  long long waited = 0, issuing = 0;
  const long long loop0 = clock64();
  for (int t = owner; t < a.tiles; t += step) {
    const int st = t % a.stages;
    const long long w0 = clock64();
    mbar_wait(bar0 + 8 * st, (t / a.stages) & 1);
    waited += clock64() - w0;
    if (a.hold_cycles > 0) {
      const long long c0 = clock64();
      while (clock64() - c0 < a.hold_cycles) {
      }
    }
    if (t + a.stages < a.tiles) {
      const long long i0 = clock64();
      load_tile(stage0 + st * TILE, &kv, pages[t + a.stages] * BN, bar0 + 8 * st);
      issuing += clock64() - i0;
    }
    if (pf && t + a.stages + pf * step < a.tiles) prefetch_tile(&kv, pages[t + a.stages + pf * step] * BN);
  }
  if (owner != 0) return;
  const int block = blockIdx.y * gridDim.x + blockIdx.x;
  a.wait_issue[3 * block] = waited;
  a.wait_issue[3 * block + 1] = issuing;
  a.wait_issue[3 * block + 2] = clock64() - loop0;
}

// The SM clock (cycles per ns) over a spin of `cycles` on every SM, and %globaltimer's smallest step.
__global__ void spin_kernel(long long cycles, unsigned long long* tick) {
  const long long c0 = clock64();
  while (clock64() - c0 < cycles) {
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    unsigned long long best = ~0ull, prev = now_ns();
    for (int i = 0; i < 4096; ++i) {
      const unsigned long long t = now_ns();
      if (t != prev) best = min(best, t - prev);
      prev = t;
    }
    *tick = best;
  }
}

PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  void* ptr = nullptr;
  cudaDriverEntryPointQueryResult found;
  CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &found));
  if (found != cudaDriverEntryPointSuccess) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled is not available from the driver\n");
    std::exit(1);
  }
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
}

CUtensorMap make_map(void* data, long long rows) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {D, static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {D * 2};
  const cuuint32_t box[2] = {64, BN}, elem[2] = {1, 1};
  if (encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, data, dims, strides, box, elem,
                     CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled failed\n");
    std::exit(1);
  }
  return map;
}

struct Shape {
  const char* name;
  int row_tiles, splits, tiles;
};

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 30;
  if (reps < 1) {
    std::fprintf(stderr, "reps must be >= 1, got %s\n", argv[1]);
    return 2;
  }
  // 65k context = 1024 pages of 64 tokens; T=16 x 8 heads = 2 row tiles of 64, T=64 = 8 (the kernel's auto splits)
  // "empty": the same grid streaming nothing (launch + barrier init + event gaps), the figure every row contains
  const Shape shapes[] = {{"empty", 2, 64, 0}, {"65k T16", 2, 64, 16}, {"65k T64", 8, 16, 64}};
  const int pages_total = 1024, flush_bytes = 512 << 20;
  void *pool, *q, *flush;
  int* table;
  long long* wait_issue;
  CHECK(cudaMalloc(&pool, static_cast<size_t>(pages_total) * TILE));
  CHECK(cudaMalloc(&q, static_cast<size_t>(8) * TILE));
  CHECK(cudaMalloc(&flush, flush_bytes));
  CHECK(cudaMalloc(&table, pages_total * sizeof(int)));
  CHECK(cudaMalloc(&wait_issue, 3 * 1024 * sizeof(long long)));
  CHECK(cudaMemset(pool, 0x3c, static_cast<size_t>(pages_total) * TILE));
  CHECK(cudaMemset(q, 0x3c, static_cast<size_t>(8) * TILE));
  std::vector<int> perm(pages_total);
  for (int i = 0; i < pages_total; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), std::mt19937(1234));
  CHECK(cudaMemcpy(table, perm.data(), pages_total * sizeof(int), cudaMemcpyHostToDevice));
  const CUtensorMap kv = make_map(pool, static_cast<long long>(pages_total) * BN), qm = make_map(q, 8LL * BN);
  CHECK(cudaFuncSetAttribute(stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, MAX_TILES * TILE + 1024));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  unsigned long long* tick;
  CHECK(cudaMalloc(&tick, sizeof(*tick)));
  const long long spin_cycles = 20000000;
  double ghz = 0;
  for (int r = 0; r < 3; ++r) {  // the last of three (the first ones raise the clock)
    CHECK(cudaEventRecord(e0));
    spin_kernel<<<sms, 32>>>(spin_cycles, tick);
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    CHECK(cudaGetLastError());
    float t;
    CHECK(cudaEventElapsedTime(&t, e0, e1));
    ghz = spin_cycles / (1e6 * t);
  }
  unsigned long long tick_ns = 0;
  CHECK(cudaMemcpy(&tick_ns, tick, sizeof(tick_ns), cudaMemcpyDeviceToHost));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  int driver = 0, runtime = 0;
  CHECK(cudaDriverGetVersion(&driver));
  CHECK(cudaRuntimeGetVersion(&runtime));
  std::printf("%s (sm_%d%d), driver API %d, runtime %d\n", prop.name, prop.major, prop.minor, driver, runtime);
  std::printf("SMs %d, SM clock %.3f GHz (a %lld-cycle spin), %%globaltimer step %llu ns, reps %d, page %d KB, "
              "L2 flushed (%d MB memset) before every launch\n", sms, ghz, spin_cycles, tick_ns, reps, TILE / 1024,
              flush_bytes >> 20);
  std::printf("%-8s %6s %2s %6s %3s %2s %10s %10s %12s %9s %9s %9s\n", "shape", "stages", "Q", "hold", "pf", "ow",
              "median us", "GB/s/blk", "L2->SM TB/s", "wait ns", "issue ns", "period ns");
  for (const Shape& s : shapes)
    for (int q_on = 1; q_on >= 0; --q_on)
      for (int stages = 1; stages + q_on <= MAX_TILES; ++stages)
        for (int hold : {0, 400, 800, 1000, 1200, 1400, 1600, 2000, 2200, 2400, 2800})
        for (int pf = 0; pf <= 3; ++pf)
        for (int owners = 0; owners <= 1; ++owners)
        for (int pf_all = 0; pf_all <= 1; ++pf_all) {
          if (s.tiles == 0 && (q_on || stages > 1 || hold > 0 || pf || owners || pf_all)) continue;
          if ((pf || owners) && (stages != 2 || !q_on || hold < 1200)) continue;  // the kernel's ring, at its holds
          if ((pf_all && !pf) || (pf == 3 && !owners) || (owners && pf && hold != 2000)) continue;
          const Args a{stages, q_on, s.tiles, static_cast<long long>(hold * ghz), pf, pf_all,
                       owners, table, wait_issue};
          const size_t smem = (stages + q_on) * TILE + 1024;
          std::vector<float> ms;
          for (int r = 0; r < reps + 2; ++r) {
            CHECK(cudaMemsetAsync(flush, r & 0xff, flush_bytes));
            CHECK(cudaEventRecord(e0));
            stream_kernel<<<dim3(s.row_tiles, s.splits), 128, smem>>>(kv, qm, a);
            CHECK(cudaEventRecord(e1));
            CHECK(cudaEventSynchronize(e1));
            CHECK(cudaGetLastError());
            float t;
            CHECK(cudaEventElapsedTime(&t, e0, e1));
            if (r >= 2) ms.push_back(t);  // the first two warm the launch path
          }
          std::sort(ms.begin(), ms.end());
          const double us = 1e3 * ms[ms.size() / 2];
          // the last launch's blocks: median per page waited for and per reload issued, ns
          const int blocks = s.row_tiles * s.splits;
          std::vector<long long> wi(3 * blocks);
          CHECK(cudaMemcpy(wi.data(), wait_issue, wi.size() * sizeof(long long), cudaMemcpyDeviceToHost));
          // pages the measured thread served (all, or its stage's) and reloads it issued
          const int served = owners ? (s.tiles + stages - 1) / stages : s.tiles;
          const int reloads = std::max(served - (owners ? 1 : stages), 0);
          std::vector<double> wait_ns(blocks), issue_ns(blocks), period_ns(blocks);
          for (int b = 0; b < blocks; ++b) {
            wait_ns[b] = served ? wi[3 * b] / ghz / served : 0;
            issue_ns[b] = reloads ? wi[3 * b + 1] / ghz / reloads : 0;
            period_ns[b] = served ? wi[3 * b + 2] / ghz / served : 0;
          }
          std::sort(wait_ns.begin(), wait_ns.end());
          std::sort(issue_ns.begin(), issue_ns.end());
          std::sort(period_ns.begin(), period_ns.end());
          const double block_bytes = static_cast<double>(s.tiles + q_on) * TILE;
          std::printf("%-8s %6d %2d %6d %2d%s %2d %10.2f %10.1f %12.2f %9.0f %9.0f %9.0f\n", s.name, stages, q_on, hold,
                      pf, pf_all ? "a" : " ", owners, us, block_bytes / us / 1e3, block_bytes * blocks / us / 1e6,
                      wait_ns[blocks / 2], issue_ns[blocks / 2], period_ns[blocks / 2]);
        }
  return 0;
}
