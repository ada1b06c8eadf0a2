// The split partials (VerifyParams::part_out): bf16 rows of DV columns, each split's O normalised by
// its own sum (the lse beside them stays fp32). Shared by the split kernels (the mma.sync layouts and
// the sm90 kernel) and the merges.
//
// The split kernels hold O in mma accumulator fragments: quad lane q of a row has columns 2q, 2q + 1
// of every 8-column fragment, so a fragment-by-fragment bf16 store is 4 bytes a lane and 16 of the 32
// bytes of a sector per quad and instruction. On the H200 that made both split kernels 0.4-3.5 us
// slower at 65k (ncu, against the fp32 partials' full-sector 8-byte stores); a sector written in two
// halves is the suspect. store_partial16 writes two adjacent fragments (16 columns, one sector) with
// one instruction: lanes q and q ^ 1 trade one column pair, then each lane writes 4 consecutive columns.
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

namespace kdengine {

// Columns [16 j, 16 j + 16) of one partial row at dst16 (32-byte aligned) from quad lane q = lane % 4:
// a0, a1 = columns 2q, 2q + 1; b0, b1 = columns 8 + 2q, 8 + 2q + 1. Every lane of the warp must call
// it (a shuffle); only `valid` lanes store.
// EVICT_LAST (the sm90 schedule seesaw2_el): the store carries an L2 evict_last policy, so that the partials are still
// in L2 when the merge reads them instead of being displaced by the KV stream of the blocks still running.
template <bool EVICT_LAST = false>
__device__ __forceinline__ void store_partial16(__nv_bfloat16* dst16, int q, bool valid, float a0, float a1, float b0,
                                                float b1) {
  __nv_bfloat162 av = __floats2bfloat162_rn(a0, a1), bv = __floats2bfloat162_rn(b0, b1);
  const uint32_t a = *reinterpret_cast<uint32_t*>(&av), b = *reinterpret_cast<uint32_t*>(&bv);
  const bool even = (q & 1) == 0;
  const uint32_t got = __shfl_xor_sync(0xffffffffu, even ? b : a, 1);  // even lanes get a, odd lanes b
  if constexpr (EVICT_LAST) {
    uint64_t policy;
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
    if (valid)
      asm volatile("st.global.L2::cache_hint.v2.b32 [%0], {%1, %2}, %3;\n" ::"l"(dst16 + (even ? 2 * q : 2 * q + 6)),
                   "r"(even ? a : got), "r"(even ? got : b), "l"(policy)
                   : "memory");
  } else if (valid) {
    *reinterpret_cast<uint2*>(dst16 + (even ? 2 * q : 2 * q + 6)) = even ? make_uint2(a, got) : make_uint2(got, b);
  }
}

// The two bf16 of a 32-bit word as fp32 (the lower address is the low half).
__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// Four consecutive partial columns (8 bytes) as fp32.
__device__ __forceinline__ float4 load_partial4(const __nv_bfloat16* src) {
  const uint2 u = __ldg(reinterpret_cast<const uint2*>(src));
  return make_float4(bf16_lo(u.x), bf16_hi(u.x), bf16_lo(u.y), bf16_hi(u.y));
}

}  // namespace kdengine
