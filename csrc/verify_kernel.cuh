// MLA tree-verify attention, split-KV, on tensor cores (mma.sync m16n8k16 bf16 -> fp32).
//
// One thread block per (row tile, KV split, sequence): blockIdx.x = row tile (fastest, so the row
// tiles of one split run together and their repeat KV reads hit L2), .y = split, .z = sequence.
// A block holds BLOCK_M = 16 * RG query rows (row = t * H + head; all rows of a sequence share the
// one latent KV head) and streams its split's KV tiles (BN tokens x 576) through shared memory with
// 16-byte cp.async, double-buffered. Warps come in pairs per 16-row group: warp `half` 0/1 owns K dims
// [288*half, 288*half+288) of Q*K^T (partial scores are summed through shared memory) and V columns
// [256*half, 256*half+256) of P*V. Online softmax in fp32 (log2 domain). The packed ancestor mask
// applies to the tree tail only. Lengths are read on the device, so one CUDA graph replays at any
// prefix length. A second kernel merges the split partials by log-sum-exp.
//
// Shapes (R = T * H query rows per sequence, W = ceil(T / 32)):
//   q [B, R, 576] bf16, kv [P, page_size, 576] bf16, page_table [B, max_pages] int32,
//   prefix_len [B] int32, mask_bits [B, T, W] int32,
//   part_out [B, nsplit, R, 512] fp32, part_lse [B, nsplit, R] fp32 (log2-free natural log),
//   out [B, R, 512] bf16, lse [B, R] fp32 natural log.
//
// -DKDENGINE_SCALAR_LOADS turns the KV (and Q) loads into 4-byte copies: a build flag for the vector-load
// ablation, not a second kernel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "verify_launch.h"

namespace kdengine {


constexpr int D_QK = 576;
constexpr int DV = 512;
constexpr int BN = 32;                // KV tokens per tile
constexpr int STAGES = 2;             // KV tiles in flight
constexpr int STRIDE = D_QK + 8;      // smem row pitch in elements (+16 B: conflict-free ldmatrix)
constexpr int CHUNKS = D_QK / 8;      // 16-byte chunks per KV row
constexpr int K_HALF = D_QK / 2;      // Q*K^T dims per warp of a pair
constexpr int V_HALF = DV / 2;        // P*V columns per warp of a pair
constexpr int KV_TILE_ELEMS = BN * STRIDE;
constexpr int KV_SMEM_BYTES = STAGES * KV_TILE_ELEMS * 2;
constexpr int COMBINE_THREADS = DV / 4;

__host__ __device__ constexpr int block_m(int rg) { return 16 * rg; }
__host__ __device__ constexpr int smem_bytes(int rg) { return KV_SMEM_BYTES + 2 * rg * 16 * BN * 4; }

// --- PTX wrappers -----------------------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void cp_async_4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 4 : 0));
}

// One 16-byte chunk global -> shared (zero-filled when !valid). The ablation build copies it as four
// 4-byte pieces instead.
__device__ __forceinline__ void copy_chunk(__nv_bfloat16* dst, const __nv_bfloat16* src, bool valid) {
#ifdef KDENGINE_SCALAR_LOADS
#pragma unroll
  for (int w = 0; w < 4; ++w) cp_async_4(dst + 2 * w, src + (valid ? 2 * w : 0), valid);
#else
  cp_async_16(dst, src, valid);
#endif
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ void pair_barrier(int id) {
  asm volatile("bar.sync %0, 64;\n" ::"r"(id) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// c[16x8] += a[16x16] * b[16x8], bf16 in, fp32 accumulate.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// --- loads ------------------------------------------------------------------------------------------

// One KV tile (BN tokens from `tile_start`, zero-filled at and past `end`) into shared memory.
template <int THREADS>
__device__ __forceinline__ void load_kv_tile(const VerifyParams& p, int b, int tile_start, int end,
                                             __nv_bfloat16* dst) {
  const int* pages = p.page_table + (size_t)b * p.max_pages;
  for (int c = threadIdx.x; c < BN * CHUNKS; c += THREADS) {
    const int tok = c / CHUNKS, col = (c % CHUNKS) * 8;
    const int pos = tile_start + tok;
    const bool valid = pos < end;
    const __nv_bfloat16* src = p.kv;
    if (valid) {
      const size_t row = (size_t)pages[pos >> p.page_shift] * p.page_size + (pos & (p.page_size - 1));
      src = p.kv + row * D_QK + col;
    }
    copy_chunk(dst + tok * STRIDE + col, src, valid);
  }
}

// The block's query rows (zero past R) into shared memory, then into per-warp A fragments.
template <int RG>
__device__ __forceinline__ void load_q_fragments(const VerifyParams& p, int b, int row0, __nv_bfloat16* stage,
                                                 uint32_t (&qa)[K_HALF / 16][4]) {
  constexpr int THREADS = 64 * RG;
  for (int c = threadIdx.x; c < block_m(RG) * CHUNKS; c += THREADS) {
    const int r = c / CHUNKS, col = (c % CHUNKS) * 8;
    const bool valid = row0 + r < p.R;
    const __nv_bfloat16* src = valid ? p.q + ((size_t)b * p.R + row0 + r) * D_QK + col : p.q;
    copy_chunk(stage + r * STRIDE + col, src, valid);
  }
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rg = warp % RG, half = warp / RG;
  const __nv_bfloat16* base = stage + (rg * 16 + (lane % 16)) * STRIDE + half * K_HALF + (lane / 16) * 8;
#pragma unroll
  for (int ks = 0; ks < K_HALF / 16; ++ks) ldmatrix_x4(qa[ks], base + ks * 16);
  __syncthreads();
}

// --- the split kernel -------------------------------------------------------------------------------

template <int RG>
__global__ void __launch_bounds__(64 * RG, 1) verify_split_kernel(const VerifyParams p) {
  constexpr int THREADS = 64 * RG, BLOCK_M = block_m(RG);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __nv_bfloat16* kv_s = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  float* exch = reinterpret_cast<float*>(smem_raw + KV_SMEM_BYTES);  // [2 * RG warps][16 * BN]

  const int b = blockIdx.z, split = blockIdx.y, row0 = blockIdx.x * BLOCK_M;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rg = warp % RG, half = warp / RG;
  const int T = p.T, R = p.R;
  const int prefix = p.prefix_len[b], L = prefix + T;
  int chunk = (L + p.nsplit - 1) / p.nsplit;
  chunk = (chunk + BN - 1) / BN * BN;
  const int start = split * chunk, end = min(L, start + chunk);
  const size_t part_row0 = ((size_t)b * p.nsplit + split) * R;

  if (start >= end) {  // an empty split: its weight in the merge is exp(-inf) = 0
    for (int r = threadIdx.x; r < BLOCK_M; r += THREADS)
      if (row0 + r < R) p.part_lse[part_row0 + row0 + r] = -INFINITY;
    return;
  }

  uint32_t qa[K_HALF / 16][4];
  load_q_fragments<RG>(p, b, row0, kv_s, qa);

  // The two rows this thread holds in every fragment: lane/4 and lane/4 + 8 of the warp's 16.
  const int row_lo = min(row0 + rg * 16 + lane / 4, R - 1), row_hi = min(row_lo + 8, R - 1);
  const int* mask_lo = p.mask_bits + ((size_t)b * T + row_lo / p.H) * p.W;
  const int* mask_hi = p.mask_bits + ((size_t)b * T + row_hi / p.H) * p.W;

  float o[V_HALF / 8][4];
#pragma unroll
  for (int i = 0; i < V_HALF / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  const int ntiles = (end - start + BN - 1) / BN;
  load_kv_tile<THREADS>(p, b, start, end, kv_s);
  cp_async_commit();

  for (int it = 0; it < ntiles; ++it) {
    cp_async_wait_all();
    __syncthreads();
    if (it + 1 < ntiles) load_kv_tile<THREADS>(p, b, start + (it + 1) * BN, end, kv_s + ((it + 1) % STAGES) * KV_TILE_ELEMS);
    cp_async_commit();
    const __nv_bfloat16* tile = kv_s + (it % STAGES) * KV_TILE_ELEMS;
    const int tile_start = start + it * BN;

    // S partial = Q[:, half dims] * K[:, half dims]^T  (16 x BN per warp)
    float s[BN / 8][4];
#pragma unroll
    for (int i = 0; i < BN / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
    const __nv_bfloat16* kbase =
        tile + ((lane & 7) + ((lane >> 4) << 3)) * STRIDE + half * K_HALF + ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int ks = 0; ks < K_HALF / 16; ++ks) {
#pragma unroll
      for (int np = 0; np < BN / 16; ++np) {
        uint32_t kb[4];
        ldmatrix_x4(kb, kbase + np * 16 * STRIDE + ks * 16);
        mma_bf16(s[2 * np], qa[ks], kb[0], kb[1]);
        mma_bf16(s[2 * np + 1], qa[ks], kb[2], kb[3]);
      }
    }

    // Sum the pair's partial scores through shared memory (same lane layout on both warps).
    float* mine = exch + warp * 16 * BN;
    const float* other = exch + (half ? rg : rg + RG) * 16 * BN;
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) mine[i * 32 + lane] = s[i / 4][i % 4];
    pair_barrier(1 + rg);
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) s[i / 4][i % 4] += other[i * 32 + lane];

    // Scale, mask the tree tail and the end, online softmax.
    const bool tail = tile_start + BN > prefix;
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = s[nt][e] * p.scale_log2;
        if (tail) {
          const int pos = tile_start + nt * 8 + (lane % 4) * 2 + (e & 1);
          if (pos >= end) {
            v = -INFINITY;
          } else if (pos >= prefix) {
            const int j = pos - prefix;
            const int word = __ldg((e >> 1 ? mask_hi : mask_lo) + (j >> 5));
            if (!((word >> (j & 31)) & 1)) v = -INFINITY;
          }
        }
        s[nt][e] = v;
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
      const float m_new = fmaxf(m[r], mx);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      const float alpha = exp2f(m[r] - m_use);
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) {
        s[nt][2 * r] = exp2f(s[nt][2 * r] - m_use);
        s[nt][2 * r + 1] = exp2f(s[nt][2 * r + 1] - m_use);
        sum += s[nt][2 * r] + s[nt][2 * r + 1];
      }
      l[r] = l[r] * alpha + sum;
      m[r] = m_new;
#pragma unroll
      for (int i = 0; i < V_HALF / 8; ++i) {
        o[i][2 * r] *= alpha;
        o[i][2 * r + 1] *= alpha;
      }
    }

    // O[:, half cols] += P * V[:, half cols]
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      const uint32_t pa[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                              pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      const __nv_bfloat16* vbase =
          tile + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * STRIDE + half * V_HALF + (lane >> 4) * 8;
#pragma unroll
      for (int np = 0; np < V_HALF / 16; ++np) {
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, vbase + np * 16);
        mma_bf16(o[2 * np], pa, vb[0], vb[1]);
        mma_bf16(o[2 * np + 1], pa, vb[2], vb[3]);
      }
    }
  }

  // Normalise and write this split's partial rows.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float lsum = l[r];
    lsum += __shfl_xor_sync(0xffffffff, lsum, 1);
    lsum += __shfl_xor_sync(0xffffffff, lsum, 2);
    const float inv = lsum > 0.f ? 1.f / lsum : 0.f;
    const int row = row0 + rg * 16 + lane / 4 + 8 * r;
    if (row >= R) continue;
    float* dst = p.part_out + (part_row0 + row) * DV + half * V_HALF + (lane % 4) * 2;
#pragma unroll
    for (int nt = 0; nt < V_HALF / 8; ++nt)
      *reinterpret_cast<float2*>(dst + nt * 8) = make_float2(o[nt][2 * r] * inv, o[nt][2 * r + 1] * inv);
    if (half == 0 && lane % 4 == 0)
      p.part_lse[part_row0 + row] = lsum > 0.f ? (m[r] + log2f(lsum)) * 0.69314718056f : -INFINITY;
  }
}

// --- the merge ----------------------------------------------------------------------------------------

// One block per (row, sequence); each thread owns 4 of the 512 value columns.
__global__ void __launch_bounds__(COMBINE_THREADS) verify_combine_kernel(const VerifyParams p) {
  const int row = blockIdx.x, b = blockIdx.y, R = p.R;
  const float* lse = p.part_lse + (size_t)b * p.nsplit * R + row;
  float mx = -INFINITY;
  for (int s = 0; s < p.nsplit; ++s) mx = fmaxf(mx, lse[(size_t)s * R]);
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  float sum = 0.f;
  for (int s = 0; s < p.nsplit; ++s) {
    const float ls = lse[(size_t)s * R];
    if (ls == -INFINITY) continue;
    const float w = __expf(ls - mx);
    const float4 v = *reinterpret_cast<const float4*>(
        p.part_out + (((size_t)b * p.nsplit + s) * R + row) * DV + threadIdx.x * 4);
    sum += w;
    acc.x += w * v.x, acc.y += w * v.y, acc.z += w * v.z, acc.w += w * v.w;
  }
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  __nv_bfloat162* dst = reinterpret_cast<__nv_bfloat162*>(p.out + ((size_t)b * R + row) * DV + threadIdx.x * 4);
  dst[0] = __floats2bfloat162_rn(acc.x * inv, acc.y * inv);
  dst[1] = __floats2bfloat162_rn(acc.z * inv, acc.w * inv);
  if (threadIdx.x == 0) p.lse[(size_t)b * R + row] = sum > 0.f ? mx + logf(sum) : -INFINITY;
}

}  // namespace kdengine
