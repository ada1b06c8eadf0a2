// The "wide" split kernel: every warp works on all BLOCK_M query rows of the block, so each K/V
// fragment it loads from shared memory feeds RG/2 (Q*K^T) or RG (P*V) m16 tensor-core tiles instead
// of one (the layouts of verify_kernel.cuh give each warp 16 rows, and 4 warps re-read every tile).
//
// Block: BLOCK_M = 16 * RG rows (RG = 2 or 4), 8 warps, KV tiles of BN = 16 tokens, 4 cp.async stages.
//   Q*K^T: warp w holds Q fragments for rows [w / 4 * BLOCK_M / 2, +BLOCK_M / 2) and dims
//          [w % 4 * 144, +144) in registers; the 4 partial score tiles of a row half go to shared
//          memory (fp32).
//   softmax: all 256 threads, EPT scores of one row each: the 4 partials summed in a fixed order, the
//          packed tree mask, the online max/sum (fp32, log2 domain); P (bf16) and the per-row
//          rescale factor go to shared memory.
//   P*V:   warp w owns V columns [64 w, +64) of all rows: O (fp32) stays in registers, P comes
//          in through ldmatrix.
// Software pipeline per tile: P*V of tile i and Q*K^T of tile i + 1 in one phase (independent
// tensor-core work for the scheduler to interleave), a block barrier, the softmax of tile i + 1, a
// block barrier. Tiles i and i + 1 are read while tiles i + 2 and i + 3 are in flight.
// PINGPONG: a row half's partial scores and softmax involve only its own 4 warps, so the second
// block barrier becomes a 128-thread barrier per half, and the halves run the phases in opposite
// orders (half 0: Q*K^T, softmax, P*V; half 1: P*V, Q*K^T, softmax) over two P / rescale buffers:
// each half's softmax overlaps the other half's tensor-core work.
//
// STREAM ("wide2", the default): the KV copy map is fixed per thread (one token of a tile, its page id
// read a tile ahead: ~70 instead of ~250 SASS instructions per tile per warp), a row's max moves only
// when a score passes it by 2^LAZY_LOG2 (the O rescale, ~130 instructions, then almost never runs), and
// while tiles remain each phase sequence sits in one basic block so the scheduler interleaves P*V with
// the next Q*K^T (and, with PINGPONG, the softmax with P*V). WARPS = 16 (STREAM only): four row slices
// in Q*K^T and 32 V columns per warp, 128 registers: 4 warps per scheduler instead of 2. With PINGPONG
// ("wide2x16pp") the halves are warps 0-7 (row slices 0, 1) and 8-15 (slices 2, 3), each scheduler
// holds two warps of each, and their barrier is 256 threads wide.
//
// SPLIT_PV (STREAM + PINGPONG at 8 warps, "wide2pp2", pingpong 2): both halves run one order, P*V of tile i
// in two column halves: [P*V cols 0-31 + Q*K^T of tile i + 1] -> half barrier -> [softmax of tile i + 1 +
// P*V cols 32-63], the second half's MMAs placed inside the softmax after its masking branches (one basic
// block), so every phase between the barriers has independent tensor work for the 2 warps per scheduler
// (the ping-pong order leaves half 0's Q*K^T chains and half 1's softmax alone in theirs). Its lean form
// (LEAN, pingpong 3: verify_wide_lean.cuh) runs the same schedule with less integer work per tile; with all five
// probe bits of branch mma4 (LV 31, pingpong 8: K fragments a k-step ahead, the tail tile's branch taken once, the KV
// copy after the partial-score loads, the row max's shuffles on demand, exp2 as one ex2.approx.ftz) and the block's Q
// staged through shared memory by cp.async + ldmatrix (LV 32, branch mma6: pingpong 12) it is the default.
//
// Shared memory: 4 * 16 * 584 * 2 (KV) + 4 * BLOCK_M * 16 * 4 (partials) + NBUF * BLOCK_M * 24 * 2
// (P) + (NBUF + 1) * BLOCK_M * 4: at RG = 4 92.5 KB (95.8 KB with PINGPONG), under sm_120's 99 KB;
// at RG = 2 83-84 KB (two blocks per SM on sm_90 at <= 128 registers).
#pragma once

#include "verify_kernel.cuh"

namespace kdengine {

template <int RG_, bool PINGPONG_, bool STREAM_ = false, int WARPS_ = 8, bool SPLIT_PV_ = false, bool LEAN_ = false,
          int LV_ = 0>
struct WideCfg {
  static constexpr bool WIDE = true, PINGPONG = PINGPONG_;
  // LV (LEAN only, probes of branch mma4, bits; 0 = the lean form as it was): 1 = Q*K^T's K fragments double
  // buffered (the next k-step's ldmatrix before this one's MMAs), 2 = the softmax branches once on "tail tile"
  // (the common tile runs a copy without the mask code) and all of O is rescaled before the first P*V half (no
  // branch between the half barrier and the softmax: one basic block from the partial-score loads to the P store,
  // the second P*V half inside it), 4 = the KV copy issued after the softmax's partial-score loads
  // instead of before the half barrier (its LDGSTS address registers no longer block those loads), 8 = the row max's
  // shuffles only when a lane's own max passes the lazy threshold (warp vote), 16 = exp2 as one ex2.approx.ftz; branch
  // mma6: 32 / 64 Q staged through shared memory, 128 the page-table row pointer warp-uniform (branch mma8's 512 /
  // 1024, a quarter / none of P*V's columns beside Q*K^T, were measured even with the default and dropped).
  static constexpr int LV = LV_;
  // LEAN (SPLIT_PV only, "wide2pp2_lean", pingpong 3): the same schedule with less integer work per tile:
  // 32-bit shared addresses formed once per thread, the KV copy issued after Q*K^T, one "max moved" byte
  // per softmax warp read as one 64-bit word instead of 8 alpha loads and compares per P*V warp.
  static constexpr bool LEAN = LEAN_;
  // SPLIT_PV (STREAM + PINGPONG, "wide2pp2"): both halves run P*V of a tile in two column halves, one beside
  // the next tile's Q*K^T, the other beside its softmax: every phase between the barriers has tensor work
  // (in the ping-pong order half 0's Q*K^T chains and half 1's softmax run alone).
  static constexpr bool SPLIT_PV = SPLIT_PV_;
  // STREAM (the "wide2" layout): KV tiles copied by a fixed thread -> (token, columns) map with each
  // thread's page id read one tile ahead, and lazy rescaling (a row's max moves only when a score
  // passes it by more than LAZY_LOG2; P stays <= 2^LAZY_LOG2 in bf16, O and l in fp32).
  static constexpr bool STREAM = STREAM_;
  static constexpr float LAZY_LOG2 = 8.f;
  static constexpr int RG = RG_, BLOCK_M = 16 * RG;
  // WARPS = 16 (STREAM only, "wide2x16"): four row slices of 16 rows in Q*K^T, 32 V columns per warp
  // in P*V; O and Q take 64 + 36 registers, so the block fits 128 registers: 4 warps per scheduler.
  static constexpr int WARPS = WARPS_, THREADS = 32 * WARPS;
  static constexpr int RS = WARPS / 4;                            // row slices in Q*K^T (x 4 dim quarters)
  static constexpr int BN = 16, STAGES = 4;
  static constexpr int K_PART = D_QK / 4, KSTEPS = K_PART / 16;  // per warp in Q*K^T: 144 dims
  static constexpr int QM = RG / RS;                              // m16 tiles per warp in Q*K^T
  static constexpr int QACC = 1;                                  // accumulator sets (chains) per tile
  static constexpr int V_PART = DV / WARPS;                       // V columns per warp: 64 (32 at 16 warps)
  static constexpr int TILE_ELEMS = BN * STRIDE;
  static constexpr int KV_BYTES = STAGES * TILE_ELEMS * 2;
  static constexpr int EXCH_BYTES = 4 * BLOCK_M * BN * 4;         // [4 dim quarters][BLOCK_M][BN] fp32
  static constexpr int P_STRIDE = BN + 8;                         // bf16; 48-byte rows: conflict-free ldmatrix
  static constexpr int NBUF = PINGPONG ? 2 : 1;                   // P / rescale buffers
  static constexpr int P_ELEMS = BLOCK_M * P_STRIDE;
  static constexpr int P_BYTES = NBUF * P_ELEMS * 2;
  static constexpr int FLAG_BYTES = LEAN ? NBUF * WARPS : 0;       // LEAN: [NBUF][WARPS] "max moved" bytes
  static constexpr int SMEM = KV_BYTES + EXCH_BYTES + P_BYTES + (NBUF + 1) * BLOCK_M * 4 + FLAG_BYTES;
  static constexpr int EPT = BLOCK_M * BN / THREADS;              // scores per thread in the softmax
  static constexpr int TPR = BN / EPT;                            // threads per row in the softmax
  static constexpr int MIN_BLOCKS = RG == 2 ? 2 : 1;
  static_assert(RG == 2 || RG == 4, "the wide layout holds 32 or 64 rows");
  static_assert(WARPS == 8 || (WARPS == 16 && STREAM && RG == 4), "16 warps: wide2, 64 rows");
  static_assert(THREADS / 2 / TPR == BLOCK_M / 2, "softmax threads of a row half = that half's warps");
  static_assert(!PINGPONG || WARPS / 2 % 4 == 0, "ping-pong halves of whole row slices (4 dim-quarter warps each)");
  static_assert(!SPLIT_PV || (STREAM && PINGPONG && V_PART % 32 == 0), "split P*V: wide2 ping-pong, 2 x 16k columns");
  static_assert(!LEAN || (SPLIT_PV && WARPS == 8), "lean: the wide2pp2 schedule (8 flag bytes: one 64-bit word)");
  static_assert(LV == 0 || LEAN, "lean variants: the lean form only");
  static_assert(EPT == 2 || EPT == 4, "softmax vector width");
  static_assert(SMEM <= 99 * 1024, "over sm_120's 99 KB of shared memory per block");
  static_assert(THREADS % BN == 0, "whole threads per KV token in the streaming loader");
};

// The streaming KV loader (STREAM layouts): thread t always copies token t / TPT of a tile, 16-byte
// chunks t % TPT, t % TPT + TPT, ... of its row, so the shared-memory targets are fixed and each tile
// costs the thread one page-table entry, read while the previous tile's copies are in flight.
template <class C>
struct KvStream {
  static constexpr int TPT = C::THREADS / C::BN;             // threads per KV token
  static constexpr int PER = (CHUNKS + TPT - 1) / TPT;       // chunks per thread (the last may be idle)
  const int* pages;  // this sequence's page-table row
  int tok, first, page, next_start;

  __device__ __forceinline__ KvStream(const VerifyParams& p, int b, int start, int end)
      : pages(p.page_table + (size_t)b * p.max_pages), tok(threadIdx.x / TPT), first(threadIdx.x % TPT),
        page(0), next_start(start) {
    fetch(p, end);
  }
  // The page id of the next tile's token (0 past the end: never dereferenced).
  __device__ __forceinline__ void fetch(const VerifyParams& p, int end) {
    const int pos = next_start + tok;
    page = pos < end ? __ldg(pages + (pos >> p.page_shift)) : 0;
  }
  // Copy the next tile (BN tokens from next_start, zero-filled at and past `end`) into `dst`, then
  // read the page id of the tile after it.
  __device__ __forceinline__ void load(const VerifyParams& p, int end, __nv_bfloat16* dst) {
    const int pos = next_start + tok;
    const bool valid = pos < end;
    const __nv_bfloat16* src =
        valid ? p.kv + ((size_t)page * p.page_size + (pos & (p.page_size - 1))) * D_QK : p.kv;
    __nv_bfloat16* d = dst + tok * STRIDE;
#pragma unroll
    for (int k = 0; k < PER; ++k) {
      const int c = first + k * TPT;
      if (CHUNKS % TPT == 0 || c < CHUNKS) copy_chunk(d + c * 8, src + (valid ? c * 8 : 0), valid);
    }
    next_start += C::BN;
    fetch(p, end);
  }
};

// One KV tile (BN tokens from `tile_start`, zero-filled at and past `end`) into shared memory, with
// the page-table lookups of all this thread's chunks issued before its copies (one L1 round trip per
// tile instead of one per chunk).
template <class C>
__device__ __forceinline__ void load_kv_tile_hoisted(const VerifyParams& p, int b, int tile_start, int end,
                                                     __nv_bfloat16* dst) {
  constexpr int TOTAL = C::BN * CHUNKS, ITERS = (TOTAL + C::THREADS - 1) / C::THREADS;
  const int* pages = p.page_table + (size_t)b * p.max_pages;
  int page[ITERS];
#pragma unroll
  for (int k = 0; k < ITERS; ++k) {
    const int c = threadIdx.x + k * C::THREADS;
    const int pos = tile_start + c / CHUNKS;
    page[k] = (c < TOTAL && pos < end) ? __ldg(pages + (pos >> p.page_shift)) : 0;
  }
#pragma unroll
  for (int k = 0; k < ITERS; ++k) {
    const int c = threadIdx.x + k * C::THREADS;
    if (c < TOTAL) {
      const int tok = c / CHUNKS, col = (c % CHUNKS) * 8;
      const int pos = tile_start + tok;
      const bool valid = pos < end;
      const __nv_bfloat16* src = p.kv;
      if (valid) src = p.kv + ((size_t)page[k] * p.page_size + (pos & (p.page_size - 1))) * D_QK + col;
      copy_chunk(dst + tok * STRIDE + col, src, valid);
    }
  }
}

// This warp's partial scores of one tile (its row slice x 16 tokens over its 144 dims) into `exch`.
template <class C>
__device__ __forceinline__ void wide_partial_scores(const __nv_bfloat16* tile, const uint32_t (&qa)[C::QM][C::KSTEPS][4],
                                                    float* exch, int slice, int quarter, int lane) {
  float s[C::QACC][C::QM][2][4];
#pragma unroll
  for (int a = 0; a < C::QACC; ++a)
#pragma unroll
    for (int mi = 0; mi < C::QM; ++mi)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) s[a][mi][nt][0] = s[a][mi][nt][1] = s[a][mi][nt][2] = s[a][mi][nt][3] = 0.f;
  const __nv_bfloat16* kbase =
      tile + ((lane & 7) + ((lane >> 4) << 3)) * STRIDE + quarter * C::K_PART + ((lane >> 3) & 1) * 8;
#pragma unroll
  for (int ks = 0; ks < C::KSTEPS; ++ks) {
    uint32_t kb[4];
    ldmatrix_x4(kb, kbase + ks * 16);
#pragma unroll
    for (int mi = 0; mi < C::QM; ++mi) {
      mma_bf16(s[ks % C::QACC][mi][0], qa[mi][ks], kb[0], kb[1]);
      mma_bf16(s[ks % C::QACC][mi][1], qa[mi][ks], kb[2], kb[3]);
    }
  }
  float* dst = exch + (quarter * C::BLOCK_M + slice * (C::BLOCK_M / C::RS)) * C::BN;
#pragma unroll
  for (int mi = 0; mi < C::QM; ++mi)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float x = s[0][mi][nt][2 * h], y = s[0][mi][nt][2 * h + 1];
#pragma unroll
        for (int a = 1; a < C::QACC; ++a) x += s[a][mi][nt][2 * h], y += s[a][mi][nt][2 * h + 1];
        *reinterpret_cast<float2*>(dst + (mi * 16 + lane / 4 + 8 * h) * C::BN + nt * 8 + (lane % 4) * 2) =
            make_float2(x, y);
      }
}

template <int N>
__device__ __forceinline__ void load_floats(float (&v)[N], const float* src) {
  if constexpr (N == 4) {
    const float4 x = *reinterpret_cast<const float4*>(src);
    v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
  } else {
    const float2 x = *reinterpret_cast<const float2*>(src);
    v[0] = x.x, v[1] = x.y;
  }
}

// This thread's EPT summed scores (tokens [stok, +EPT) of the tile) into the log2 domain, masked on the tail
// tile (past `end`, or a tree token the row may not see: -inf); returns their max.
// MAYBE_TAIL false: the caller knows the tile is before the tree tail (no mask code at all).
template <class C, bool MAYBE_TAIL = true>
__device__ __forceinline__ float mask_scores(const VerifyParams& p, float (&v)[C::EPT], int stok, int mask_off,
                                             int tile_start, int prefix, int end) {
  constexpr int EPT = C::EPT;
  const bool tail = MAYBE_TAIL && tile_start + C::BN > prefix;
  float mx = -INFINITY;
#pragma unroll
  for (int e = 0; e < EPT; ++e) {
    float x = v[e] * p.scale_log2;
    if (tail) {
      const int pos = tile_start + stok + e;
      if (pos >= end) {
        x = -INFINITY;
      } else if (pos >= prefix) {
        const int j = pos - prefix;
        if (!((__ldg(p.mask_bits + mask_off + (j >> 5)) >> (j & 31)) & 1)) x = -INFINITY;
      }
    }
    v[e] = x;
    mx = fmaxf(mx, x);
  }
  return mx;
}

struct NoWork {
  __device__ __forceinline__ void operator()() const {}
};

// Online softmax of one tile for this thread's EPT scores of row `srow` (tokens [stok, +EPT)).
// Writes P (bf16) and the row's rescale factor for the P*V phase; m is the row's running max (log2
// domain, identical in the TPR threads of the row), l this thread's share of the running sum.
// `beside` runs after the masking (its branches): register-only work placed there shares a basic block
// with the rest of the softmax, so the scheduler can interleave the two (SPLIT_PV: that tile's P*V MMAs).
template <class C, class Beside = NoWork>
__device__ __forceinline__ void wide_softmax(const VerifyParams& p, const float* exch, __nv_bfloat16* p_s,
                                             float* alpha_s, int srow, int stok, int mask_off, int tile_start,
                                             int prefix, int end, float& m, float& l, const Beside& beside = {}) {
  constexpr int EPT = C::EPT;
  float v[EPT], part[EPT];
  load_floats(v, exch + srow * C::BN + stok);
#pragma unroll
  for (int q = 1; q < 4; ++q) {
    load_floats(part, exch + (q * C::BLOCK_M + srow) * C::BN + stok);
#pragma unroll
    for (int e = 0; e < EPT; ++e) v[e] += part[e];
  }
  float mx = mask_scores<C>(p, v, stok, mask_off, tile_start, prefix, end);
  beside();
#pragma unroll
  for (int off = 1; off < C::TPR; off *= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, off));
  float m_new = fmaxf(m, mx);
  if constexpr (C::STREAM) m_new = mx > m + C::LAZY_LOG2 ? mx : m;  // -inf + 8 = -inf: the first finite max moves it
  const float m_use = m_new == -INFINITY ? 0.f : m_new;
  const float alpha = C::STREAM && m_new == m ? 1.f : exp2f(m - m_use);  // exactly 1: wide_pv skips the rescale
  float sum = 0.f;
#pragma unroll
  for (int e = 0; e < EPT; ++e) {
    v[e] = exp2f(v[e] - m_use);
    sum += v[e];
  }
  l = l * alpha + sum;  // this thread's share of the row sum (alpha is the row's): summed at the end
  m = m_new;
  __nv_bfloat16* dst = p_s + srow * C::P_STRIDE + stok;
  if constexpr (EPT == 4) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]));
  } else {
    *reinterpret_cast<uint32_t*>(dst) = pack_bf16(v[0], v[1]);
  }
  if (threadIdx.x % C::TPR == 0) alpha_s[srow] = alpha;
}

// O[:, this warp's 64 columns] = O * alpha + P * V of one tile.
template <class C>
__device__ __forceinline__ void wide_pv(const __nv_bfloat16* tile, const __nv_bfloat16* p_s, const float* alpha_s,
                                        float (&o)[C::RG][C::V_PART / 8][4], int warp, int lane) {
  float a[C::RG][2];
  bool moved = false;
#pragma unroll
  for (int mi = 0; mi < C::RG; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      a[mi][h] = alpha_s[mi * 16 + lane / 4 + 8 * h];
      moved |= a[mi][h] != 1.f;
    }
  if (__any_sync(0xffffffff, moved)) {  // rare once the row maxima have settled
#pragma unroll
    for (int mi = 0; mi < C::RG; ++mi)
#pragma unroll
      for (int nt = 0; nt < C::V_PART / 8; ++nt) {
        o[mi][nt][0] *= a[mi][0];
        o[mi][nt][1] *= a[mi][0];
        o[mi][nt][2] *= a[mi][1];
        o[mi][nt][3] *= a[mi][1];
      }
  }
  const __nv_bfloat16* pbase = p_s + (lane & 15) * C::P_STRIDE + (lane >> 4) * 8;
  if constexpr (C::V_PART / 16 < C::RG) {
    // 16 warps: V's 2 fragments first, then one P fragment at a time (8 + 4 registers live instead of
    // 16 + 4: no spills at 128)
    const __nv_bfloat16* vbase =
        tile + ((lane & 7) + ((lane >> 3) & 1) * 8) * STRIDE + warp * C::V_PART + (lane >> 4) * 8;
    uint32_t vb[C::V_PART / 16][4];
#pragma unroll
    for (int np = 0; np < C::V_PART / 16; ++np) ldmatrix_x4_trans(vb[np], vbase + np * 16);
#pragma unroll
    for (int mi = 0; mi < C::RG; ++mi) {
      uint32_t pa[4];
      ldmatrix_x4(pa, pbase + mi * 16 * C::P_STRIDE);
#pragma unroll
      for (int np = 0; np < C::V_PART / 16; ++np) {
        mma_bf16(o[mi][2 * np], pa, vb[np][0], vb[np][1]);
        mma_bf16(o[mi][2 * np + 1], pa, vb[np][2], vb[np][3]);
      }
    }
  } else {
    uint32_t pa[C::RG][4];
#pragma unroll
    for (int mi = 0; mi < C::RG; ++mi) ldmatrix_x4(pa[mi], pbase + mi * 16 * C::P_STRIDE);
    const __nv_bfloat16* vbase =
        tile + ((lane & 7) + ((lane >> 3) & 1) * 8) * STRIDE + warp * C::V_PART + (lane >> 4) * 8;
#pragma unroll
    for (int np = 0; np < C::V_PART / 16; ++np) {
      uint32_t vb[4];
      ldmatrix_x4_trans(vb, vbase + np * 16);
#pragma unroll
      for (int mi = 0; mi < C::RG; ++mi) {
        mma_bf16(o[mi][2 * np], pa[mi], vb[0], vb[1]);
        mma_bf16(o[mi][2 * np + 1], pa[mi], vb[2], vb[3]);
      }
    }
  }
}

// SPLIT_PV: P*V of one tile on columns [16 NP0, 16 NP1) of this warp's V_PART, its ldmatrix operands loaded
// apart from the MMAs (the second half's are loaded before the softmax, so its MMAs interleave with the
// softmax: they touch no memory, while the loads must stay ahead of the softmax's P stores).
template <class C, int NP0, int NP1>
struct PvCols {
  uint32_t pa[C::RG][4], vb[NP1 - NP0][4];

  __device__ __forceinline__ void load(const __nv_bfloat16* tile, const __nv_bfloat16* p_s, int warp, int lane) {
    const __nv_bfloat16* pbase = p_s + (lane & 15) * C::P_STRIDE + (lane >> 4) * 8;
#pragma unroll
    for (int mi = 0; mi < C::RG; ++mi) ldmatrix_x4(pa[mi], pbase + mi * 16 * C::P_STRIDE);
    const __nv_bfloat16* vbase =
        tile + ((lane & 7) + ((lane >> 3) & 1) * 8) * STRIDE + warp * C::V_PART + (lane >> 4) * 8;
#pragma unroll
    for (int np = NP0; np < NP1; ++np) ldmatrix_x4_trans(vb[np - NP0], vbase + np * 16);
  }
  // O[:, these columns] *= alpha (call when any alpha of the tile != 1: rarely), before mma
  __device__ __forceinline__ void rescale(float (&o)[C::RG][C::V_PART / 8][4], const float* alpha_s, int lane) const {
#pragma unroll
    for (int mi = 0; mi < C::RG; ++mi) {
      const float a0 = alpha_s[mi * 16 + lane / 4], a1 = alpha_s[mi * 16 + lane / 4 + 8];
#pragma unroll
      for (int nt = 2 * NP0; nt < 2 * NP1; ++nt) {
        o[mi][nt][0] *= a0;
        o[mi][nt][1] *= a0;
        o[mi][nt][2] *= a1;
        o[mi][nt][3] *= a1;
      }
    }
  }
  // O[:, these columns] += P * V (register operands only: no memory access)
  __device__ __forceinline__ void mma(float (&o)[C::RG][C::V_PART / 8][4]) const {
#pragma unroll
    for (int np = NP0; np < NP1; ++np)
#pragma unroll
      for (int mi = 0; mi < C::RG; ++mi) {
        mma_bf16(o[mi][2 * np], pa[mi], vb[np - NP0][0], vb[np - NP0][1]);
        mma_bf16(o[mi][2 * np + 1], pa[mi], vb[np - NP0][2], vb[np - NP0][3]);
      }
  }
};

// Whether any row's alpha of the tile differs from 1 (warp-uniform): the O rescale is needed.
template <class C>
__device__ __forceinline__ bool alpha_moved(const float* alpha_s, int lane) {
  bool moved = false;
#pragma unroll
  for (int mi = 0; mi < C::RG; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) moved |= alpha_s[mi * 16 + lane / 4 + 8 * h] != 1.f;
  return __any_sync(0xffffffff, moved);
}

// Normalise and write this split's partial rows (row_s's last BLOCK_M floats then carry 1 / l).
template <class C>
__device__ __forceinline__ void write_partials(const VerifyParams& p, const float (&o)[C::RG][C::V_PART / 8][4], float m_run,
                                               float l_run, float* row_s, int srow, int row0, size_t part_row0,
                                               int warp, int lane) {
  if (threadIdx.x == 0) timeline::timeline_mark(timeline::SPLIT_TRIGGER);  // (-DKDENGINE_TIMELINE only)
  pdl_launch_dependents();  // the merge may launch (a no-op where p.merge_early let it at the start)
  const int R = p.R;
#pragma unroll
  for (int off = 1; off < C::TPR; off *= 2) l_run += __shfl_xor_sync(0xffffffff, l_run, off);
  float* inv_s = row_s + C::NBUF * C::BLOCK_M;  // [BLOCK_M], apart from the rescale buffers
  if (threadIdx.x % C::TPR == 0) {
    inv_s[srow] = l_run > 0.f ? 1.f / l_run : 0.f;
    if (row0 + srow < R)
      p.part_lse[part_row0 + row0 + srow] = l_run > 0.f ? (m_run + log2f(l_run)) * 0.69314718056f : -INFINITY;
  }
  __syncthreads();
#pragma unroll
  for (int mi = 0; mi < C::RG; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = mi * 16 + lane / 4 + 8 * h;
      const bool valid = row0 + r < R;
      const float inv = inv_s[r];
      __nv_bfloat16* dst = p.part_out + (part_row0 + min(row0 + r, R - 1)) * DV + warp * C::V_PART;
#pragma unroll
      for (int nt = 0; nt < C::V_PART / 8; nt += 2)  // whole sectors (verify_partials.cuh)
        store_partial16(dst + nt * 8, lane % 4, valid, o[mi][nt][2 * h] * inv, o[mi][nt][2 * h + 1] * inv,
                        o[mi][nt + 1][2 * h] * inv, o[mi][nt + 1][2 * h + 1] * inv);
    }
}

template <class C>
__global__ void __launch_bounds__(C::THREADS, C::MIN_BLOCKS) verify_split_kernel_wide(const VerifyParams p) {
  constexpr int BN = C::BN, STAGES = C::STAGES, BLOCK_M = C::BLOCK_M;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __nv_bfloat16* kv_s = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  float* exch = reinterpret_cast<float*>(smem_raw + C::KV_BYTES);  // [4][BLOCK_M][BN]
  __nv_bfloat16* p_s = reinterpret_cast<__nv_bfloat16*>(smem_raw + C::KV_BYTES + C::EXCH_BYTES);  // [BLOCK_M][P_STRIDE]
  float* row_s = reinterpret_cast<float*>(smem_raw + C::KV_BYTES + C::EXCH_BYTES + C::P_BYTES);  // [NBUF + 1][BLOCK_M]

  const int b = blockIdx.z, split = blockIdx.y, row0 = blockIdx.x * BLOCK_M;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int slice = warp / 4, quarter = warp % 4;  // Q*K^T: the row slice (a row half at 8 warps), dim quarter
  // PINGPONG: the row half (the slice itself at 8 warps: written so, that layout's SASS is unchanged)
  [[maybe_unused]] const int half = C::WARPS == 8 ? slice : warp / (C::WARPS / 2);
  const int T = p.T, R = p.R;
  const int prefix = p.prefix_len[b];
  int start, end;
  size_t part_row0;
  if (!split_range<BN, BLOCK_M, C::THREADS>(p, b, split, row0, start, end, part_row0)) return;

  // every split block is resident: the merge may launch (p.merge_early; else from write_partials)
  if (C::STREAM && p.merge_early) pdl_launch_dependents();
  const int ntiles = (end - start + BN - 1) / BN;
  KvStream<C> stream(p, b, start, end);  // STREAM layouts only (the compiler drops it otherwise)
#pragma unroll
  for (int st = 0; st < STAGES - 1; ++st) {
    if (st < ntiles) {
      if constexpr (C::STREAM)
        stream.load(p, end, kv_s + st * C::TILE_ELEMS);
      else
        load_kv_tile_hoisted<C>(p, b, start + st * BN, end, kv_s + st * C::TILE_ELEMS);
    }
    cp_async_commit();
  }

  uint32_t qa[C::QM][C::KSTEPS][4];
#pragma unroll
  for (int mi = 0; mi < C::QM; ++mi)
    load_q_fragments<C>(p, b, row0 + slice * (BLOCK_M / C::RS) + mi * 16, quarter * C::K_PART, qa[mi]);

  // The softmax role of this thread: EPT scores of one row.
  const int srow = threadIdx.x / C::TPR, stok = (threadIdx.x % C::TPR) * C::EPT;
  const int mask_row = min(row0 + srow, R - 1);
  const int mask_off = (b * T + mask_row / p.H) * p.W;
  float m_run = -INFINITY, l_run = 0.f;

  float o[C::RG][C::V_PART / 8][4];
#pragma unroll
  for (int mi = 0; mi < C::RG; ++mi)
#pragma unroll
    for (int nt = 0; nt < C::V_PART / 8; ++nt) o[mi][nt][0] = o[mi][nt][1] = o[mi][nt][2] = o[mi][nt][3] = 0.f;

  cp_async_wait<STAGES - 2>();  // tile 0
  __syncthreads();
  wide_partial_scores<C>(kv_s, qa, exch, slice, quarter, lane);
  __syncthreads();
  wide_softmax<C>(p, exch, p_s, row_s, srow, stok, mask_off, start, prefix, end, m_run, l_run);

  for (int it = 0; it < ntiles; ++it) {
    cp_async_wait<STAGES - 3>();  // tile it + 1 (and P / alpha of tile it) visible after the barrier
    __syncthreads();
    const int next = it + STAGES - 1;  // into the stage of tile it - 1, which every warp has finished
    if (next < ntiles) {
      if constexpr (C::STREAM)
        stream.load(p, end, kv_s + (next % STAGES) * C::TILE_ELEMS);
      else
        load_kv_tile_hoisted<C>(p, b, start + next * BN, end, kv_s + (next % STAGES) * C::TILE_ELEMS);
    }
    cp_async_commit();
    const __nv_bfloat16* cur = kv_s + (it % STAGES) * C::TILE_ELEMS;
    const __nv_bfloat16* nxt = kv_s + ((it + 1) % STAGES) * C::TILE_ELEMS;
    const bool more = it + 1 < ntiles;  // block-uniform
    const int nxt_start = start + (it + 1) * BN;
    if constexpr (!C::PINGPONG) {
      if (C::STREAM && more) {  // one basic block: the scheduler interleaves the two independent MMA streams
        wide_pv<C>(cur, p_s, row_s, o, warp, lane);
        wide_partial_scores<C>(nxt, qa, exch, slice, quarter, lane);
      } else {
        wide_pv<C>(cur, p_s, row_s, o, warp, lane);
        if (more) wide_partial_scores<C>(nxt, qa, exch, slice, quarter, lane);
      }
      __syncthreads();  // P / alpha of tile it consumed, partial scores of tile it + 1 written
      if (more) wide_softmax<C>(p, exch, p_s, row_s, srow, stok, mask_off, nxt_start, prefix, end, m_run, l_run);
    } else {
      // Tile it's P / alpha in buffer it % 2, tile it + 1's go to the other one. A row half's partial
      // scores and softmax involve only its own warps (4, or 8 at 16 warps: its row slices; threads
      // THREADS / 2 * half.. hold its rows), so the halves meet at a barrier of THREADS / 2 threads, in
      // opposite orders: half 0 runs its softmax while half 1 runs P*V on the tensor cores, and the
      // other way round.
      const __nv_bfloat16* p_cur = p_s + (it & 1) * C::P_ELEMS;
      const float* a_cur = row_s + (it & 1) * BLOCK_M;
      __nv_bfloat16* p_nxt = p_s + ((it + 1) & 1) * C::P_ELEMS;
      float* a_nxt = row_s + ((it + 1) & 1) * BLOCK_M;
      // STREAM: each phase sequence in one basic block while tiles remain (softmax next to P*V, P*V
      // next to Q*K^T: the scheduler interleaves them), P*V alone on the last tile.
      if constexpr (C::SPLIT_PV) {  // both halves: [P*V(cur) cols 0.5 + Q*K^T(nxt)], barrier, [softmax(nxt) + P*V cols 0.5..1]
        constexpr int NP = C::V_PART / 16, NPH = NP / 2;
        if (more) {
          const bool moved = alpha_moved<C>(a_cur, lane);
          {
            PvCols<C, 0, NPH> pv;
            pv.load(cur, p_cur, warp, lane);
            if (moved) pv.rescale(o, a_cur, lane);
            pv.mma(o);
          }
          wide_partial_scores<C>(nxt, qa, exch, slice, quarter, lane);
          if (half == 0)  // literal ids: a computed one makes ptxas reserve all 16 named barriers
            group_barrier(1, C::THREADS / 2);
          else
            group_barrier(2, C::THREADS / 2);
          // The second column half's ldmatrix loads stay ahead of the softmax's P stores (the other P
          // buffer: no hazard, but ptxas cannot tell), its MMAs go beside the softmax. Where the loads sit
          // is chosen per arch by ptxas's register allocation at the 255 limit (no spills on either):
          // sm_120 before the softmax (beside it: 36 B of spills), sm_90 beside it (before: 20 B).
          PvCols<C, NPH, NP> pv;
          if (moved) pv.rescale(o, a_cur, lane);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
          pv.load(cur, p_cur, warp, lane);
          wide_softmax<C>(p, exch, p_nxt, a_nxt, srow, stok, mask_off, nxt_start, prefix, end, m_run, l_run,
                          [&] { pv.mma(o); });
#else
          wide_softmax<C>(p, exch, p_nxt, a_nxt, srow, stok, mask_off, nxt_start, prefix, end, m_run, l_run, [&] {
            pv.load(cur, p_cur, warp, lane);
            pv.mma(o);
          });
#endif
        } else {
          wide_pv<C>(cur, p_cur, a_cur, o, warp, lane);
        }
      } else if (half == 0) {
        if (more) {
          wide_partial_scores<C>(nxt, qa, exch, slice, quarter, lane);
          group_barrier(1, C::THREADS / 2);
          wide_softmax<C>(p, exch, p_nxt, a_nxt, srow, stok, mask_off, nxt_start, prefix, end, m_run, l_run);
          if constexpr (C::STREAM) wide_pv<C>(cur, p_cur, a_cur, o, warp, lane);
        }
        if (!C::STREAM || !more) wide_pv<C>(cur, p_cur, a_cur, o, warp, lane);
      } else {
        if (C::STREAM && more) {
          wide_pv<C>(cur, p_cur, a_cur, o, warp, lane);
          wide_partial_scores<C>(nxt, qa, exch, slice, quarter, lane);
          group_barrier(2, C::THREADS / 2);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 1000
          if constexpr (C::WARPS == 16) {  // sm_90: P / alpha addresses formed after the barrier, not held
            int nb = (it + 1) & 1;         // across P*V and Q*K^T, where ptxas spilled them at 128 registers
            asm volatile("" : "+r"(nb));   // (on sm_120 this form spills more: there the plain one, below)
            p_nxt = p_s + nb * C::P_ELEMS;
            a_nxt = row_s + nb * BLOCK_M;
          }
#endif
          wide_softmax<C>(p, exch, p_nxt, a_nxt, srow, stok, mask_off, nxt_start, prefix, end, m_run, l_run);
        } else {
          wide_pv<C>(cur, p_cur, a_cur, o, warp, lane);
          if (more) {
            wide_partial_scores<C>(nxt, qa, exch, slice, quarter, lane);
            group_barrier(2, C::THREADS / 2);
            wide_softmax<C>(p, exch, p_nxt, a_nxt, srow, stok, mask_off, nxt_start, prefix, end, m_run, l_run);
          }
        }
      }
    }
  }

  write_partials<C>(p, o, m_run, l_run, row_s, srow, row0, part_row0, warp, lane);
}

}  // namespace kdengine
