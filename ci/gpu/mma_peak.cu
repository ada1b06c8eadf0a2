// The mma.sync ceiling of this GPU: what the mma.sync path of the verify kernel (verify_wide_lean.cuh, the path the
// sm_120 runner runs) could reach at most on it, and what its operand feed costs.
//
// One kernel, every warp a loop of mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (the kernel's instruction)
// on CHAINS independent accumulators; A and B fragments either stay in registers (FEED = 0: the tensor pipe's own
// limit) or B comes from shared memory by one ldmatrix.x4 (two n8 x k16 B fragments) for every FEED mma, the wide
// layout's ratio (Q*K^T: each K fragment feeds 2 m16 tiles; P*V: 4). Grid: the SM count x BLOCKS_PER_SM blocks of
// WARPS warps, so warps per SM = WARPS x BLOCKS_PER_SM (the default layout runs 8 warps, one block per SM). Timed by
// CUDA events over LAUNCHES launches after one warm-up; FLOPs = 2 * 16 * 8 * 16 per mma.
//
// usage: mma_peak [iters]   (nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Icsrc ci/gpu/mma_peak.cu; also
//        builds for sm_80 / sm_120 with the matching -gencode)
// Prints the device, its SM clock, then one line per (warps per SM, chains, feed): TF/s, mma per SM per clock, and
// the % of the best line's rate.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda_check.h"
#include "verify_wide_lean.cuh"  // csrc/: the kernel's mma_bf16 and 32-bit-address ldmatrix_x4

namespace {

using kdengine::ldmatrix_x4;
using kdengine::mma_bf16;

constexpr int SMEM_TILES = 8;  // B tiles of 16 x 16 bf16 (512 bytes) per warp the ldmatrix loads cycle through

// CHAINS accumulators per warp; FEED = 0: B in registers, else one ldmatrix.x4 (2 B fragments) per FEED mma.
template <int CHAINS, int FEED>
__global__ void mma_loop(float* out, int iters) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint32_t a[4];
  for (int i = 0; i < 4; ++i) a[i] = 0x3f803f80u ^ (uint32_t)(lane * 7 + i);  // bf16 pairs near 1.0
  uint32_t b[4] = {0x3f003f00u ^ (uint32_t)lane, 0x3f003f00u, 0x3e803e80u, 0x3e803e80u ^ (uint32_t)lane};
  uint16_t* s = reinterpret_cast<uint16_t*>(smem) + warp * SMEM_TILES * 256;
  for (int i = lane; i < SMEM_TILES * 256; i += 32) s[i] = (uint16_t)(0x3f00 + (i & 63));
  __syncwarp();
  const uint32_t base = (uint32_t)__cvta_generic_to_shared(s) + (uint32_t)(lane * 16);  // 32 rows of 16 bytes: no bank conflicts
  float c[CHAINS][4];
#pragma unroll
  for (int k = 0; k < CHAINS; ++k) c[k][0] = c[k][1] = c[k][2] = c[k][3] = 0.f;
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int k = 0; k < CHAINS; ++k) {
      if constexpr (FEED > 0) {
        if (k % FEED == 0) ldmatrix_x4(b, base + (uint32_t)(((it * CHAINS + k) / FEED) % SMEM_TILES) * 512u);
      }
      mma_bf16(c[k], a, b[(k & 1) * 2], b[(k & 1) * 2 + 1]);
    }
  }
  float sum = 0.f;
#pragma unroll
  for (int k = 0; k < CHAINS; ++k) sum += c[k][0] + c[k][1] + c[k][2] + c[k][3];
  if (sum == 1234.5f) out[blockIdx.x * blockDim.x + threadIdx.x] = sum;  // keeps the loop; never true in practice
}

struct Line {
  int warps_per_sm, chains, feed;
  double tflops, mma_per_sm_clk;
};

template <int CHAINS, int FEED>
Line run(int sms, int warps, int blocks_per_sm, int iters, int clock_khz, float* out) {
  const int launches = 5;
  const size_t smem = (size_t)warps * SMEM_TILES * 512;
  CHECK(cudaFuncSetAttribute(mma_loop<CHAINS, FEED>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  const dim3 grid(sms * blocks_per_sm), block(32 * warps);
  mma_loop<CHAINS, FEED><<<grid, block, smem>>>(out, iters);  // warm-up
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  std::vector<float> ms(launches);
  for (int l = 0; l < launches; ++l) {
    CHECK(cudaEventRecord(e0));
    mma_loop<CHAINS, FEED><<<grid, block, smem>>>(out, iters);
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    CHECK(cudaEventElapsedTime(&ms[l], e0, e1));
  }
  std::sort(ms.begin(), ms.end());
  const double t = ms[launches / 2] * 1e-3;
  const double mmas = (double)grid.x * warps * iters * CHAINS;
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  return {warps * blocks_per_sm, CHAINS, FEED, mmas * 4096.0 / t * 1e-12, mmas / sms / (t * clock_khz * 1e3)};
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 4096;
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  int clock_khz = 0, driver = 0, runtime = 0;
  CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  CHECK(cudaDriverGetVersion(&driver));
  CHECK(cudaRuntimeGetVersion(&runtime));
  std::printf("%s sm_%d%d, %d SMs, max SM clock %d MHz, driver %d, runtime %d, iters %d\n", prop.name, prop.major,
              prop.minor, prop.multiProcessorCount, clock_khz / 1000, driver, runtime, iters);
  float* out;
  CHECK(cudaMalloc(&out, (size_t)prop.multiProcessorCount * 4 * 1024 * sizeof(float)));
  const int sms = prop.multiProcessorCount;
  std::vector<Line> lines;
  // warps per SM 4 / 8 / 16 / 32 (one block of 4 / 8 / 16 warps, or two of 16), chains 1 / 2 / 4 / 8, feed 0 / 4 / 2
  for (int w : {4, 8, 16, 32}) {
    const int warps = std::min(w, 16), bps = w / warps;
    lines.push_back(run<1, 0>(sms, warps, bps, iters, clock_khz, out));
    lines.push_back(run<2, 0>(sms, warps, bps, iters, clock_khz, out));
    lines.push_back(run<4, 0>(sms, warps, bps, iters, clock_khz, out));
    lines.push_back(run<8, 0>(sms, warps, bps, iters, clock_khz, out));
    lines.push_back(run<8, 4>(sms, warps, bps, iters, clock_khz, out));
    lines.push_back(run<8, 2>(sms, warps, bps, iters, clock_khz, out));
  }
  double best = 0;
  for (const Line& l : lines) best = std::max(best, l.tflops);
  std::printf("warps/SM chains feed     TF/s  mma/SM/clk  %% of best\n");
  for (const Line& l : lines)
    std::printf("%8d %6d %4d %8.1f %11.3f %9.1f\n", l.warps_per_sm, l.chains, l.feed, l.tflops, l.mma_per_sm_clk,
                100.0 * l.tflops / best);
  CHECK(cudaFree(out));
  return 0;
}
