// MLA tree-verify attention, split-KV, on tensor cores (mma.sync m16n8k16 bf16 -> fp32).
//
// One thread block per (row tile, KV split, sequence): blockIdx.x = row tile (fastest, so the row
// tiles of one split run together and their repeat KV reads hit L2), .y = split, .z = sequence.
// A block holds BLOCK_M = 16 * RG query rows (row = t * H + head; all rows of a sequence share the
// one latent KV head) and streams its split's KV tiles (BN tokens x 576) through shared memory with
// 16-byte cp.async, STAGES deep. Each 16-row group has CW warps: warp c owns K dims
// [c * 576 / CW, (c + 1) * 576 / CW) of Q*K^T (its Q fragments stay in registers; the CW partial
// scores are summed through shared memory in a fixed order, so every warp holds identical scores)
// and V columns [c * 512 / CW, (c + 1) * 512 / CW) of P*V. Online softmax in fp32 (log2 domain).
// The packed ancestor mask applies to the tree tail only. Lengths are read on the device, so one
// CUDA graph replays at any prefix length. A second kernel merges the split partials (bf16, each
// normalised by its own sum; fp32 log-sum-exp per row) by log-sum-exp.
//
// Configurations (template parameters, picked by the switches in verify_kernel.cu):
//   CW = 2: BN = 32, 2 stages, <= 255 registers (1 block of 8 warps per SM at RG = 4)
//   CW = 4: BN = 16, 3 stages, <= 128 registers (16 warps per SM at RG = 4)
//   "CW = 8": the wide layout of verify_wide.cuh (8 warps share all rows of the block)
// Shared memory stays under sm_120's 99 KB in both.
//
// Shapes (R = T * H query rows per sequence, W = ceil(T / 32)): see VerifyParams in verify_launch.h.
//
// -DKDENGINE_SCALAR_LOADS turns the KV loads into 4-byte copies: a build flag for the vector-load
// ablation, not a second kernel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "verify_launch.h"
#include "verify_partials.cuh"
#include "verify_timeline.cuh"

namespace kdengine {

// D_QK and DV: verify_launch.h (the shape contract)
constexpr int STRIDE = D_QK + 8;  // smem row pitch in elements (+16 B: conflict-free ldmatrix)
constexpr int CHUNKS = D_QK / 8;  // 16-byte chunks per KV row
constexpr int COMBINE_THREADS = DV / 4;

template <int RG_, int CW_>
struct Cfg {
  static constexpr bool WIDE = false;
  static constexpr int RG = RG_, CW = CW_;
  static constexpr int WARPS = RG * CW, THREADS = 32 * WARPS, BLOCK_M = 16 * RG;
  static constexpr int BN = CW == 2 ? 32 : 16;     // KV tokens per tile
  static constexpr int STAGES = CW == 2 ? 2 : 3;   // KV tiles in flight
  static constexpr int K_PART = D_QK / CW, V_PART = DV / CW;
  static constexpr int KSTEPS = K_PART / 16;
  static constexpr int TILE_ELEMS = BN * STRIDE;
  static constexpr int KV_BYTES = STAGES * TILE_ELEMS * 2;
  static constexpr int EXCH_FLOATS = 16 * BN;      // one warp's partial scores
  static constexpr int SMEM = KV_BYTES + WARPS * EXCH_FLOATS * 4;
  static constexpr int MIN_BLOCKS = CW == 2 ? 1 : 512 / THREADS;
  static_assert(SMEM <= 99 * 1024, "over sm_120's 99 KB of shared memory per block");
};

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

// Programmatic dependent launch (sm_90 and later; a no-op below, and when the dependent kernel was
// launched without the attribute): the split kernel lets the merge's blocks launch early, and the
// merge waits for the whole split grid (and its memory) before it reads a partial.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait_primary() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// The warps of one 16-row group (id 1..RG; 0 is __syncthreads).
__device__ __forceinline__ void group_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
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
template <class C>
__device__ __forceinline__ void load_kv_tile(const VerifyParams& p, int b, int tile_start, int end,
                                             __nv_bfloat16* dst) {
  const int* pages = p.page_table + (size_t)b * p.max_pages;
#pragma unroll
  for (int c = threadIdx.x; c < C::BN * CHUNKS; c += C::THREADS) {
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

// This warp's A fragments of Q (16 rows x K_PART dims), straight from global memory (zero past R).
template <class C>
__device__ __forceinline__ void load_q_fragments(const VerifyParams& p, int b, int row_base, int k_base,
                                                 uint32_t (&qa)[C::KSTEPS][4]) {
  const int lane = threadIdx.x % 32;
  const int rows[2] = {row_base + lane / 4, row_base + lane / 4 + 8};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const bool valid = rows[h] < p.R;
    const uint32_t* src = reinterpret_cast<const uint32_t*>(
        p.q + ((size_t)b * p.R + (valid ? rows[h] : 0)) * D_QK + k_base + (lane % 4) * 2);
#pragma unroll
    for (int ks = 0; ks < C::KSTEPS; ++ks) {
      qa[ks][h] = valid ? __ldg(src + ks * 8) : 0u;
      qa[ks][h + 2] = valid ? __ldg(src + ks * 8 + 4) : 0u;
    }
  }
}

// --- the split kernel -------------------------------------------------------------------------------

// The KV range [start, end) of split `split` of sequence b, in whole BN-token tiles, from the device
// length (graph-safe). An empty split (start >= end) writes lse = -inf for its rows (its weight in the
// merge is exp(-inf) = 0) and returns false: the caller returns.
template <int BN, int BLOCK_M, int THREADS>
__device__ __forceinline__ bool split_range(const VerifyParams& p, int b, int split, int row0, int& start, int& end,
                                            size_t& part_row0) {
  const int L = p.prefix_len[b] + p.T;
  int chunk = (L + p.nsplit - 1) / p.nsplit;
  chunk = (chunk + BN - 1) / BN * BN;
  start = split * chunk;
  end = min(L, start + chunk);
  part_row0 = ((size_t)b * p.nsplit + split) * p.R;
  if (start < end) return true;
  for (int r = threadIdx.x; r < BLOCK_M; r += THREADS)
    if (row0 + r < p.R) p.part_lse[part_row0 + row0 + r] = -INFINITY;
  return false;
}

template <class C>
__global__ void __launch_bounds__(C::THREADS, C::MIN_BLOCKS) verify_split_kernel(const VerifyParams p) {
  constexpr int BN = C::BN, STAGES = C::STAGES, RG = C::RG, CW = C::CW;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __nv_bfloat16* kv_s = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  float* exch = reinterpret_cast<float*>(smem_raw + C::KV_BYTES);  // [WARPS][16 * BN]

  const int b = blockIdx.z, split = blockIdx.y, row0 = blockIdx.x * C::BLOCK_M;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rg = warp % RG, cw = warp / RG;
  const int T = p.T, R = p.R;
  const int prefix = p.prefix_len[b];
  int start, end;
  size_t part_row0;
  if (!split_range<BN, C::BLOCK_M, C::THREADS>(p, b, split, row0, start, end, part_row0)) return;

  const int ntiles = (end - start + BN - 1) / BN;
#pragma unroll
  for (int st = 0; st < STAGES - 1; ++st) {
    if (st < ntiles) load_kv_tile<C>(p, b, start + st * BN, end, kv_s + st * C::TILE_ELEMS);
    cp_async_commit();
  }

  uint32_t qa[C::KSTEPS][4];
  load_q_fragments<C>(p, b, row0 + rg * 16, cw * C::K_PART, qa);

  // The two rows this thread holds in every fragment: lane/4 and lane/4 + 8 of the group's 16.
  const int row_lo = min(row0 + rg * 16 + lane / 4, R - 1), row_hi = min(row_lo + 8, R - 1);
  const int mask_lo = (b * T + row_lo / p.H) * p.W, mask_hi = (b * T + row_hi / p.H) * p.W;  // word offsets

  float o[C::V_PART / 8][4];
#pragma unroll
  for (int i = 0; i < C::V_PART / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  for (int it = 0; it < ntiles; ++it) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    const int next = it + STAGES - 1;
    if (next < ntiles) load_kv_tile<C>(p, b, start + next * BN, end, kv_s + (next % STAGES) * C::TILE_ELEMS);
    cp_async_commit();
    const __nv_bfloat16* tile = kv_s + (it % STAGES) * C::TILE_ELEMS;
    const int tile_start = start + it * BN;

    // S partial = Q[:, my dims] * K[:, my dims]^T  (16 x BN per warp)
    float s[BN / 8][4];
#pragma unroll
    for (int i = 0; i < BN / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
    const __nv_bfloat16* kbase =
        tile + ((lane & 7) + ((lane >> 4) << 3)) * STRIDE + cw * C::K_PART + ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int ks = 0; ks < C::KSTEPS; ++ks) {
#pragma unroll
      for (int np = 0; np < BN / 16; ++np) {
        uint32_t kb[4];
        ldmatrix_x4(kb, kbase + np * 16 * STRIDE + ks * 16);
        mma_bf16(s[2 * np], qa[ks], kb[0], kb[1]);
        mma_bf16(s[2 * np + 1], qa[ks], kb[2], kb[3]);
      }
    }

    // Sum the group's partial scores through shared memory, in warp order (identical on every warp).
    float* mine = exch + warp * C::EXCH_FLOATS;
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) mine[i * 32 + lane] = s[i / 4][i % 4];
    group_barrier(1 + rg, 32 * CW);
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) {
      float sum = 0.f;
#pragma unroll
      for (int c = 0; c < CW; ++c) sum += exch[(c * RG + rg) * C::EXCH_FLOATS + i * 32 + lane];
      s[i / 4][i % 4] = sum;
    }

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
            const int word = __ldg(p.mask_bits + (e >> 1 ? mask_hi : mask_lo) + (j >> 5));
            if (!((word >> (j & 31)) & 1)) v = -INFINITY;
          }
        }
        s[nt][e] = v;
      }
    }
    float alphas[2];
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
      alphas[r] = alpha;
    }
    // Rescale O only when some row's running max moved (rare once the max has settled).
    if (__any_sync(0xffffffff, alphas[0] != 1.f || alphas[1] != 1.f)) {
#pragma unroll
      for (int i = 0; i < C::V_PART / 8; ++i) {
        o[i][0] *= alphas[0];
        o[i][1] *= alphas[0];
        o[i][2] *= alphas[1];
        o[i][3] *= alphas[1];
      }
    }

    // O[:, my columns] += P * V[:, my columns]
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      const uint32_t pa[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                              pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      const __nv_bfloat16* vbase =
          tile + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * STRIDE + cw * C::V_PART + (lane >> 4) * 8;
#pragma unroll
      for (int np = 0; np < C::V_PART / 16; ++np) {
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, vbase + np * 16);
        mma_bf16(o[2 * np], pa, vb[0], vb[1]);
        mma_bf16(o[2 * np + 1], pa, vb[2], vb[3]);
      }
    }
  }

  // Normalise and write this split's partial rows (whole sectors: verify_partials.cuh).
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float lsum = l[r];
    lsum += __shfl_xor_sync(0xffffffff, lsum, 1);
    lsum += __shfl_xor_sync(0xffffffff, lsum, 2);
    const float inv = lsum > 0.f ? 1.f / lsum : 0.f;
    const int row = row0 + rg * 16 + lane / 4 + 8 * r;
    const bool valid = row < R;
    __nv_bfloat16* dst = p.part_out + (part_row0 + min(row, R - 1)) * DV + cw * C::V_PART;
#pragma unroll
    for (int nt = 0; nt < C::V_PART / 8; nt += 2)
      store_partial16(dst + nt * 8, lane % 4, valid, o[nt][2 * r] * inv, o[nt][2 * r + 1] * inv,
                      o[nt + 1][2 * r] * inv, o[nt + 1][2 * r + 1] * inv);
    if (valid && cw == 0 && lane % 4 == 0)
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
    const float4 v = load_partial4(p.part_out + (((size_t)b * p.nsplit + s) * R + row) * DV + threadIdx.x * 4);
    sum += w;
    acc.x += w * v.x, acc.y += w * v.y, acc.z += w * v.z, acc.w += w * v.w;
  }
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  __nv_bfloat162* dst = reinterpret_cast<__nv_bfloat162*>(p.out + ((size_t)b * R + row) * DV + threadIdx.x * 4);
  dst[0] = __floats2bfloat162_rn(acc.x * inv, acc.y * inv);
  dst[1] = __floats2bfloat162_rn(acc.z * inv, acc.w * inv);
  if (threadIdx.x == 0) p.lse[(size_t)b * R + row] = sum > 0.f ? mx + logf(sum) : -INFINITY;
}

// The same merge with the splits in parallel: the block turns the NSPLIT lse values of its row into
// weights in shared memory (two block reductions); then COMBINE_GROUPS groups of threads each sum
// their 4 columns over every COMBINE_GROUPS-th batch of COMBINE_BATCH splits, all loads of a batch
// issued before their first use, and the groups' sums are added in a fixed order (the loop above
// waits for one L2 round trip per split).
constexpr int COMBINE_MAX_NSPLIT = 1024;
constexpr int COMBINE_BATCH = 8;   // partial rows in flight per thread
constexpr int COMBINE_GROUPS = 4;  // thread groups over the splits
constexpr int COMBINE_PAR_THREADS = COMBINE_THREADS * COMBINE_GROUPS;

template <bool IS_MAX, int NTHREADS = COMBINE_PAR_THREADS>
__device__ __forceinline__ float block_reduce(float v, float* red) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    const float o = __shfl_xor_sync(0xffffffff, v, off);
    v = IS_MAX ? fmaxf(v, o) : v + o;
  }
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  float r = red[0];
#pragma unroll
  for (int i = 1; i < NTHREADS / 32; ++i) r = IS_MAX ? fmaxf(r, red[i]) : r + red[i];
  __syncthreads();  // red is reused by the next reduction
  return r;
}

// The body of both weighted merges: one block per (row, sequence[, column chunk when CHUNKED, launched as a
// programmatic dependent]); COLS threads of float4 columns in each of GROUPS groups over the splits. The block turns its row's NSPLIT lse values
// into weights in shared memory (two block reductions), each group sums its columns over every GROUPS-th
// batch of COMBINE_BATCH splits (all loads of a batch issued before their first use), and the groups' sums
// are added in a fixed order.
template <int COLS, int GROUPS, bool CHUNKED>
__device__ __forceinline__ void combine_weighted(const VerifyParams& p) {
  constexpr int NTHREADS = COLS * GROUPS;
  __shared__ float w_s[COMBINE_MAX_NSPLIT];
  __shared__ float red[NTHREADS / 32];
  __shared__ float4 acc_s[GROUPS - 1][COLS];
  if (CHUNKED) pdl_wait_primary();  // launched early (programmatic dependent launch): partials complete past here
  const int row = blockIdx.x, b = blockIdx.y, R = p.R;
  const int c = threadIdx.x % COLS, col = (CHUNKED ? blockIdx.z * COLS : 0) + c, group = threadIdx.x / COLS;
  const float* lse = p.part_lse + (size_t)b * p.nsplit * R + row;
  float mx = -INFINITY;
  for (int s = threadIdx.x; s < p.nsplit; s += NTHREADS) {
    const float v = lse[(size_t)s * R];
    w_s[s] = v;
    mx = fmaxf(mx, v);
  }
  mx = block_reduce<true, NTHREADS>(mx, red);
  float sum = 0.f;
  for (int s = threadIdx.x; s < p.nsplit; s += NTHREADS) {
    const float v = w_s[s];
    const float w = (v == -INFINITY || mx == -INFINITY) ? 0.f : __expf(v - mx);
    w_s[s] = w;
    sum += w;
  }
  sum = block_reduce<false, NTHREADS>(sum, red);  // its barrier also publishes w_s
  const __nv_bfloat16* src = p.part_out + ((size_t)b * p.nsplit * R + row) * DV + col * 4;
  const size_t stride = (size_t)R * DV;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s0 = group * COMBINE_BATCH; s0 < p.nsplit; s0 += COMBINE_BATCH * GROUPS) {
    float w[COMBINE_BATCH];
    float4 v[COMBINE_BATCH];
#pragma unroll
    for (int k = 0; k < COMBINE_BATCH; ++k) {  // clamped in range; weight 0 past the end
      const int s = min(s0 + k, p.nsplit - 1);
      w[k] = s0 + k < p.nsplit ? w_s[s] : 0.f;
      v[k] = load_partial4(src + s * stride);
    }
#pragma unroll
    for (int k = 0; k < COMBINE_BATCH; ++k) {
      if (w[k] == 0.f) continue;  // an empty split's partial rows were never written (any bits)
      acc.x += w[k] * v[k].x, acc.y += w[k] * v[k].y, acc.z += w[k] * v[k].z, acc.w += w[k] * v[k].w;
    }
  }
  if (group > 0) acc_s[group - 1][c] = acc;
  __syncthreads();
  if (group > 0) return;
#pragma unroll
  for (int g = 0; g < GROUPS - 1; ++g) {
    const float4 a = acc_s[g][c];
    acc.x += a.x, acc.y += a.y, acc.z += a.z, acc.w += a.w;
  }
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  __nv_bfloat162* dst = reinterpret_cast<__nv_bfloat162*>(p.out + ((size_t)b * R + row) * DV + col * 4);
  dst[0] = __floats2bfloat162_rn(acc.x * inv, acc.y * inv);
  dst[1] = __floats2bfloat162_rn(acc.z * inv, acc.w * inv);
  // the row's lse once: thread 0 of its first column block (written as each kernel had it: same machine code)
  if (CHUNKED ? blockIdx.z == 0 && threadIdx.x == 0 : col == 0)
    p.lse[(size_t)b * R + row] = sum > 0.f ? mx + logf(sum) : -INFINITY;
}

__global__ void __launch_bounds__(COMBINE_PAR_THREADS) verify_combine_parallel_kernel(const VerifyParams p) {
  combine_weighted<COMBINE_THREADS, COMBINE_GROUPS, false>(p);
}

// The parallel merge over more blocks: COMBINE_COL_CHUNKS blocks per (row, sequence), each 128 of
// the 512 columns (32 threads of float4) by COMBINE_SPLIT_GROUPS warps over the splits, all
// COMBINE_BATCH loads of a batch in flight. R * B blocks of the merge above leave most of the GPU's
// memory parallelism idle at R = 128; this one launches 4x the blocks, each with 8 partial rows in
// flight per thread. Each block weighs the splits itself (NSPLIT lse reads). On sm_90 and later it is
// launched as a programmatic dependent of the split kernel (its launch overlaps the split's tail).
constexpr int COMBINE_COL_CHUNKS = 4;
constexpr int COMBINE_SPLIT_GROUPS = 8;
constexpr int COMBINE_CHUNK_COLS = DV / 4 / COMBINE_COL_CHUNKS;                    // float4 columns: 32
constexpr int COMBINE_CHUNK_THREADS = COMBINE_CHUNK_COLS * COMBINE_SPLIT_GROUPS;  // 256
static_assert(COMBINE_CHUNK_COLS == 32, "one warp per split group");

__global__ void __launch_bounds__(COMBINE_CHUNK_THREADS) verify_combine_chunked_kernel(const VerifyParams p) {
  combine_weighted<COMBINE_CHUNK_COLS, COMBINE_SPLIT_GROUPS, true>(p);
}


// The grouped merge (combine 4; and 7, the default of both paths, the same code with padded shared memory:
// verify_combine_grouped2_kernel below). MERGE_COL_CHUNKS blocks per
// (row, sequence), each MERGE_CHUNK_COLS columns: one 16-byte load (8 bf16) per lane and partial row. Warp g of the
// block's `groups` takes splits g, g + groups, ... and keeps its own running max, sum and weighted sum (log-sum-exp
// over its splits, rescaled per batch of MERGE_BATCH), so every load of a batch (lse and partial rows) is issued at
// once: no block-wide weighting pass ahead of the partial reads (the merges above wait one L2 round trip for the lse,
// two barriers, then the partials). One barrier, then the groups' sums are rescaled to the common max and added in a
// fixed order. Any nsplit (batches loop past MERGE_BATCH * groups). Launched as a programmatic dependent of the split
// kernel on sm_90+: nothing is read before pdl_wait_primary.
constexpr int MERGE_VEC = 8;                                // bf16 columns per 16-byte load
constexpr int MERGE_COL_CHUNKS = 2;                         // blocks per (row, sequence)
constexpr int MERGE_CHUNK_COLS = DV / MERGE_COL_CHUNKS;     // 256
constexpr int MERGE_BATCH = 8;                              // partial rows in flight per lane
constexpr int MERGE_MAX_GROUPS = 16;                        // warps per block
static_assert(MERGE_CHUNK_COLS == 32 * MERGE_VEC, "one warp covers a column chunk");

// Warps per merge block: the fewest that give each at most MERGE_BATCH splits (a power of two, at
// most MERGE_MAX_GROUPS).
inline int merge_groups(int nsplit) {
  int groups = 1;
  while (groups < MERGE_MAX_GROUPS && groups * MERGE_BATCH < nsplit) groups *= 2;
  return groups;
}

// Dynamic shared memory of a merge block: [MERGE_MAX_GROUPS] max, [MERGE_MAX_GROUPS] sum, then
// [groups][MERGE_CHUNK_COLS] weighted sums. The max and sum tables are full size whatever `groups`:
// ptxas reads the tail of a loop over them as one 16-byte load (up to 3 entries past `groups`, never
// used), which compute-sanitizer memcheck reported past a 1-group block's allocation.
inline size_t merge_smem_bytes(int groups) {
  return ((size_t)2 * MERGE_MAX_GROUPS + (size_t)groups * MERGE_CHUNK_COLS) * sizeof(float);
}

// A merge warp's running max, sum and weighted sums into the block's tables (merge_smem_bytes' layout: [MERGE_MAX_GROUPS]
// max, [MERGE_MAX_GROUPS] sum, [groups][MERGE_CHUNK_COLS] sums), then the block's barrier; returns the sums' table.
__device__ __forceinline__ const float* merge_publish(float* merge_s, int group, int lane, float m, float sum,
                                                      const float (&acc)[MERGE_VEC]) {
  float* acc_s = merge_s + 2 * MERGE_MAX_GROUPS;
  float4* mine = reinterpret_cast<float4*>(acc_s + group * MERGE_CHUNK_COLS + lane * MERGE_VEC);
  mine[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
  mine[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
  if (lane == 0) {
    merge_s[group] = m;
    merge_s[MERGE_MAX_GROUPS + group] = sum;
  }
  __syncthreads();
  return acc_s;
}

// Its instruction count: combine 3 (verify_combine_grouped_kernel, the same work split written plainly; retired: its
// source is in the git history up to d403430) issued ~740 instructions per warp at 49% of the issue slots under
// ncu at 65k T=64, most of them address arithmetic redone per split inside a branch and exp2 range fix-ups; combine 4
// was faster after both split kernels (perf_history/kernel/merge2_b44f69a/). So here: the row bases formed once, every
// load of a batch issued unconditionally (a split index past nsplit is clamped and its lse read as -inf: weight 0),
// the weights in the log2 domain as one ex2.approx.ftz each (the final sum's group factors too), an empty split's
// partial row zeroed by a select instead of skipped by a branch, and no exchange when one warp holds every split.
__device__ __forceinline__ float merge_ex2(float x) {  // 2^x, -inf -> 0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// SPREAD: merge 7's instantiation, a kernel of its own so that its shared-memory attributes (verify_kernel.cu
// launch_combine) never touch merge 4's; the code is the same. (A device function shared by two kernels gave merge 4
// other PTX and 1008 SASS instructions in place of 872 on sm_120.)
// DISCARD (merge 7 after the sm90 schedule seesaw2_el, VerifyParams::discard): after a batch, each warp discards the L2
// lines of its 8 partial row segments (4 lines of 128 B each), so the partials, stored evict_last, neither stay in L2
// nor are written back to DRAM.
template <bool SPREAD, bool DISCARD = false>
__global__ void __launch_bounds__(32 * MERGE_MAX_GROUPS) verify_combine_grouped2_kernel(const VerifyParams p) {
  extern __shared__ __align__(16) float merge_s[];
  constexpr float LOG2E = 1.4426950408889634f;
  const int groups = blockDim.x / 32, group = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = blockIdx.x, b = blockIdx.y, R = p.R, nsplit = p.nsplit;
  const int col0 = blockIdx.z * MERGE_CHUNK_COLS;
  const float* lse = p.part_lse + (size_t)b * nsplit * R + row;
  const uint4* src = reinterpret_cast<const uint4*>(p.part_out + ((size_t)b * nsplit * R + row) * DV + col0) + lane;
  // uint4 units between two splits' rows (32-bit offsets: a sequence's partials are nsplit * R * 64 of them, far
  // below 2^32 for any nsplit and R the launchers accept)
  const uint32_t stride = static_cast<uint32_t>(R) * (DV / MERGE_VEC);
  const uint32_t zero_bits = static_cast<uint32_t>(nsplit) >> 31;  // 0 (nsplit >= 1), opaque to the compiler
  if (threadIdx.x == 0) timeline::timeline_mark(timeline::MERGE_START);  // (-DKDENGINE_TIMELINE only)
  pdl_wait_primary();  // launched early (programmatic dependent launch): the partials are complete past here
  if (threadIdx.x == 0) timeline::timeline_mark(timeline::MERGE_WAITED);

  float m = -INFINITY, sum = 0.f, acc[MERGE_VEC];  // m, the weights: log2 domain
#pragma unroll
  for (int i = 0; i < MERGE_VEC; ++i) acc[i] = 0.f;
  for (int s0 = group; s0 < nsplit; s0 += MERGE_BATCH * groups) {
    float ls[MERGE_BATCH];
    uint4 v[MERGE_BATCH];
#pragma unroll
    for (int k = 0; k < MERGE_BATCH; ++k) {  // all loads of the batch before any use
      const int s = s0 + k * groups, sc = min(s, nsplit - 1);
      ls[k] = __ldg(lse + static_cast<uint32_t>(sc) * static_cast<uint32_t>(R));
      v[k] = __ldcs(src + static_cast<uint32_t>(sc) * stride);  // read once: evict first
    }
    // ptxas, left alone, issues a batch's partial loads after the lse round trip (interleaved with the weights, in
    // reused registers). Each lse gets + 0 from bits of its partial row (zero_bits is 0, but not to the compiler), so
    // the row max waits for every load of the batch and all of them are issued before it.
    float mb = m;
#pragma unroll
    for (int k = 0; k < MERGE_BATCH; ++k) {
      ls[k] = s0 + k * groups < nsplit ? (ls[k] + __uint_as_float(v[k].x & zero_bits)) * LOG2E : -INFINITY;
      mb = fmaxf(mb, ls[k]);
    }
    // No branch on "only empty splits so far" (a branch there let the compiler sink the partial loads past it, after
    // the lse round trip): with mb = -inf the offset is 0 and every factor below is 2^-inf = 0.
    const float mo = mb == -INFINITY ? 0.f : mb;
    const float c = merge_ex2(m - mo);  // m = -inf: 0, and acc, sum are still 0
    sum *= c;
#pragma unroll
    for (int i = 0; i < MERGE_VEC; ++i) acc[i] *= c;
#pragma unroll
    for (int k = 0; k < MERGE_BATCH; ++k) {
      const float w = merge_ex2(ls[k] - mo);  // an empty split (-inf): 0, and its row (never written: any bits) as 0
      const bool empty = ls[k] == -INFINITY;
      const uint32_t h[4] = {empty ? 0u : v[k].x, empty ? 0u : v[k].y, empty ? 0u : v[k].z, empty ? 0u : v[k].w};
      sum += w;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        acc[2 * j] = fmaf(w, bf16_lo(h[j]), acc[2 * j]);
        acc[2 * j + 1] = fmaf(w, bf16_hi(h[j]), acc[2 * j + 1]);
      }
    }
    m = mb;
    if constexpr (DISCARD) {  // every lane's loads of the batch are consumed (above): its lines are no longer needed
      __syncwarp();
      const int s = s0 + (lane / 4) * groups;
      if (s < nsplit) {
        const uint4* seg = src - lane + static_cast<uint32_t>(s) * stride;  // split s's 512-byte row segment
        asm volatile("discard.global.L2 [%0], 128;\n" ::"l"(reinterpret_cast<const char*>(seg) + 128 * (lane % 4))
                     : "memory");
      }
    }
  }

  __nv_bfloat16* dst = p.out + ((size_t)b * R + row) * DV + col0;
  if (groups == 1) {  // nothing to exchange: this warp's lanes hold the whole chunk
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    uint4 o;
    o.x = pack_bf16(acc[0] * inv, acc[1] * inv);
    o.y = pack_bf16(acc[2] * inv, acc[3] * inv);
    o.z = pack_bf16(acc[4] * inv, acc[5] * inv);
    o.w = pack_bf16(acc[6] * inv, acc[7] * inv);
    *reinterpret_cast<uint4*>(dst + lane * MERGE_VEC) = o;
    if (blockIdx.z == 0 && lane == 0)
      p.lse[(size_t)b * R + row] = sum > 0.f ? (m + log2f(sum)) * 0.69314718056f : -INFINITY;  // natural log
    if (threadIdx.x == 0) timeline::timeline_mark(timeline::MERGE_END);
    return;
  }
  const float* m_s = merge_s;  // [MERGE_MAX_GROUPS] (merge_smem_bytes)
  const float* sum_s = m_s + MERGE_MAX_GROUPS;
  const float* acc_s = merge_publish(merge_s, group, lane, m, sum, acc);  // [groups][MERGE_CHUNK_COLS]

  float mx = -INFINITY;
  for (int g = 0; g < groups; ++g) mx = fmaxf(mx, m_s[g]);
  const float mxf = mx == -INFINITY ? 0.f : mx;  // (every split empty: every factor below is 0)
  float total = 0.f;
  for (int g = 0; g < groups; ++g) total = fmaf(sum_s[g], merge_ex2(m_s[g] - mxf), total);
  const float inv = total > 0.f ? 1.f / total : 0.f;
  for (int c = 2 * threadIdx.x; c < MERGE_CHUNK_COLS; c += 2 * blockDim.x) {
    float o0 = 0.f, o1 = 0.f;
    for (int g = 0; g < groups; ++g) {
      const float f = merge_ex2(m_s[g] - mxf);  // 0 for a group that saw only empty splits (its sums are 0 too)
      const float2 a = *reinterpret_cast<const float2*>(acc_s + g * MERGE_CHUNK_COLS + c);
      o0 = fmaf(f, a.x, o0), o1 = fmaf(f, a.y, o1);
    }
    *reinterpret_cast<__nv_bfloat162*>(dst + c) = __floats2bfloat162_rn(o0 * inv, o1 * inv);
  }
  if (blockIdx.z == 0 && threadIdx.x == 0)
    p.lse[(size_t)b * R + row] = total > 0.f ? (mx + log2f(total)) * 0.69314718056f : -INFINITY;  // natural log
  if (threadIdx.x == 0) timeline::timeline_mark(timeline::MERGE_END);
}
}  // namespace kdengine
