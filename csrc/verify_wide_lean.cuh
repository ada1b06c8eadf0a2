// The lean form of wide2pp2 (WideCfg::LEAN, "wide2pp2_lean", pingpong 3): the schedule of
// verify_wide.cuh's SPLIT_PV path (P*V of tile i in two column halves, one beside Q*K^T of tile i + 1,
// one inside its softmax; two row halves with their own barrier), with less integer work per tile:
//   - every shared-memory operand is a 32-bit shared-window address (ld/st.shared, ldmatrix, cp.async),
//     each thread's offsets (K and V ldmatrix rows, P rows, partial-score slots, softmax slots, KV copy
//     target) formed once before the tile loop; a tile adds its stage / buffer offset to them;
//   - the KV copy map of KvStream with the global source formed as one wide multiply from the page id
//     (the next tile's token position carried, not recomputed), issued after Q*K^T and just before the
//     half barrier, so its address registers are not needed again at once;
//   - each softmax warp writes one "max moved" byte per tile ([NBUF][8] bytes); P*V reads the 8 bytes of
//     the tile as one 64-bit word (one load, one compare, warp-uniform) instead of 8 alpha loads and
//     compares per warp; the alphas themselves are read only when a max moved (rarely).
// WideCfg::LV (bits; the probes of branch mma4, all five = pingpong 8, the default until mma6): 1 Q*K^T's K fragments per n8
// tile (ldmatrix.x2) a k-step ahead, 2 one branch on the tail tile (the common tile's softmax has no mask code, all of O
// rescaled before the first P*V half), 4 the KV copy after the softmax's partial-score loads, 8 the row max's
// shuffles only where a lane's own max passes the lazy threshold, 16 exp2 as one ex2.approx.ftz; the probes of branch
// mma6: 32 / 64 the block's Q staged through shared memory (lean_stage_q; 31 + 32 = pingpong 12, the default since),
// 128 the page-table row pointer warp-uniform (KvStreamLean; slower) (branch mma8's 512 / 1024, a quarter / none of
// P*V's columns beside Q*K^T, even with the default on the H200: perf_history/kernel/mma8_e949c85/).
// Shared memory: verify_wide.cuh's layout plus the 16 flag bytes after the row buffers.
#pragma once

#include "verify_wide.cuh"

namespace kdengine {

// --- 32-bit shared-memory operands ------------------------------------------------------------------

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], uint32_t a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// One 16-byte chunk global -> shared, `bytes` (16 or 0: zero-fill) read; the scalar-load ablation
// build copies it as four 4-byte pieces.
__device__ __forceinline__ void copy_chunk(uint32_t dst, const void* src, int bytes) {
#ifdef KDENGINE_SCALAR_LOADS
  const int piece = bytes >> 2;
#pragma unroll
  for (int w = 0; w < 4; ++w)
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst + 4 * w),
                 "l"(static_cast<const char*>(src) + 4 * w), "r"(piece));
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
#endif
}

__device__ __forceinline__ void st_shared_f32x2(uint32_t a, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(a), "f"(x), "f"(y) : "memory");
}
__device__ __forceinline__ void st_shared_f32(uint32_t a, float x) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(a), "f"(x) : "memory");
}
__device__ __forceinline__ void st_shared_u32(uint32_t a, uint32_t x) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(a), "r"(x) : "memory");
}
__device__ __forceinline__ void st_shared_u32x2(uint32_t a, uint32_t x, uint32_t y) {
  asm volatile("st.shared.v2.u32 [%0], {%1, %2};\n" ::"r"(a), "r"(x), "r"(y) : "memory");
}
__device__ __forceinline__ void st_shared_u8(uint32_t a, uint32_t x) {
  asm volatile("st.shared.u8 [%0], %1;\n" ::"r"(a), "r"(x) : "memory");
}
__device__ __forceinline__ float ld_shared_f32(uint32_t a) {
  float x;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(x) : "r"(a) : "memory");
  return x;
}
__device__ __forceinline__ unsigned long long ld_shared_u64(uint32_t a) {
  unsigned long long x;
  asm volatile("ld.shared.u64 %0, [%1];\n" : "=l"(x) : "r"(a) : "memory");
  return x;
}
template <int N>
__device__ __forceinline__ void ld_shared_floats(float (&v)[N], uint32_t a) {
  if constexpr (N == 4) {
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3])
                 : "r"(a)
                 : "memory");
  } else {
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v[0]), "=f"(v[1]) : "r"(a) : "memory");
  }
}

// --- the tile phases --------------------------------------------------------------------------------

// KvStream's copy map (thread t: token t / TPT of a tile, chunks t % TPT + k TPT) with 32-bit targets
// and the next token position carried.
// LV & 128: the page-table row pointer passes through a shuffle from lane 0 once: ptxas then keeps it in a register pair
// (+2 registers) instead of reloading the parameter from the constant bank every tile (LDC.64) and rebuilding the entry
// address with 4 integer instructions (IMAD.WIDE instead; sm_90a SASS: 281 instructions per tile against 285). The page
// shift stays a constant-bank load (ptxas folds a shuffle of it, volatile or not, back into LDC).
template <class C>
struct KvStreamLean {
  static constexpr int TPT = C::THREADS / C::BN, PER = (CHUNKS + TPT - 1) / TPT;
  const int* pages;  // this sequence's page-table row
  uint32_t dst;      // this thread's first chunk in stage 0 (shared window)
  int first16;       // its byte offset in a KV row
  int pos, page;     // this thread's token in the next tile to copy, its page id (0 past the end)

  __device__ __forceinline__ static const int* page_row(const VerifyParams& p, int b) {
    const int* row = p.page_table + (size_t)b * p.max_pages;
    if constexpr (C::LV & 128)
      return reinterpret_cast<const int*>(__shfl_sync(0xffffffff, reinterpret_cast<unsigned long long>(row), 0));
    return row;
  }
  __device__ __forceinline__ KvStreamLean(const VerifyParams& p, int b, int start, int end, uint32_t kv_base)
      : pages(page_row(p, b)),
        dst(kv_base + ((threadIdx.x / TPT) * STRIDE + threadIdx.x % TPT * 8) * 2),
        first16(threadIdx.x % TPT * 16),
        pos(start + threadIdx.x / TPT) {
    fetch(p, end);
  }
  __device__ __forceinline__ void fetch(const VerifyParams& p, int end) {
    page = pos < end ? __ldg(pages + (pos >> p.page_shift)) : 0;
  }
  // Copy the next tile into the stage at byte offset `stage` (zero-filled past `end`: there page 0's row
  // is named, in bounds, and none of it read), then read the page id of the tile after it.
  __device__ __forceinline__ void load(const VerifyParams& p, int end, uint32_t stage) {
    const int bytes = pos < end ? 16 : 0;
    const unsigned row = page * p.page_size + (pos & (p.page_size - 1));
    const char* src = reinterpret_cast<const char*>(p.kv) + (size_t)row * (D_QK * 2) + first16;
#pragma unroll
    for (int k = 0; k < PER; ++k)
      if (CHUNKS % TPT == 0 || first16 + k * TPT * 16 < CHUNKS * 16)
        copy_chunk(dst + stage + k * TPT * 16, src + k * TPT * 16, bytes);
    pos += C::BN;
    fetch(p, end);
  }
};

// This warp's partial scores of one tile: `k` its ldmatrix row address in the tile's stage, `dst` its
// first partial-score slot.
template <class C>
__device__ __forceinline__ void lean_partial_scores(uint32_t k, const uint32_t (&qa)[C::QM][C::KSTEPS][4], uint32_t dst) {
  float s[C::QM][2][4];
#pragma unroll
  for (int mi = 0; mi < C::QM; ++mi)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) s[mi][nt][0] = s[mi][nt][1] = s[mi][nt][2] = s[mi][nt][3] = 0.f;
  if constexpr (C::LV & 1) {
    // K fragments per n8 tile (ldmatrix.x2, `k` then the address of lanes 0-15's rows, tokens 0-7; + 8 rows for
    // tokens 8-15): the next k-step's half for one n tile is loaded while the other n tile's MMAs issue, in the
    // same 4 registers (ptxas undid a plain double buffer of the x4 fragment at 252 registers)
    constexpr uint32_t NT1 = 8 * STRIDE * 2;
    uint32_t k0[2], k1[2];
    ldmatrix_x2(k0, k);
    ldmatrix_x2(k1, k + NT1);
#pragma unroll
    for (int ks = 0; ks < C::KSTEPS; ++ks) {
#pragma unroll
      for (int mi = 0; mi < C::QM; ++mi) mma_bf16(s[mi][0], qa[mi][ks], k0[0], k0[1]);
      if (ks + 1 < C::KSTEPS) ldmatrix_x2(k0, k + (ks + 1) * 32);
#pragma unroll
      for (int mi = 0; mi < C::QM; ++mi) mma_bf16(s[mi][1], qa[mi][ks], k1[0], k1[1]);
      if (ks + 1 < C::KSTEPS) ldmatrix_x2(k1, k + NT1 + (ks + 1) * 32);
    }
  } else {
#pragma unroll
    for (int ks = 0; ks < C::KSTEPS; ++ks) {
      uint32_t kb[4];
      ldmatrix_x4(kb, k + ks * 32);
#pragma unroll
      for (int mi = 0; mi < C::QM; ++mi) {
        mma_bf16(s[mi][0], qa[mi][ks], kb[0], kb[1]);
        mma_bf16(s[mi][1], qa[mi][ks], kb[2], kb[3]);
      }
    }
  }
#pragma unroll
  for (int mi = 0; mi < C::QM; ++mi)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        st_shared_f32x2(dst + ((mi * 16 + 8 * h) * C::BN + nt * 8) * 4, s[mi][nt][2 * h], s[mi][nt][2 * h + 1]);
}

// This thread's shared-memory slots in the softmax (buffer 0; the other buffer is + P / A / F_STRIDE).
struct LeanSoftmaxSlots {
  uint32_t exch, p, alpha, flag;  // its 4 partial scores (quarter 0), its P, its row's alpha, its warp's flag
};

// 2^x: exp2f, or (LV & 16) one ex2.approx.ftz (no denormal fix-up: results below 2^-126 flush to 0, nothing
// against a row sum of at least 1)
template <class C>
__device__ __forceinline__ float lean_exp2(float x) {
  if constexpr (C::LV & 16) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
  } else {
    return exp2f(x);
  }
}

// The softmax of one tile after its partial scores are summed (v: this thread's EPT scores): wide_softmax of
// verify_wide.cuh on 32-bit addresses, plus the warp's "max moved" byte. MAYBE_TAIL: mask_scores's.
template <class C, bool MAYBE_TAIL, class Beside>
__device__ __forceinline__ void lean_softmax_summed(const VerifyParams& p, float (&v)[C::EPT], const LeanSoftmaxSlots& at,
                                                    int buf, int stok, int mask_off, int tile_start, int prefix, int end,
                                                    float& m, float& l, const Beside& beside) {
  constexpr int EPT = C::EPT;
  float mx = mask_scores<C, MAYBE_TAIL>(p, v, stok, mask_off, tile_start, prefix, end);
  beside();
  float m_new = m;
  // LV & 8: the row max (TPR lanes' shuffles) only where it may move: a lane's own max past m + LAZY_LOG2 means its
  // row's is too, and where no lane's is, no row's max moves (the same m_new as below, without the shuffles)
  if (!(C::LV & 8) || __any_sync(0xffffffff, mx > m + C::LAZY_LOG2)) {
#pragma unroll
    for (int off = 1; off < C::TPR; off *= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, off));
    m_new = mx > m + C::LAZY_LOG2 ? mx : m;  // -inf + 8 = -inf: the first finite max moves it
  }
  const bool moved = m_new != m;
  const float m_use = m_new == -INFINITY ? 0.f : m_new;
  const float alpha = moved ? lean_exp2<C>(m - m_use) : 1.f;
  float sum = 0.f;
#pragma unroll
  for (int e = 0; e < EPT; ++e) {
    v[e] = lean_exp2<C>(v[e] - m_use);
    sum += v[e];
  }
  l = l * alpha + sum;
  m = m_new;
  const uint32_t pdst = at.p + buf * C::P_ELEMS * 2;
  if constexpr (EPT == 4)
    st_shared_u32x2(pdst, pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]));
  else
    st_shared_u32(pdst, pack_bf16(v[0], v[1]));
  if (threadIdx.x % C::TPR == 0) st_shared_f32(at.alpha + buf * C::BLOCK_M * 4, alpha);
  st_shared_u8(at.flag + buf * C::WARPS, __any_sync(0xffffffff, moved));  // one byte, the same from every lane
}

// The softmax of one tile: its 4 partial scores summed, then lean_softmax_summed. `early` runs after the
// partial-score loads are issued (LV & 4: the KV copy); LV & 2: one branch on "tail tile" here, the common
// tile without any mask code.
template <class C, class Beside, class Early = NoWork>
__device__ __forceinline__ void lean_softmax(const VerifyParams& p, const LeanSoftmaxSlots& at, int buf, int stok,
                                             int mask_off, int tile_start, int prefix, int end, float& m, float& l,
                                             const Beside& beside, const Early& early = {}) {
  constexpr int EPT = C::EPT;
  float v[EPT], part[EPT];
  ld_shared_floats(v, at.exch);
  if constexpr (C::LV & 4) {
    float part2[EPT], part3[EPT];
    ld_shared_floats(part, at.exch + C::BLOCK_M * C::BN * 4);
    ld_shared_floats(part2, at.exch + 2 * C::BLOCK_M * C::BN * 4);
    ld_shared_floats(part3, at.exch + 3 * C::BLOCK_M * C::BN * 4);
    early();
#pragma unroll
    for (int e = 0; e < EPT; ++e) v[e] = v[e] + part[e] + part2[e] + part3[e];
  } else {
#pragma unroll
    for (int q = 1; q < 4; ++q) {
      ld_shared_floats(part, at.exch + q * C::BLOCK_M * C::BN * 4);
#pragma unroll
      for (int e = 0; e < EPT; ++e) v[e] += part[e];
    }
    early();
  }
  if constexpr (C::LV & 2) {
    if (tile_start + C::BN > prefix)
      lean_softmax_summed<C, true>(p, v, at, buf, stok, mask_off, tile_start, prefix, end, m, l, beside);
    else
      lean_softmax_summed<C, false>(p, v, at, buf, stok, mask_off, tile_start, prefix, end, m, l, beside);
  } else {
    lean_softmax_summed<C, true>(p, v, at, buf, stok, mask_off, tile_start, prefix, end, m, l, beside);
  }
}

// Whether a row max of the tile in buffer `buf` moved (warp-uniform): the 8 warps' bytes as one word.
template <class C>
__device__ __forceinline__ bool lean_moved(uint32_t flags, int buf) {
  return __any_sync(0xffffffff, ld_shared_u64(flags + buf * C::WARPS) != 0ull);
}

// PvCols with 32-bit operands: `v` this lane's ldmatrix.trans row address in the tile's stage, `pa` its
// P row address in the tile's buffer, `alpha` the tile's alpha buffer.
template <class C, int NP0, int NP1>
struct PvColsLean : PvCols<C, NP0, NP1> {
  using PvCols<C, NP0, NP1>::pa;
  using PvCols<C, NP0, NP1>::vb;

  __device__ __forceinline__ void load(uint32_t v, uint32_t p) {
#pragma unroll
    for (int mi = 0; mi < C::RG; ++mi) ldmatrix_x4(pa[mi], p + mi * 16 * C::P_STRIDE * 2);
#pragma unroll
    for (int np = NP0; np < NP1; ++np) ldmatrix_x4_trans(vb[np - NP0], v + np * 32);
  }
  __device__ __forceinline__ void rescale(float (&o)[C::RG][C::V_PART / 8][4], uint32_t alpha, int lane) const {
    const uint32_t a = alpha + lane / 4 * 4;
#pragma unroll
    for (int mi = 0; mi < C::RG; ++mi) {
      const float a0 = ld_shared_f32(a + mi * 64), a1 = ld_shared_f32(a + mi * 64 + 32);
#pragma unroll
      for (int nt = 2 * NP0; nt < 2 * NP1; ++nt) {
        o[mi][nt][0] *= a0;
        o[mi][nt][1] *= a0;
        o[mi][nt][2] *= a1;
        o[mi][nt][3] *= a1;
      }
    }
  }
};

// The prologue's KV copies: tiles [FROM, TO) of the split into stages FROM .. TO - 1, one commit group each (empty
// past ntiles, so the groups count the same for every split).
template <int FROM, int TO, class C>
__device__ __forceinline__ void lean_load_tiles(KvStreamLean<C>& stream, const VerifyParams& p, int end, int ntiles) {
#pragma unroll
  for (int st = FROM; st < TO; ++st) {
    if (st < ntiles) stream.load(p, end, st * (C::TILE_ELEMS * 2));
    cp_async_commit();
  }
}

// Rows [r0, r0 + NROWS) of the block's Q (zero past R) into shared memory at `dst` (row pitch STRIDE: conflict-free
// ldmatrix), 16-byte copies, one commit group.
template <class C, int NROWS>
__device__ __forceinline__ void lean_copy_q_rows(const VerifyParams& p, int b, int row0, int r0, uint32_t dst) {
  constexpr int TOTAL = NROWS * CHUNKS;
  const __nv_bfloat16* q = p.q + (size_t)b * p.R * D_QK;
#pragma unroll
  for (int k = 0; k < (TOTAL + C::THREADS - 1) / C::THREADS; ++k) {
    const int c = threadIdx.x + k * C::THREADS;
    if (TOTAL % C::THREADS == 0 || c < TOTAL) {
      const int r = c / CHUNKS, col = c % CHUNKS * 8;
      const bool valid = row0 + r0 + r < p.R;
      copy_chunk(dst + (r * STRIDE + col) * 2, q + (valid ? (size_t)(row0 + r0 + r) * D_QK + col : 0), valid ? 16 : 0);
    }
  }
  cp_async_commit();
}

// This warp's Q fragments (rows [slice * BLOCK_M / 2 + mi * 16, +16), dims [quarter * K_PART, +K_PART)) by
// ldmatrix.x4 from a staged copy whose row 0 is the block's row `first` (lanes 0-15 name rows 0-15 at k 0, lanes
// 16-31 the same rows at k 8: the registers a0-a3 of the m16k16 A fragment, as load_q_fragments reads them).
template <class C>
__device__ __forceinline__ void lean_ldmatrix_q(uint32_t (&qa)[C::QM][C::KSTEPS][4], uint32_t staged, int first, int slice,
                                                int quarter, int lane) {
#pragma unroll
  for (int mi = 0; mi < C::QM; ++mi)
#pragma unroll
    for (int ks = 0; ks < C::KSTEPS; ++ks)
      ldmatrix_x4(qa[mi][ks], staged + ((slice * (C::BLOCK_M / C::RS) + mi * 16 - first + (lane & 15)) * STRIDE +
                                        quarter * C::K_PART + ks * 16 + (lane >> 4) * 8) * 2);
}

// LV & (32 | 64): the block's Q staged through shared memory by 16-byte cp.async and read by ldmatrix.x4 (18 copies and
// 18 ldmatrix per thread instead of 72 four-byte global loads), with the first KV tiles' copies (the prologue of the
// default: stream.load of tiles 0 .. STAGES - 2, one commit group each).
//   32: tile 0 into stage 0 and all 64 Q rows into stages 1-3 + the partial-score buffer (64 * STRIDE * 2 bytes from
//       stage 1: up to the P buffers' first 2304 bytes, before the row buffers and flags), wait, ldmatrix, barrier,
//       then tiles 1 and 2 (their copies start one round trip later than the default's);
//   64: Q's first row half into stage 3 + the partial-score + P buffers (32 * STRIDE * 2 bytes), then tiles 0-2 as in
//       the default, wait for the half (groups complete in order: its group first), ldmatrix of slice 0's warps,
//       barrier, the second half into the same place, wait (tiles 0-2 too), ldmatrix of slice 1's warps, barrier.
template <class C>
__device__ __forceinline__ void lean_stage_q(const VerifyParams& p, int b, int row0, KvStreamLean<C>& stream, int end,
                                             int ntiles, uint32_t kv_sa, int slice, int quarter, int lane,
                                             uint32_t (&qa)[C::QM][C::KSTEPS][4]) {
  constexpr uint32_t TILE_B = C::TILE_ELEMS * 2;
  constexpr int HALF = C::BLOCK_M / C::RS;  // rows of one Q*K^T row slice
  static_assert(C::RS == 2, "two row slices");
  static_assert(TILE_B + C::BLOCK_M * STRIDE * 2 <= C::KV_BYTES + C::EXCH_BYTES + C::P_BYTES, "64 staged Q rows fit");
  static_assert(HALF * STRIDE * 2 <= TILE_B + C::EXCH_BYTES + C::P_BYTES, "32 staged Q rows fit after stage 2");
  if constexpr (C::LV & 32) {
    stream.load(p, end, 0);  // ntiles >= 1 (split_range)
    cp_async_commit();
    const uint32_t staged = kv_sa + TILE_B;
    lean_copy_q_rows<C, C::BLOCK_M>(p, b, row0, 0, staged);
    cp_async_wait<0>();
    __syncthreads();
    lean_ldmatrix_q<C>(qa, staged, 0, slice, quarter, lane);
    __syncthreads();  // Q's copy read before tiles 1 and 2 land on it
    lean_load_tiles<1, C::STAGES - 1>(stream, p, end, ntiles);
  } else {
    const uint32_t staged = kv_sa + (C::STAGES - 1) * TILE_B;
    lean_copy_q_rows<C, HALF>(p, b, row0, 0, staged);
    lean_load_tiles<0, C::STAGES - 1>(stream, p, end, ntiles);
    cp_async_wait<C::STAGES - 1>();  // Q's first half
    __syncthreads();
    if (slice == 0) lean_ldmatrix_q<C>(qa, staged, 0, slice, quarter, lane);
    __syncthreads();
    lean_copy_q_rows<C, HALF>(p, b, row0, HALF, staged);
    cp_async_wait<0>();
    __syncthreads();
    if (slice == 1) lean_ldmatrix_q<C>(qa, staged, HALF, slice, quarter, lane);
    __syncthreads();  // the staged rows overlap the partial-score and P buffers
  }
}

// --- the kernel -------------------------------------------------------------------------------------

template <class C>
__global__ void __launch_bounds__(C::THREADS, C::MIN_BLOCKS) verify_split_kernel_lean(const VerifyParams p) {
  constexpr int BN = C::BN, STAGES = C::STAGES, BLOCK_M = C::BLOCK_M;
  constexpr int NP = C::V_PART / 16, NPH = NP / 2;
  constexpr uint32_t TILE_B = C::TILE_ELEMS * 2, P_B = C::P_ELEMS * 2, A_B = BLOCK_M * 4;
  static_assert(STAGES == 4, "stage offsets as (i & 3) * TILE_B");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t kv_sa = smem_addr(smem_raw), exch_sa = kv_sa + C::KV_BYTES, p_sa = exch_sa + C::EXCH_BYTES;
  const uint32_t row_sa = p_sa + C::P_BYTES, flag_sa = row_sa + (C::NBUF + 1) * BLOCK_M * 4;
  float* row_s = reinterpret_cast<float*>(smem_raw + C::KV_BYTES + C::EXCH_BYTES + C::P_BYTES);

  const int b = blockIdx.z, split = blockIdx.y, row0 = blockIdx.x * BLOCK_M;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // the row half and dim quarter in Q*K^T, from the warp index through a shuffle: ptxas then knows they are
  // warp-uniform and keeps their address terms in uniform registers (CUTLASS's canonical_warp_idx_sync);
  // the same for the P*V column block or the flag byte spilled on sm_90a or saved nothing (ptxas -v, SASS)
  const int uwarp = __shfl_sync(0xffffffff, warp, 0);
  const int slice = uwarp / 4, quarter = uwarp % 4;
  const int prefix = p.prefix_len[b];
  int start, end;
  size_t part_row0;
  if (!split_range<BN, BLOCK_M, C::THREADS>(p, b, split, row0, start, end, part_row0)) {
    if (threadIdx.x == 0) timeline::timeline_mark(timeline::SPLIT_END);  // (-DKDENGINE_TIMELINE only; no start record)
    return;
  }
  if (threadIdx.x == 0) timeline::timeline_mark(timeline::SPLIT_START);

  if (p.merge_early) pdl_launch_dependents();  // (else from write_partials)
  const int ntiles = (end - start + BN - 1) / BN;
  KvStreamLean<C> stream(p, b, start, end, kv_sa);
  uint32_t qa[C::QM][C::KSTEPS][4];
  if constexpr (C::LV & (32 | 64)) {
    lean_stage_q<C>(p, b, row0, stream, end, ntiles, kv_sa, slice, quarter, lane, qa);
  } else {
    lean_load_tiles<0, STAGES - 1>(stream, p, end, ntiles);
#pragma unroll
    for (int mi = 0; mi < C::QM; ++mi)
      load_q_fragments<C>(p, b, row0 + slice * (BLOCK_M / C::RS) + mi * 16, quarter * C::K_PART, qa[mi]);
  }

  const int srow = threadIdx.x / C::TPR, stok = (threadIdx.x % C::TPR) * C::EPT;
  const int mask_off = (b * p.T + min(row0 + srow, p.R - 1) / p.H) * p.W;
  float m_run = -INFINITY, l_run = 0.f;
  float o[C::RG][C::V_PART / 8][4];
#pragma unroll
  for (int mi = 0; mi < C::RG; ++mi)
#pragma unroll
    for (int nt = 0; nt < C::V_PART / 8; ++nt) o[mi][nt][0] = o[mi][nt][1] = o[mi][nt][2] = o[mi][nt][3] = 0.f;

  // This thread's shared-memory addresses, formed once (a tile adds its stage / buffer offset).
  // (LV & 1: ldmatrix.x2 per n8 tile, lanes 0-15 name tokens 0-7 and the rest repeat them)
  const uint32_t k_at = kv_sa + (((lane & 7) + (C::LV & 1 ? 0 : (lane >> 4) << 3)) * STRIDE + quarter * C::K_PART +
                                 ((lane >> 3) & 1) * 8) * 2;
  const uint32_t v_at = kv_sa + (((lane & 7) + ((lane >> 3) & 1) * 8) * STRIDE + warp * C::V_PART + (lane >> 4) * 8) * 2;
  const uint32_t pa_at = p_sa + ((lane & 15) * C::P_STRIDE + (lane >> 4) * 8) * 2;
  const uint32_t score_at = exch_sa + ((quarter * BLOCK_M + slice * (BLOCK_M / C::RS) + lane / 4) * BN + (lane % 4) * 2) * 4;
  const LeanSoftmaxSlots slots{exch_sa + (srow * BN + stok) * 4, p_sa + (srow * C::P_STRIDE + stok) * 2,
                               row_sa + srow * 4, flag_sa + warp};

  cp_async_wait<STAGES - 2>();  // tile 0
  __syncthreads();
  lean_partial_scores<C>(k_at, qa, score_at);
  __syncthreads();
  lean_softmax<C>(p, slots, 0, stok, mask_off, start, prefix, end, m_run, l_run, NoWork{});

  for (int it = 0; it < ntiles; ++it) {
    cp_async_wait<STAGES - 3>();  // tile it + 1 (and P / alpha / flags of tile it) visible after the barrier
    __syncthreads();
    const uint32_t cur = (it & 3) * TILE_B;
    const int bc = it & 1, bn = bc ^ 1;  // tile it's P / alpha / flag buffer, tile it + 1's
    const bool moved = lean_moved<C>(flag_sa, bc);
    if (it + 1 < ntiles) {  // [P*V(it) cols 0.5 + Q*K^T(it + 1) + copy(it + 3)], half barrier, [softmax(it + 1) + P*V cols 0.5..1]
      if constexpr (C::LV & 2) {  // all of O rescaled here: no branch between the half barrier and the softmax
        if (moved) {
          PvColsLean<C, 0, NP> all;
          all.rescale(o, row_sa + bc * A_B, lane);
        }
      }
      {
        PvColsLean<C, 0, NPH> pv;
        pv.load(v_at + cur, pa_at + bc * P_B);
        if (!(C::LV & 2) && moved) pv.rescale(o, row_sa + bc * A_B, lane);
        pv.mma(o);
      }
      lean_partial_scores<C>(k_at + ((it + 1) & 3) * TILE_B, qa, score_at);
      auto copy = [&] {
        if (it + STAGES - 1 < ntiles) stream.load(p, end, ((it + 3) & 3) * TILE_B);  // the stage of tile it - 1
        cp_async_commit();
      };
      if constexpr (!(C::LV & 4)) copy();
      if (slice == 0)  // literal ids: a computed one makes ptxas reserve all 16 named barriers
        group_barrier(1, C::THREADS / 2);
      else
        group_barrier(2, C::THREADS / 2);
      PvColsLean<C, NPH, NP> pv;
      if (!(C::LV & 2) && moved) pv.rescale(o, row_sa + bc * A_B, lane);
      // the second half's ldmatrix loads beside the softmax, after its masking branches, on both archs (loaded
      // before the softmax, sm_120 spilled 8 bytes at 255 registers)
      auto beside = [&] {
        pv.load(v_at + cur, pa_at + bc * P_B);
        pv.mma(o);
      };
      if constexpr (C::LV & 4)  // the KV copy after the partial-score loads
        lean_softmax<C>(p, slots, bn, stok, mask_off, start + (it + 1) * BN, prefix, end, m_run, l_run, beside, copy);
      else
        lean_softmax<C>(p, slots, bn, stok, mask_off, start + (it + 1) * BN, prefix, end, m_run, l_run, beside);
    } else {
      cp_async_commit();
      PvColsLean<C, 0, NP> pv;
      pv.load(v_at + cur, pa_at + bc * P_B);
      if (moved) pv.rescale(o, row_sa + bc * A_B, lane);
      pv.mma(o);
    }
  }
  write_partials<C>(p, o, m_run, l_run, row_s, srow, row0, part_row0, warp, lane);
  if (threadIdx.x == 0) timeline::timeline_mark(timeline::SPLIT_END);
}

}  // namespace kdengine
