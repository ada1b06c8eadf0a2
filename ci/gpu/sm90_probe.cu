// Device probe of the building blocks of csrc/verify_sm90.cuh, one warpgroup, tiny known inputs (run by
// ci/gpu/sm90.sh before the kernel tests; a wrong descriptor shows here by name):
//   qk:    S = A B^T, m64n64k16 x 4 k-steps, both K-major 128-byte swizzled (the Q / K layout)
//   pv_ss: O = P V, m64n256k16 x 4, P K-major, V MN-major (64-dim chunks `lbo` apart); both LBO / SBO
//          orders are tried, the kernel uses (8192, 1024)
//   pv_rs: the same with P from registers (the m16n8k16 A fragment per warp)
//   tma:   a 64 x 64 box of a [128 x 576] bf16 array, 128-byte swizzle, against the manual swizzle
// nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I csrc ci/gpu/sm90_probe.cu -o /tmp/sm90_probe
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cudaTypedefs.h>

#include "verify_sm90.cuh"

using namespace kdengine;
using namespace kdengine::sm90;

// value of element (r, c) of a small test matrix, exactly representable in bf16
__host__ __device__ inline float val(int seed, int r, int c) { return (float)(((r * 7 + c * 13 + seed * 5) % 17) - 8) / 8.f; }

__device__ void put_swizzled(unsigned char* base, int r, int c, float v) {  // K-major 128-byte rows, chunks of 64
  const int chunk = c / 64, cc = c % 64;
  *reinterpret_cast<__nv_bfloat16*>(base + chunk * CHUNK_BYTES + r * 128 + (((cc / 8) ^ (r & 7)) << 4) + (cc % 8) * 2) =
      __float2bfloat16(v);
}

__global__ void probe(float* out_qk, float* out_ss_a, float* out_ss_b, float* out_rs, const CUtensorMap* map_ptr,
                      const __grid_constant__ CUtensorMap map, int* tma_bad) {
  extern __shared__ unsigned char raw[];
  unsigned char* sm = raw + (((smem_u32(raw) + 1023) & ~1023u) - smem_u32(raw));
  unsigned char* A = sm;                    // 64 x 64 (one chunk)
  unsigned char* Bm = sm + CHUNK_BYTES;     // 64 x 64 (one chunk)
  unsigned char* V = sm + 2 * CHUNK_BYTES;  // 64 tokens x 256 dims (4 chunks)
  unsigned char* T = sm + 6 * CHUNK_BYTES;  // TMA box 64 rows x 64 dims
  const int tid = threadIdx.x;
  for (int i = tid; i < 64 * 64; i += 128) {
    put_swizzled(A, i / 64, i % 64, val(1, i / 64, i % 64));
    put_swizzled(Bm, i / 64, i % 64, val(2, i / 64, i % 64));
  }
  for (int i = tid; i < 64 * 256; i += 128) put_swizzled(V, i / 256, i % 256, val(3, i / 256, i % 256));
  fence_async_smem();
  __syncthreads();
  const int warp = tid / 32, lane = tid % 32;
  // qk
  {
    float s[32];
    for (int i = 0; i < 32; ++i) s[i] = 0.f;
    const uint64_t ad = make_desc(smem_u32(A), 16, 1024), bd = make_desc(smem_u32(Bm), 16, 1024);
    wgmma_fence();
    for (int ks = 0; ks < 4; ++ks) wgmma_qk(s, ad + ks * 2, bd + ks * 2, ks > 0);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(s);
    for (int j = 0; j < 8; ++j)
      for (int e = 0; e < 4; ++e)
        out_qk[(warp * 16 + lane / 4 + 8 * (e >> 1)) * 64 + 8 * j + 2 * (lane % 4) + (e & 1)] = s[4 * j + e];
  }
  // pv_ss in both LBO / SBO orders; P = A
  for (int variant = 0; variant < 2; ++variant) {
    float o[128];
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    const uint64_t pd = make_desc(smem_u32(A), 16, 1024);
    const uint64_t vd = variant == 0 ? make_desc(smem_u32(V), CHUNK_BYTES, 1024) : make_desc(smem_u32(V), 1024, CHUNK_BYTES);
    wgmma_fence();
    for (int kk = 0; kk < 4; ++kk) wgmma_pv_ss(o, pd + kk * 2, vd + kk * (16 * 128 >> 4), 1);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(o);
    float* dst = variant == 0 ? out_ss_a : out_ss_b;
    for (int j = 0; j < 32; ++j)
      for (int e = 0; e < 4; ++e)
        dst[(warp * 16 + lane / 4 + 8 * (e >> 1)) * 256 + 8 * j + 2 * (lane % 4) + (e & 1)] = o[4 * j + e];
  }
  // pv_rs: P fragments of A from registers
  {
    uint32_t pa[4][4];
    const int r0 = warp * 16 + lane / 4, q = lane % 4;
    for (int kk = 0; kk < 4; ++kk)
      for (int i = 0; i < 4; ++i) {
        const int r = r0 + 8 * (i & 1), c = 16 * kk + 8 * (i >> 1) + 2 * q;
        pa[kk][i] = pack_bf16(val(1, r, c), val(1, r, c + 1));
      }
    float o[128];
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    const uint64_t vd = make_desc(smem_u32(V), CHUNK_BYTES, 1024);
    wgmma_fence();
    for (int kk = 0; kk < 4; ++kk) wgmma_pv_rs(o, pa[kk], vd + kk * (16 * 128 >> 4), 1);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(o);
    for (int j = 0; j < 32; ++j)
      for (int e = 0; e < 4; ++e)
        out_rs[(warp * 16 + lane / 4 + 8 * (e >> 1)) * 256 + 8 * j + 2 * (lane % 4) + (e & 1)] = o[4 * j + e];
  }
  // tma: rows 32..95, dims 64..127 of the global array (value val(4, row, dim))
  __shared__ __align__(8) uint64_t bar;
  if (tid == 0) {
    mbar_init(smem_u32(&bar), 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (tid == 0) {
    mbar_expect_tx(smem_u32(&bar), CHUNK_BYTES);
    tma_load(smem_u32(T), &map, 64, 32, smem_u32(&bar));
  }
  mbar_wait(smem_u32(&bar), 0);
  for (int i = tid; i < 64 * 64; i += 128) {
    const int r = i / 64, c = i % 64;
    const float got = __bfloat162float(
        *reinterpret_cast<__nv_bfloat16*>(T + r * 128 + (((c / 8) ^ (r & 7)) << 4) + (c % 8) * 2));
    if (got != val(4, 32 + r, 64 + c)) atomicAdd(tma_bad, 1);
  }
}

static float check(const char* name, const std::vector<float>& got, int M, int N, int seed_b, bool b_is_nk) {
  double err = 0, ref2 = 0;
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double ref = 0;
      for (int k = 0; k < 64; ++k) ref += (double)val(1, m, k) * (b_is_nk ? val(seed_b, n, k) : val(seed_b, k, n));
      err += (got[m * N + n] - ref) * (got[m * N + n] - ref);
      ref2 += ref * ref;
    }
  const double rel = sqrt(err / (ref2 + 1e-30));
  printf("probe %-6s rel L2 %.3e %s\n", name, rel, rel < 1e-3 ? "ok" : "BAD");
  return rel;
}

int main() {
  float *qk, *ssa, *ssb, *rs;
  int* bad;
  cudaMalloc(&qk, 64 * 64 * 4);
  cudaMalloc(&ssa, 64 * 256 * 4);
  cudaMalloc(&ssb, 64 * 256 * 4);
  cudaMalloc(&rs, 64 * 256 * 4);
  cudaMalloc(&bad, 4);
  cudaMemset(bad, 0, 4);
  std::vector<__nv_bfloat16> host(128 * 576);
  for (int r = 0; r < 128; ++r)
    for (int c = 0; c < 576; ++c) host[r * 576 + c] = __float2bfloat16(val(4, r, c));
  __nv_bfloat16* g;
  cudaMalloc(&g, host.size() * 2);
  cudaMemcpy(g, host.data(), host.size() * 2, cudaMemcpyHostToDevice);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found;
  cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
  alignas(64) CUtensorMap map;
  const cuuint64_t dims[2] = {576, 128};
  const cuuint64_t strides[1] = {576 * 2};
  const cuuint32_t box[2] = {64, 64}, es[2] = {1, 1};
  const CUresult cr = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn)(
      &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, g, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  printf("probe encode %d\n", (int)cr);
  const int smem = 7 * CHUNK_BYTES + 1024;
  cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  probe<<<1, 128, smem>>>(qk, ssa, ssb, rs, nullptr, map, bad);
  const cudaError_t err = cudaDeviceSynchronize();
  printf("probe launch: %s\n", cudaGetErrorString(err));
  if (err != cudaSuccess) return 1;
  std::vector<float> h(64 * 256);
  cudaMemcpy(h.data(), qk, 64 * 64 * 4, cudaMemcpyDeviceToHost);
  check("qk", h, 64, 64, 2, true);
  cudaMemcpy(h.data(), ssa, 64 * 256 * 4, cudaMemcpyDeviceToHost);
  check("ss", h, 64, 256, 3, false);
  cudaMemcpy(h.data(), ssb, 64 * 256 * 4, cudaMemcpyDeviceToHost);
  check("ss_swp", h, 64, 256, 3, false);
  cudaMemcpy(h.data(), rs, 64 * 256 * 4, cudaMemcpyDeviceToHost);
  check("rs", h, 64, 256, 3, false);
  int nbad = 0;
  cudaMemcpy(&nbad, bad, 4, cudaMemcpyDeviceToHost);
  printf("probe tma    %d of 4096 elements differ from the manual swizzle %s\n", nbad, nbad ? "BAD" : "ok");
  return 0;
}
