// MLA tree-verify attention for Hopper (sm_90a): warp-specialized, wgmma + TMA. One thread block per
// (64-row query tile, KV split, sequence), 3 warpgroups:
//   producer (warpgroup 2, one thread): loads the block's Q tile, then streams the split's KV in
//     page-sized tiles of BN = 64 tokens (64 x 576 bf16 = 72 KB) with TMA (cp.async.bulk.tensor,
//     128-byte swizzle, one box per 64 dims and page) into 2 stages; a stage has one full mbarrier per
//     group of 3 x 64 dims (S starts on the first dims while the rest lands) and one empty mbarrier;
//   consumers (warpgroups 0 and 1): Q (64 x 576) stays in shared memory; S = Q K^T on wgmma
//     m64n64k16 (both operands from shared memory through descriptors), the online softmax in fp32
//     registers (log2 domain; the packed ancestor mask only on the tiles that reach the tree tail),
//     O += P V on wgmma m64n256k16 with P from registers: warpgroup w owns V columns [256 w, +256)
//     (a 64 x 512 fp32 O is 256 registers per thread: too many for one warpgroup).
// Schedules (template parameter SCHEDULE):
//   BOTH: both warpgroups compute S of every tile (the QK^T work twice) and run the same softmax;
//     no state crosses warpgroups.
//   STAGGERED: BOTH with the S issue of the two warpgroups ordered by two named barriers (warpgroup 0
//     first, then 1, then 0 ...): each one's softmax runs while the other's S is on the tensor cores.
//   SEESAW: warpgroup t % 2 computes S and the softmax of tile t ("owner"); it writes P (bf16) over the
//     tile's rope dims in shared memory (only its own S read them) and the rows' max / sum / rescale
//     factor into a 2-slot table, then signals a named barrier; the other warpgroup rescales its O
//     half and runs P V from shared memory while the owner runs its own P V from registers. Each
//     warpgroup computes S of every other tile, and one group's softmax overlaps the other's MMAs.
//   PAIR (FlashMLA's split of the work): per step, warpgroup 0 computes S of tile 2i (stage 0) and
//     warpgroup 1 S of tile 2i + 1 (stage 1), warpgroup 1's S issued behind warpgroup 0's. Only the
//     row maxima cross before the P V issue: warpgroup 0 publishes max(m, rowmax S_2i), warpgroup 1
//     the step's max; each P (bf16, relative to the step's max) goes through its tile's rope chunk,
//     and each warpgroup runs P V of both tiles on its own 256 O columns. A tile arrives and is freed
//     in three chunk groups (V columns of warpgroup 0, of warpgroup 1, the rope chunk), each streamed
//     by its own producer lane, so the next tile's loads start as soon as that group's last reader is done.
//   HALF: the tokens of every tile split between the warpgroups: warpgroup w computes S of tokens
//     [32 w, 32 w + 32) on wgmma m64n32k16 (no duplicated QK^T, one KV tile per step, the 2-stage ring as
//     in STAGGERED). The rows' maxima cross through a table (by tile parity) and a bar.sync of both, the
//     running max moves lazily (only when a score passes it by 2^8; both warpgroups compute the same m),
//     each P half (bf16) goes over the tile's rope chunk, and each warpgroup runs P V of all 64 tokens on
//     its own 256 O columns: its own half from registers, the other's from shared memory. Opt-in (below).
//   STAGGERED_SMALL, STAGGERED_TAIL: STAGGERED with a smaller consumer loop (instruction fetch: ncu's top stall of
//     STAGGERED at 65k T=16 is no_instruction). TAIL: the tail tile's mask as visibility bits found in a rolled loop
//     (mask_rowmax TAIL_ROLLED), the same math: 875 SASS instructions in the loop against 1493 (nvcc 13.2). SMALL:
//     the tail's visibility bits from the <= 3 packed mask words each row's scores reach (tail_bits: 6 loads issued
//     right after the S issue, so they land under S; funnel shifts, a prefix and an end mask and a byte permute, no
//     branch), plus exp2 as one MUFU.EX2 (ftz), the running max moved lazily (HALF's rule) so that the O rescale is
//     rarely taken, and the producer's empty waits with a suspend-time hint: 784 (with TAIL's rolled loop instead of
//     tail_bits: 790; S issued as a rolled loop over its 3 chunk groups saved 64 more, but ptxas injects a
//     warpgroup.arrive there, C7519). H200, one run (perf_history/kernel/verify_kernel_icache_*_986b231.json, logs in
//     sm90_icache_986b231/): ncu at 65k T=16, STAGGERED against SMALL (its rolled tail then): no_instruction stalls
//     1.08 against 0.15 per issue (STAGGERED's no_instruction samples sit on the long straight FMUL runs: the S
//     scaling and the O rescale), tensor pipe 63.9 against 72.4%, warp instructions 12.9M against 8.6M (FMUL 3.5M ->
//     0.9M, BRA 1.2M -> 0.2M, SYNCS 576K -> 86K: the producer's spin), 50.8 against 46.4 us; SMALL's top stalls now
//     barrier (the staggered bar.sync) and long scoreboard (the full-barrier waits). Graph-replayed, staggered / A/A
//     / SMALL / TAIL: 65k T=16 55.5 / 55.6 / 51.2 / 52.6 us, 65k T=64 172.6 / 177.2 / 161.4 / 169.2, 16k T=64 52.8 /
//     52.8 / 50.4 / 52.1.
//     With the rolled tail loop SMALL was 3-9% slower than STAGGERED at 4k (3-5 tiles per split: a load per score in
//     series on the critical path) and the default only from 8 tiles per split. With tail_bits, one H200 session
//     timing both commits (perf_history/kernel/verify_kernel_small4k_*_{1cd259e,5d97cc8}.json, logs in
//     sm90_small4k_5d97cc8/), graph-replayed, staggered / A/A / SMALL before -> after / TAIL, us: 4k T16 15.3 / 15.2
//     / 15.7 -> 13.3 / 15.8, 4k T64 22.2 / 22.2 / 24.0 -> 21.0 / 24.5, 16k T16 23.8 / 23.9 / 22.6 -> 22.7 / 23.0, 16k
//     T64 53.1 / 52.8 / 51.0 -> 48.1 / 52.4, 65k T16 55.2 / 55.8 / 51.2 -> 51.1 / 52.9, 65k T64 174.7 / 182.9 / 167.1
//     -> 163.7 / 172.1; ncu at 4k T=64 (one launch), STAGGERED against SMALL: 19.46 against 16.10 us, warp
//     instructions 4,218,455 against 3,177,816. SMALL is faster than STAGGERED by more than the A/A spread at all six
//     sizes: the default at every size (cuda_backend.DEFAULT_SCHEDULE).
//   SEESAW2: FlashMLA's order (deepseek-ai/FlashMLA csrc/sm90/kernels/splitkv_mla.cu, read, not copied)
//     in this layout: 256 threads, no producer warpgroup. Per step of two tiles, warpgroup 0 computes S of
//     the even tile a (stage 0), warpgroup 1 of the odd tile b (stage 1), each S of the next step issued
//     at the end of the step behind the group's last P V, so one group's softmax runs while the other's S
//     or P V is on the tensor cores. The rows' running max (lazy, STAGGERED_SMALL's rule; both groups hold
//     the same m) crosses twice per step through [2][BM] tables on named barriers: m' after tile a (0 -> 1,
//     bar 11), the step's m'' (1 -> 0, bar 12). P_a goes (bf16, relative to m'') over stage 0's rope chunk
//     (bar 13), P_b over Q's rope chunk (bar 14): Q's rope dims stay in registers (A fragments of an RS
//     wgmma) for both S. Each P is written by 4 stmatrix.x4 per thread (store_p_stsm; FlashMLA's way) instead of 16
//     32-bit stores: P_a and P_b are the most waited-on hand-offs at 65k T=64. H200, two sets in one run against the
//     stores (probe seesaw2_stsm, perf_history/kernel/stsm_8449746/): 65k T=64 118.5 / 118.5 us against 119.6 / 119.5
//     (A/A 119.5 / 119.4, FlashMLA 118.5 / 117.8), ncu 121.47 -> 120.77 us; 65k T=16 45.2 / 45.0 against 45.0 / 45.0;
//     4k T=64 and 16k T=16 0.1 us slower in both sets (A/A spread 0.0-0.1), 16k T=64 equal. Each warpgroup runs P V
//     of both tiles on its 256 O columns (own P from registers, the other's from shared memory). Every 64-dim chunk of a stage has its own full barrier and no empty
//     barrier: a chunk range is reloaded by one thread of the warpgroup that just waited for its last
//     reader (stage 0 chunks 0-3: warpgroup 0 after P_a V_aL; stage 0 chunks 4-8: warpgroup 1 after P_a
//     V_aR; stage 1 chunks 0-3: warpgroup 0 after P_b V_bL; stage 1 chunks 4-8: warpgroup 1 after P_b
//     V_bR). The tail mask: the first two tail tiles' bits found with tail_bits before the first S, a later tail tile's
//     by the rolled loop; ex2.ftz as in STAGGERED_SMALL; the TMA issue loops rolled. The softmax
//     runs on the unscaled scores (mask_rowmax RAW, exp_rows_raw): the row max is scaled once, P = 2^(S scale_log2 - m)
//     is one FFMA + MUFU.EX2 per score, and the row max and sums are reduced as trees: 0.4-0.8% faster at the three
//     T=64 sizes, T=16 within the spread (perf_history/kernel/s2soft_f222390/: 65k T64 120.2 / 119.9 us against
//     121.1 / 120.7, FlashMLA 120.7 / 119.8); sm_scale > 0 is required (cuda_backend's launchers check it). Each loader
//     thread looks up the pool rows of its next step's loads at the end of a step, under its S wait (look_ahead,
//     below), not right before each TMA issue (that page-table load sat in series with the reloads on the way
//     to the next S), and warpgroup 1 publishes P_b only after issuing both of its P V (FlashMLA's
//     order on the tensor pipe). H200, two runs (perf_history/kernel/verify_kernel_s2tune{,65k}_*_{912b393,
//     5873571}.json, logs in sm90_s2tune_*/); in 5873571 (seesaw2_ao there = this SEESAW2, SASS identical;
//     seesaw2_v0 = SEESAW2 before), us, staggered_small / seesaw2_v0 / this / A/A / FlashMLA: 4k T16 13.4 /
//     15.0 / 15.0 / 13.4 / 20.6, 4k T64 21.0 / 20.1 / 20.0 / 21.0 / 25.1, 16k T16 22.7 / 21.0 / 20.8 / 22.8 /
//     39.0, 16k T64 48.0 / 41.5 / 40.5 / 47.7 / 50.1, 65k T16 51.2 / 45.2 / 44.7 / 51.1 / 52.3 (the 65k record:
//     51.1 / 45.2 / 44.5 / 51.1 / 52.6), 65k T64 154.5 / 128.1 / 124.6 / 155.6 / 122.0 (156.7 / 129.6 / 123.5 /
//     159.2 / 122.1). ncu at 65k (one launch): T=64 126.75 -> 122.30 us, tensor pipe 64.85 -> 67.58%, stalls per
//     issue barrier 0.97 -> 0.79, gmma 1.12 -> 0.97, long scoreboard 1.69 -> 1.92; T=16 42.27 -> 42.78 us. In
//     912b393, the look-ahead alone against SEESAW2 then: 65k T64 124.4 / 124.7 against 130.8 / 130.8 (two records),
//     ncu 128.35 -> 124.45 us. Everything below is about SEESAW2 before these two changes.
//     H200, two runs beside staggered_small, its A/A control and FlashMLA (perf_history/kernel/
//     verify_kernel_seesaw2_*_{66c932a,d5a6c13}.json, logs in sm90_seesaw2_*/; d5a6c13 = this code, 66c932a
//     = the TMA issue loops unrolled), us, staggered_small / seesaw2 / A/A / FlashMLA in d5a6c13: 4k T16
//     15.6 / 14.8 / 15.6 / 20.8, 4k T64 23.9 / 20.0 / 24.0 / 25.3, 16k T16 22.5 / 20.8 / 22.5 / 38.9, 16k
//     T64 50.8 / 41.4 / 50.8 / 50.8, 65k T16 51.2 / 45.0 / 51.2 / 53.2, 65k T64 158.2 / 131.4 / 161.9 /
//     125.0 (66c932a: seesaw2 14.6 / 19.9 / 21.8 / 39.8 / 46.3 / 131.0). Faster than staggered_small
//     beyond the A/A spread at all six sizes in both runs; beside FlashMLA slower only at 65k T=64. ncu at
//     65k (one launch, d5a6c13): T=64 128.16 us, tensor pipe 65.31% busy (FlashMLA 73.8% in the lead's
//     probe, perf_history/kernel/sm90_seesaw2_66c932a/probe1_flashmla_vs_small/), issue slots 24.01%,
//     stalls per issue wait 1.84, barrier 1.73, long scoreboard 1.20, gmma 0.94, no_instruction 0.75;
//     T=16 42.46 us, tensor 49.60%, long scoreboard 2.57, wait 1.78, barrier 1.51, no_instruction 1.32
//     (66c932a with the unrolled issue loops: 48.42 us, no_instruction 2.69; SASS 9320 -> 6104
//     instructions). 253 -> 248 registers, no spills. compute-sanitizer: memcheck and synccheck clean,
//     28 seesaw2 GPU tests pass; racecheck reported RAW hazards on the two row-max tables (m'' stored by
//     warpgroup 1 -> warpgroup 0's load, and m' the other way) while they went through bar.arrive (writer) /
//     bar.sync (reader). racecheck does not model bar.arrive (its --racecheck-trace-sync log shows it only as the
//     warpsync before it), and a race-free minimal kernel with this barrier sequence draws the same reports
//     (ci/gpu/racecheck_repro.cu variants 6-7; perf_history/kernel/s2race_6a95ae1/README.md). So the four one-way
//     hand-offs (m', m'', P_a, P_b) are on mbarriers (every thread of the writing warpgroup arrives, release; the
//     readers wait on the step's parity, acquire), and so is the final row-sum exchange (256 arrivals): racecheck,
//     synccheck and memcheck clean, the same speed as the named-barrier form within the run's spread (that form
//     stays selectable as SEESAW2_BAR, a probe). The default from 128 query rows and 4 KV tiles per split (cuda_backend.SEESAW2_MIN_ROWS, SEESAW2_MIN_TILES).
// Splits, partials and lse follow VerifyParams (verify_launch.h); the merge is the shared merge kernel
// (a programmatic dependent launch). Two merges fused into this kernel were built, tested and measured
// slower on the H200, and removed: a cluster merge through distributed shared memory (at one 220 KB block
// per SM only 120 / 120 / 112 blocks are resident in clusters of 4 / 8 / 16, so 128-block grids take two
// waves: 65k T=16 109-112 us against 55.8) and a cooperative grid merge (each block waits for its row
// tile's splits, then merges a share of the rows: 0.5-1.8 us slower than split + merge kernel at five
// sizes; its wait + merge cost 8-9 us inside the kernel under ncu, with __threadfence or with
// release / acquire alike). Evidence: perf_history/kernel/verify_kernel_fuse_*_{d3f5797,84f1cb5,9e3c5b6}.json;
// the code: git history before this note (branches fuse, fuse-acqrel).
// A merge waiting on per-split flags (set by each split block after its partial writes, release / acquire) instead of
// the grid's completion, launched at the split kernel's start, was built, tested and measured slower at all six sizes
// (+0.7 to +1.4 us in the sweep's form, 0.1-0.4% fewer tok/s in the decode engine): the flags arrive when the partial
// writes drain, about when the grid completes, the merge's spinning blocks slow the split tail, and the merge's ~2.5 us
// after its release is its 8 MB of partial reads (perf_history/kernel/ready_6e467ca/, the code there as ready.patch).
// SEESAW2 in 2-CTA clusters along the row tiles, each KV chunk fetched once per cluster by a multicast TMA and
// re-issued after a cluster-scope release (or by whichever CTA frees it second), was built, tested and measured
// slower at all six sizes (65k T=16 53.6 against 44.7 us, T=64 164.0 against 120.2): DRAM bytes were already read
// once (the two row tiles share them through L2), and every reload waited for the slower CTA of the pair, on the
// path that bounds the kernel (perf_history/kernel/mcast_32bdeed/, its code there as mcast.patch).
// Tiles past the sequence end: rows at and past `end` of the last tile are zeroed in shared memory
// before use (TMA copies whole pages; a pool slot past the end may hold anything, NaN included).
// Shared memory: Q 72 KB + 2 KV stages of 72 KB + barriers + the row tables (seesaw, pair) = 219 KB (of 227);
// SEESAW2 the same with 256 bytes of barriers (19 mbarriers).
// Descriptors are built by hand (make_desc, 5 lines) instead of CuTe's: no CUTLASS dependency for one
// swizzle mode and three operand shapes; ci/gpu/sm90_probe.cu checks them (and the TMA swizzle) on the
// device against a host product.
// Measured on the H200 (perf_history/kernel/verify_kernel_sm90_*_3543d28.json): STAGGERED fastest of the
// first three everywhere; at T=64 the tensor pipe is ~74% busy (ncu) but a third of that work is the
// duplicated S. PAIR (perf_history/kernel/verify_kernel_pair_*_6094a27.json) does 0.65x that tensor work
// and is 1-5% faster at T=64 (65k: 176.8 against 182.2 us; FlashMLA 119.6), mixed at T=16. ncu at 65k T=64:
// tensor pipe 52% busy (86 us of 165), long-scoreboard and barrier stalls 3.1 and 2.5 per issue against
// 1.0 and 0.6. Likely cause (not yet shown): two stages that both hold the step's tiles, so a group's
// reload starts only when its last reader is done and the load latency is exposed; freeing stage 1
// before the next S waits on stage 0 took 65k T=64 from 188.6 to 176.8 us (..._85df096.json). A later
// run (verify_kernel_pairload_*_752b824.json, this PAIR as pair_v0) had it faster than STAGGERED at all
// six sizes (65k T=64 173.5 against 181.5 us, FlashMLA 119.9); in the same run, a rework with a full
// barrier per chunk, P of the odd tile in its own buffer and earlier per-group releases ran slower (190.4
// us: it freed stage 0 later, and the next step starts on stage 0), and L2 evict_first / evict_last
// policies on the KV loads changed nothing beyond noise. compute-sanitizer racecheck reports PAIR's row
// tables handed from warpgroup 1 to 0 (not 0 to 1, in the same SASS form), also with those hand-offs moved
// onto mbarriers (pair_v0_mb, ..._fbbfd73.json, where this PAIR read 172.5 against STAGGERED's 169.1 us at
// 65k T=64: within the 3-5% between runs): cuda_backend.PAIR_MIN_ROWS.
// HALF (perf_history/kernel/verify_kernel_half_*_{90edcf6,f59d68d,45ed1b3}.json): racecheck clean, but
// beside staggered and its A/A control in three runs never faster by more than the A/A spread (65k T=64
// 171.7 against 171.9 / 173.5 us in the last; 3-10% slower at 4k-16k). ncu at 65k T=64: 181-183 against
// 176-178 us with the tensor pipe 45% busy against 71% (its 0.65x tensor work), issue slots 33-35%
// against 29%, more barrier stalls per issue (1.4 against 0.6). Reading: in STAGGERED each warpgroup's softmax runs under
// the other's (duplicated) S; in HALF both warpgroups meet twice per tile, so both softmaxes run at once
// with nothing on the tensor pipe, and with two stages nothing else can be queued then: the next tile's S
// needs the stage that this tile's P V still reads. Probes in the same runs: freeing the stage before
// the next S issue (HALF) or after it (half_v0) measured the same, so the load chain is not the limit;
// the next S issued before P V so the row max and its exchange run under P V (half_fa3, FA3's
// in-warpgroup overlap) was slower (191.4 us; long-scoreboard stalls 2.1 per issue against 0.8: the next
// load now starts after the softmax). STAGGERED with HALF's stage release (staggered_er) was not faster.
// ptxas: SEESAW gets an injected warpgroup.wait (C7517) at the O rescale that follows the S issue.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "verify_launch.h"
#include "sm90_ptx.cuh"
#include "verify_partials.cuh"
#include "verify_timeline.cuh"

namespace kdengine {
namespace sm90 {

constexpr int BM = 64;                          // query rows per block (one wgmma M)
constexpr int BN = 64;                          // KV tokens per tile
constexpr int SW = 64;                          // bf16 elements per 128-byte swizzled row
constexpr int NCHUNK = D_QK / SW;               // 9 column chunks of a Q or KV tile
constexpr int CHUNK_BYTES = 64 * 128;           // 64 rows x 128 B
constexpr int TILE_BYTES = NCHUNK * CHUNK_BYTES;  // 73728: a Q tile or a KV tile
constexpr int P_CHUNK = DV / SW;                // chunk 8 = the rope dims: P is written over it
constexpr int STAGES = 2;
constexpr int CONSUMERS = 2;                    // consumer warpgroups
constexpr int THREADS = 128 * (CONSUMERS + 1);
constexpr int V_COLS = DV / CONSUMERS;          // 256 O columns per consumer warpgroup
constexpr int KSTEPS = D_QK / 16;               // 36 wgmma k-steps of S
constexpr int Q_OFF = 0;
constexpr int KV_OFF = TILE_BYTES;
// A KV tile arrives in NGROUP chunk groups, each on its own full barrier: S starts on the first dims
// while the rest of the tile is in flight.
constexpr int NGROUP = 3, GROUP_CHUNKS = NCHUNK / NGROUP;
// PAIR groups a tile by its users instead: V columns of warpgroup 0 (chunks 0-3), of warpgroup 1
// (4-7), the rope chunk (8; P after S). Each group is released on its own empty barrier.
__host__ __device__ constexpr int pair_group(int g) { return g < NGROUP ? 4 * g : NCHUNK; }  // first chunk of g
constexpr int BAR_OFF = KV_OFF + STAGES * TILE_BYTES;  // full[STAGES][NGROUP], empty[STAGES], q, pair_empty[STAGES][NGROUP]
constexpr int STATE_OFF = BAR_OFF + 128;         // m, l, rescale: [3][2 slots][BM] fp32
constexpr int SMEM = STATE_OFF + 3 * 2 * BM * 4 + 1024;  // + slack to align the base to 1024 B
static_assert(SMEM <= 227 * 1024, "over sm_90's 227 KB of shared memory per block");
// SEESAW2: one full barrier per chunk and stage (18) and the Q barrier; no empty barriers (each chunk
// range is reloaded by the consumer thread that saw its last reader finish), no producer warpgroup.
constexpr int S2_BAR_BYTES = 256;
constexpr int S2_HANDOFFS = 5;  // SEESAW2's hand-off mbarriers after the q barrier: m', m'', P_a, P_b, the row sums
constexpr int S2_STATE_OFF = BAR_OFF + S2_BAR_BYTES;  // the same three [2][BM] fp32 tables
constexpr int S2_SMEM = S2_STATE_OFF + 3 * 2 * BM * 4 + 1024;
static_assert((STAGES * NCHUNK + 1 + S2_HANDOFFS) * 8 <= S2_BAR_BYTES && S2_SMEM <= 227 * 1024, "SEESAW2 layout");
// The timeline build's two step times and its first S's end (thread 0 of seesaw2's warpgroup 0), after the hand-off
// barriers
constexpr int T_STEP_OFF = 8 * (STAGES * NCHUNK + 1 + S2_HANDOFFS);  // from BAR_OFF
static_assert(T_STEP_OFF + 3 * 8 <= S2_BAR_BYTES, "SEESAW2 layout: the step times");
static_assert(NCHUNK % NGROUP == 0 && (STAGES * (2 * NGROUP + 1) + 1) * 8 <= 128, "barrier layout");
// setmaxnreg: 384 threads x 168 registers at launch; the producer gives 128 of its 168 back.
constexpr int PRODUCER_REGS = 40;
constexpr int CONSUMER_REGS = 232;
// Named barriers (0 is __syncthreads): 1, 2 = one consumer warpgroup; 3, 4 = P of an even / odd tile
// ready (seesaw, pair); 5 = both consumer warpgroups; 6, 7 = warpgroup 0 / 1 may issue S (staggered);
// pair: 8 = the row max of the even tile ready, 9 = the pair's row max ready, 10 = warpgroup 0 issued S.
// half: 8 = both warpgroups' row maxima of a tile published, 3 = both halves of its P written.
constexpr int BAR_WG = 1, BAR_P = 3, BAR_CONSUMERS = 5, BAR_SCHED = 6, BAR_MAX = 8, BAR_ISSUE = 10;
enum Schedule {
  BOTH = 0, SEESAW = 1, STAGGERED = 2, PAIR = 3, HALF = 4, STAGGERED_SMALL = 5, STAGGERED_TAIL = 6, SEESAW2 = 7,
  SEESAW2_BAR = 8, SEESAW2_EL = 9
};
// SEESAW2_EL: SEESAW2 whose partial rows are stored with an L2 evict_last policy (verify_partials.cuh store_partial16),
// its merge discarding their lines once read (VerifyParams::discard): ncu of the merge alone read its 8 MB of partials
// from DRAM (L2 read hit rate 13-17%, perf_history/kernel/merge_ncu_e730c78/). The default at <= 128 query rows with a
// KV capacity past half the L2 (kdengine/ops/cuda_backend.py EL_MAX_ROWS, EL_L2_SHARE: 65k T=16 0.7-1.6 us faster in
// two runs, T=64 slower: el_9fb95fb/, el_8523781/; 32k and 48k T=16 0.6-1.3 us: el_l2_97c6a8c/). Since 2026-12-03
// (probe pf0) its row tile 0 block also prefetches tiles 2 and 3 into L2 under its first S, once tile 0 has landed (the
// start's burst of tile 0 / 1 loads served), so that step 0's reloads find them in L2: 65k T=16's start -> step 1 takes
// ~9.6 us against a ~3.5 us steady step
// (perf_history/kernel/p2cd_aa57768/), and a stage's reload from DRAM waits ~1.9 us against ~0.9 from L2
// (perf_history/kernel/stream_floor/); p2 prefetched tiles 4 and 5 at step 0, into the start's burst (+3 us,
// p2_361beb2/), this nothing later. H200, three A/B sets against SEESAW2_EL without it (perf_history/kernel/
// pf0_5e1119c/): 65k T=16 0.45-0.49 us faster by the sets' means (in two 8-row sets every row with it below every row
// without), ncu (one cold launch) 41.60 -> 41.18 us; at 65k T=64, where SEESAW2_EL does not run, 1.5-1.9 us slower.
// Its own 3-replay in-kernel timeline read the other way (the start 1.1 us longer): not resolved.
// SEESAW2_BAR (SEESAW2's hand-offs on named barriers; SEESAW2 has them on mbarriers): 11 = warpgroup 0's running max after its tile published, 12 =
// warpgroup 1's (the step's) published, 13 = P of the even tile (over its rope chunk) written, 14 = P of
// the odd tile (over Q's rope chunk) written.
constexpr int BAR_S2_MAX0 = 11, BAR_S2_MAX1 = 12, BAR_S2_P0 = 13, BAR_S2_P1 = 14;
// SEESAW2 (and SEESAW2_BAR): each loader thread looks up the pool rows of the next step's loads at the end of a step
// (under its S wait; look_ahead) instead of right before each TMA issue (a dependent global load in series with the
// reload, on the path to the next S), and warpgroup 1 publishes P_b only once it has issued P_a V_aR, so that both of
// its P V are on the tensor pipe ahead of warpgroup 0's P_b V_bL and next S (FlashMLA's order).
// Its probes, each measured on the H200 slower than SEESAW2 or within the spread, are gone from here (their code:
// csrc history before 2026-12-01's pruning, commit dd10800): swap (warpgroup 1 issues P_a V_aR before P_b V_bR), early
// (warpgroup 0 publishes P_a before its P_a V_aL is done), se, qc (the prologue's Q in chunks on their own mbarriers),
// seq, eno (early without the P_b order) in perf_history/kernel/s2t64_48c695b/README.md; mid (P_b published between
// warpgroup 1's two P V: equal at T=16, 1.1% slower at 65k T=64) in verify_kernel_s2mid_*_dd10800.json; 2-CTA
// clusters with multicast loads in mcast_32bdeed/; the earlier v0, ahead, alate, apro, aolp and the L2 prefetch in
// sm90_s2tune_{912b393,5873571}/; ring4 (32-token tiles in a 4-stage ring: the full-barrier waits at 65k T=16 halve,
// but 1.64x the instructions and m64n32 S make it slower at all six sizes, 65k T=16 54.8 against 44.7 us) in
// ring4_1d11a74/ (its code there, ring4.patch); late (warpgroup 0's first reload after m'', FlashMLA's placement: 0.5-0.9
// us slower at T=64) in late_14c0a94/; g2 (two chunks per full barrier: 5.5% slower at 65k T=64) in g2_e0dfbe9/; la (the
// page lookups in every thread: 0.3-0.6 us slower at 65k T=64) in la_ab24c16/; h (warpgroup 0's P V in m64n128 halves,
// each half's chunks reloaded once done: 2% slower at 65k T=64) in h_6fa1005/; s4 (each reload from two warps: 0.7-1.4%
// slower at 65k T=64) in s4_ece8aff/; tb (the tail tile's mask bits from tail_bits under its S: 0.5 / 0.6-0.9 us slower
// at 65k T=16 / T=64, 0.2-0.5 us faster at 16k T=64, a larger kernel) in tb_0117714/; stream (stream-K: each sequence's
// row tiles x KV tiles cut evenly over the SMs, a block crossing a row tile running a second segment: 13-18% slower at
// 65k T=64, slower at every size; the blocks sharing a KV range must stay adjacent in launch order, and whole KV tiles
// cap its gain at 1.6% there) in stream_d70f087/; mpf (the tail blocks' mask words prefetched into L1) in mpf_00e2070/;
// bulk (the partial rows staged in shared memory by stmatrix, then bulk copies: 0.1-0.5 us slower) in bulk_12bb1ab/;
// ldst (staged the same way, then a rolled loop of 16-byte stores: the epilogue's code 456 SASS instructions smaller,
// 2.4 us faster in ncu's cold launch at 65k T=16, the same as seesaw2 graph-replayed, where the code stays in the
// instruction caches) in ldst_03a138e/; cp (2-CTA clusters of two splits, merged through distributed shared memory
// into one partial per pair: half the partial bytes, the merge 0.6-1 us shorter, but the split blocks' work 8 us
// longer at 65k, 9-12 us slower overall; the clusters alone, which put the row tiles of a split on different TPCs, cost
// 5.7 us at 65k T=64 and under 1 us at T=16, the rest is its own build's) in cp_7ceb62a/; pl (the first two tiles'
// page lookups together, ahead of the Q load: the prologue 0.25-0.6 us shorter in the timeline, nothing graph-replayed)
// in pl_98b83ff/; pf (the next step's tiles prefetched into L2, three forms: by the TMA unit or prefetch.global.L2,
// from row tile 0's block at every T: 65k T=64 17-19% slower; one tile per row tile's block from step 1 on, at T * H <=
// 128 only: 65k T=16 within the spread, and its inactive code alone 4% slower at 65k T=64) in pf_{be6ebd5,b4cbb8f,
// 659e0cb}/; shrink (warpgroup 0's two O rescales from one rolled site: 2% slower at 65k T=64) and shift (load_chunks'
// page count by shifts: 232 fewer inactive instructions, within the spread; the loop is not bound by its size) in
// shift_951e696/; pf4 (pf's second form from step 1 on, at two row tiles only: 65k T=16 0.1-0.7 us slower) in
// pf4_f5a36a6/; pt (the prologue's loads issued before the block's first barrier, tensor maps prefetched: within the
// spread at every size) in pt_c67ae56/; pi (the prologue's three load sequences from three threads at once: issued up to
// 0.8 us sooner, the first S later, within the spread at every size) in pi_f04b6b0/; p2 (row tile 0's block prefetching
// into L2 at each reload the tile two steps on, from step 0: 65k T=16's loop 0.53 us a step shorter, its start 3 us
// longer, T=64 8 us slower) in p2_361beb2/; p2c / p2d (p2 from step 1 on, issued by warps 2-3 beside the loaders, at two
// row tiles / at every count: 65k T=16 0.0-0.8 us slower, T=64 9 us slower with p2d, 4-5 us with p2c's inactive code)
// in p2cd_aa57768/; qreg (Q's chunks 0-7 in the registers of a third warpgroup that computes S and the softmax of every
// tile, two P V warpgroups, a 3-stage ring: setmaxnreg at 192 + 2 x 160 deadlocked, over the 3 x 168 a 384-thread block
// is launched with; within it, 184 / 160, ptxas serializes the S warpgroup's wgmmas: 65k T=16 57.7 against 41.5 us, T=64
// 190.1 against 112.2) in qreg_ef15485/. Folded in on
// 2026-12-01: d32 (the descriptors as 32-bit adds, d32_905c234/), unr (the TMA issue loop unrolled, g2_e0dfbe9/), spread
// (the stage-1 reloads from warp 1, la_ab24c16/).
constexpr int NUM_SCHEDULES = SEESAW2_EL + 1;  // schedules 0 .. NUM_SCHEDULES - 1 (the launcher's dispatch)
__host__ __device__ constexpr bool is_seesaw2(int schedule) {
  return schedule == SEESAW2 || schedule == SEESAW2_BAR || schedule == SEESAW2_EL;
}
// The schedules that store their partial rows under an L2 evict_last policy (their merge discards them once read).
__host__ __device__ constexpr bool evict_last_partials(int schedule) { return schedule == SEESAW2_EL; }
__host__ __device__ constexpr int threads_of(int schedule) { return is_seesaw2(schedule) ? 128 * CONSUMERS : THREADS; }
__host__ __device__ constexpr int smem_of(int schedule) { return is_seesaw2(schedule) ? S2_SMEM : SMEM; }
constexpr int HALF_N = BN / CONSUMERS;  // HALF: tokens of a tile per warpgroup in S
constexpr float LAZY_LOG2 = 8.f;        // HALF, STAGGERED_SMALL: a row's max moves only when a score passes it by 2^8
// STAGGERED_SMALL: the producer's empty-barrier waits suspend up to this many ns per try (CUTLASS's hint).
constexpr uint32_t SUSPEND_NS = 0x989680;

// --- PTX wrappers (sm_90a) --------------------------------------------------------------------------

// (smem_u32, mbar_init / arrive / expect_tx / wait, tma_load: sm90_ptx.cuh, shared with ci/gpu/stream_floor.cu)
// The same with a suspend-time hint: the waiting thread sleeps in the barrier instead of re-issuing the try.
__device__ __forceinline__ void mbar_wait_suspend(uint32_t bar, int parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1, %2;\n"
      "@!done bra WAIT;\n}\n" ::"r"(bar),
      "r"(parity), "n"(SUSPEND_NS)
      : "memory");
}
__device__ __forceinline__ void bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Generic-proxy shared-memory writes made visible to the async proxy (wgmma operand reads, TMA).
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accumulator reads / writes across the asynchronous wgmma.
template <int N>
__device__ __forceinline__ void reg_fence(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// A wgmma shared-memory descriptor, 128-byte swizzle. K-major operands (Q, K, P): rows 128 B apart,
// 8-row groups 1024 B apart (SBO), LBO unused (1). MN-major V: 64-column groups `lbo` apart, 8-token
// groups 1024 B apart. Buffers are 1024-byte aligned; a k-step inside a swizzle row moves the start
// address by 32 B (the hardware applies the XOR pattern to the address bits).
__device__ __forceinline__ uint64_t make_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>((lbo >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3FFF) << 32) | (1ull << 62);
}
// The high word of every descriptor here (SBO 1024, 128-byte swizzle): make_desc(_, _, 1024) >> 32.
constexpr uint64_t DESC_HI = (static_cast<uint64_t>(1024 >> 4) << 32) | (1ull << 62);
// Descriptor d advanced by off 16-byte units. D32: as a 32-bit add on the low word beside DESC_HI (the start
// address field cannot carry: shared memory ends below 2^18 bytes); else a 64-bit add.
template <bool D32>
__device__ __forceinline__ uint64_t desc_at(uint64_t d, uint32_t off) {
  if constexpr (D32) return DESC_HI | (static_cast<uint32_t>(d) + off);
  else return d + off;
}

// --- wgmma (one function per shape) -------------------------------------------------------------------

// The accumulator operands of a wgmma, d[0..N): "%0, ..., %N-1" in the instruction text, "+f"(d[i]) as the
// asm's in/out operands (the inputs follow them, from %N).
#define KD_ACC16_TEXT "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define KD_ACC32_TEXT KD_ACC16_TEXT ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define KD_ACC128_TEXT \
    KD_ACC32_TEXT \
    ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47" \
    ", %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63" \
    ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79" \
    ", %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95" \
    ", %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111" \
    ", %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define KD_ACC4(d, i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define KD_ACC16(d, i) KD_ACC4(d, i), KD_ACC4(d, i + 4), KD_ACC4(d, i + 8), KD_ACC4(d, i + 12)
#define KD_ACC32(d, i) KD_ACC16(d, i), KD_ACC16(d, i + 16)
#define KD_ACC128(d) KD_ACC32(d, 0), KD_ACC32(d, 32), KD_ACC32(d, 64), KD_ACC32(d, 96)

// S[64 x 64] (+)= A[64 x 16] * B[64 x 16]^T, both K-major in shared memory (descriptors).
__device__ __forceinline__ void wgmma_qk(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" KD_ACC32_TEXT "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : KD_ACC32(d, 0)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// S[64 x 32] (+)= A[64 x 16] * B[32 x 16]^T (HALF: one warpgroup's 32 tokens of a tile), as above.
__device__ __forceinline__ void wgmma_qk(float (&d)[16], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {" KD_ACC16_TEXT "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : KD_ACC16(d, 0)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// O[64 x 256] (+)= A[64 x 16] * B[16 x 256], A K-major and B MN-major (transposed) in shared memory.
__device__ __forceinline__ void wgmma_pv_ss(float (&d)[128], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" KD_ACC128_TEXT "}, %128, %129, p, 1, 1, 0, 1;\n}\n"
      : KD_ACC128(d)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// O[64 x 256] (+)= A[64 x 16] (registers, the m16n8k16 A fragment per warp) * B[16 x 256] (MN-major).
__device__ __forceinline__ void wgmma_pv_rs(float (&d)[128], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" KD_ACC128_TEXT "}, {%128, %129, %130, %131}, "
      "%132, p, 1, 1, 1;\n}\n"
      : KD_ACC128(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}

// S[64 x 64] (+)= A[64 x 16] (registers, the m16n8k16 A fragment per warp) * B[64 x 16]^T (K-major, shared
// memory): SEESAW2's rope chunk of Q, kept in registers.
__device__ __forceinline__ void wgmma_qk_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" KD_ACC32_TEXT "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : KD_ACC32(d, 0)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}

#undef KD_ACC128
#undef KD_ACC32
#undef KD_ACC16
#undef KD_ACC4
#undef KD_ACC128_TEXT
#undef KD_ACC32_TEXT
#undef KD_ACC16_TEXT

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// --- pieces of the consumer -------------------------------------------------------------------------

// Per-thread view of the accumulator rows: wgmma m64nN gives warp w of a warpgroup rows 16 w + lane / 4
// (+ 8); register 4 j + 2 h + c holds row (+8 h), column 8 j + 2 (lane % 4) + c.
struct Rows {
  int local[2];      // block-local rows
  int mask_word[2];  // word offset of the row's packed mask
  bool valid[2];     // row < R
};

__device__ __forceinline__ Rows make_rows(const VerifyParams& p, int b, int row0, int wtid) {
  Rows r;
  const int warp = wtid / 32, lane = wtid % 32;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    r.local[h] = warp * 16 + lane / 4 + 8 * h;
    const int row = row0 + r.local[h];
    r.valid[h] = row < p.R;
    r.mask_word[h] = (b * p.T + min(row, p.R - 1) / p.H) * p.W;
  }
  return r;
}

// S = Q K^T of one tile (64 x 64 fp32; N = 16: the 32 tokens whose K rows start at `tile`), issued and
// committed (not waited). Each chunk group's k-steps are issued once its full barrier (full_bars + 8 g,
// `parity`) has flipped.
template <int N>
__device__ __forceinline__ void issue_qk(float (&s)[N], uint32_t q_s, uint32_t tile, uint32_t full_bars, int parity) {
  uint64_t qd = make_desc(q_s, 16, 1024), kd = make_desc(tile, 16, 1024);
  // (HALF: opaque per call, else the compiler keeps all 36 Q descriptors live across the loop and spills)
  if constexpr (N == 16) asm volatile("" : "+l"(qd), "+l"(kd));
#pragma unroll
  for (int g = 0; g < NGROUP; ++g) {
    mbar_wait(full_bars + 8 * g, parity);
    wgmma_fence();  // after the (divergent) wait loop: ptxas would insert it there anyway
#pragma unroll
    for (int ks = g * 4 * GROUP_CHUNKS; ks < (g + 1) * 4 * GROUP_CHUNKS; ++ks) {
      const uint64_t off = (ks / 4) * (CHUNK_BYTES >> 4) + (ks % 4) * 2;  // 16-byte units
      wgmma_qk(s, qd + off, kd + off, ks > 0);
    }
  }
  wgmma_commit();
}

// S k-steps of chunk group G (pair_group) once its full barrier flipped; FIRST: the group that starts S.
template <int G, bool FIRST>
__device__ __forceinline__ void issue_qk_group(float (&s)[32], uint64_t qd, uint64_t kd, uint32_t full_bars,
                                               int parity) {
  mbar_wait(full_bars + 8 * G, parity);
  wgmma_fence();
#pragma unroll
  for (int ks = 4 * pair_group(G); ks < 4 * pair_group(G + 1); ++ks) {
    const uint64_t off = (ks / 4) * (CHUNK_BYTES >> 4) + (ks % 4) * 2;  // 16-byte units
    wgmma_qk(s, qd + off, kd + off, !FIRST || ks > 4 * pair_group(G));
  }
}

// S of one tile for PAIR, its chunk groups in the order the stage frees them (RIGHT_FIRST: warpgroup
// 1's V columns, the rope chunk, then warpgroup 0's columns); issued and committed, not waited.
template <bool RIGHT_FIRST>
__device__ __forceinline__ void issue_qk_pair(float (&s)[32], uint32_t q_s, uint32_t tile, uint32_t full_bars,
                                              int parity) {
  const uint64_t qd = make_desc(q_s, 16, 1024), kd = make_desc(tile, 16, 1024);
  if constexpr (RIGHT_FIRST) {
    issue_qk_group<1, true>(s, qd, kd, full_bars, parity);
    issue_qk_group<2, false>(s, qd, kd, full_bars, parity);
    issue_qk_group<0, false>(s, qd, kd, full_bars, parity);
  } else {
    issue_qk_group<0, true>(s, qd, kd, full_bars, parity);
    issue_qk_group<1, false>(s, qd, kd, full_bars, parity);
    issue_qk_group<2, false>(s, qd, kd, full_bars, parity);
  }
  wgmma_commit();
}

// Every chunk group of a tile landed.
__device__ __forceinline__ void wait_tile(uint32_t full_bars, int parity) {
#pragma unroll
  for (int g = 0; g < NGROUP; ++g) mbar_wait(full_bars + 8 * g, parity);
}

// O[:, 256 w + (0..255)] += P V with P from registers (pa[kk]: tokens 16 (k0 + kk) .. + 15; K k-steps).
template <int K, bool D32 = false>
__device__ __forceinline__ void issue_pv_rs(float (&o)[128], const uint32_t (&pa)[K][4], uint32_t tile, int w,
                                            int k0 = 0) {
  const uint64_t vd = make_desc(tile + w * (V_COLS / SW) * CHUNK_BYTES, CHUNK_BYTES, 1024);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < K; ++kk) wgmma_pv_rs(o, pa[kk], desc_at<D32>(vd, (k0 + kk) * (16 * 128 >> 4)), 1);
  wgmma_commit();
}

// The same with P (64 x 64 bf16, the store_p layout) read from the rope chunk of `p_tile` and V from `tile`:
// tokens [16 k0, 16 (k0 + K)).
template <int K = BN / 16, bool D32 = false>
__device__ __forceinline__ void issue_pv_ss_from(float (&o)[128], uint32_t p_tile, uint32_t tile, int w, int k0 = 0) {
  const uint64_t vd = make_desc(tile + w * (V_COLS / SW) * CHUNK_BYTES, CHUNK_BYTES, 1024);
  const uint64_t pd = make_desc(p_tile + P_CHUNK * CHUNK_BYTES, 16, 1024);
  wgmma_fence();
#pragma unroll
  for (int kk = k0; kk < k0 + K; ++kk)
    wgmma_pv_ss(o, desc_at<D32>(pd, kk * 2), desc_at<D32>(vd, kk * (16 * 128 >> 4)), 1);
  wgmma_commit();
}

// P from the tile's own rope chunk (written by the owner over it).
template <int K = BN / 16, bool D32 = false>
__device__ __forceinline__ void issue_pv_ss(float (&o)[128], uint32_t tile, int w, int k0 = 0) {
  issue_pv_ss_from<K, D32>(o, tile, tile, w, k0);
}

// Bits [0, n) set (n <= 0: none, n >= 32: all).
__device__ __forceinline__ uint32_t low_bits(int n) { return __funnelshift_lc(~0u, 0u, max(n, 0)); }

// The tail's visibility of a thread's 32 scores of a 64-token tile as bits (bit 4 j + 2 h + e: score
// 4 j + 2 h + e, row h, token tile_start + 8 j + 2 (lane % 4) + e), from the <= 3 mask words each row's
// scores reach: 6 loads issued together (word indices clamped into the row: the words they stand in for
// cover only prefix tokens, visible, or tokens past the end, not), then funnel shifts, two masks and a
// byte permute, no branch.
__device__ __forceinline__ uint32_t tail_bits(const VerifyParams& p, const Rows& rows, int tile_start, int prefix,
                                              int end) {
  const int pos0 = tile_start + 2 * (threadIdx.x % 4);  // this thread's scores: tokens pos0 + 8 j + e
  const int k0 = pos0 - prefix, w0 = k0 >> 5, sh = k0 & 31;  // tree index of pos0 (negative: prefix), its word
  // per 32 tokens from pos0: the prefix tokens (visible whatever the mask says) and the tokens before the end
  const uint32_t pre[2] = {low_bits(-k0), low_bits(-k0 - 32)};
  const uint32_t live[2] = {low_bits(end - pos0), low_bits(end - pos0 - 32)};
  uint32_t win[2][2];  // win[h][c]: bit i = token pos0 + 32 c + i visible from row h
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int* row = p.mask_bits + rows.mask_word[h];
    asm("" : "+l"(row));  // (one pointer per row, each load at row + 4 index: not three 64-bit index sums)
    uint32_t wd[3];
#pragma unroll
    for (int c = 0; c < 3; ++c) wd[c] = __ldg(row + static_cast<uint32_t>(min(max(w0 + c, 0), p.W - 1)));
#pragma unroll
    for (int c = 0; c < 2; ++c) win[h][c] = (__funnelshift_r(wd[c], wd[c + 1], sh) | pre[c]) & live[c];
  }
  uint32_t z[2];  // byte j of z[c]: tokens 8 (4 c + j) + e at bit 2 h + e, then bytes 2 i, 2 i + 1 paired
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    z[c] = (win[0][c] & 0x03030303u) | ((win[1][c] << 2) & 0x0C0C0C0Cu);
    z[c] |= z[c] >> 4;
  }
  return __byte_perm(z[0], z[1], 0x6420);
}

// How mask_rowmax finds the tail tile's visibility: TAIL_LOADS a load per score, unrolled (a branch and a
// load per score in the loop); TAIL_ROLLED as bits in a rolled loop, a load per score in series (a small
// loop, a long critical path); TAIL_BITS as bits the caller found with tail_bits (ahead, under S).
enum TailMask { TAIL_LOADS = 0, TAIL_ROLLED = 1, TAIL_BITS = 2 };

// Scale S into the log2 domain, mask it (tail tiles only: past `end`, and tree columns the row may not
// see) and return each row's max (reduced over the row's quad of lanes). N accumulators: 2 N columns,
// the first at token tile_start. TAIL_BITS: `bits` = tail_bits of this tile (read on tail tiles only).
template <int N, int TAIL = TAIL_LOADS, bool RAW = false>
__device__ __forceinline__ void mask_rowmax(const VerifyParams& p, const Rows& rows, float (&s)[N], int tile_start,
                                            int prefix, int end, float (&mx)[2], uint32_t bits = 0,
                                            bool have_bits = false) {
  static_assert(!RAW || TAIL != TAIL_LOADS, "RAW: the scores stay unscaled (the TAIL_LOADS loop scales them)");
  const int lane = threadIdx.x % 32;
  const bool tail = tile_start + 2 * N > prefix;
  if constexpr (TAIL != TAIL_LOADS) {
    // The tail's visibility of this thread's N scores as bits (bit 4 j + e); the unrolled part only scales
    // and selects (a few instructions per score instead of a branch and a load).
    static_assert(N <= 32, "one word of visibility bits");
    static_assert(TAIL != TAIL_BITS || N == 32, "tail_bits covers a 64-token tile");
    if constexpr (!RAW) {
#pragma unroll
      for (int i = 0; i < N; ++i) s[i] *= p.scale_log2;
    }
    if (tail) {
      if (TAIL == TAIL_ROLLED && !have_bits) {  // (have_bits: the caller found them ahead, SEESAW2)
        bits = 0;
#pragma unroll 1
        for (int i = 0; i < N; ++i) {
          const int pos = tile_start + 8 * (i / 4) + 2 * (lane % 4) + (i & 1);
          bool vis = pos < end;
          if (vis && pos >= prefix) {
            const int k = pos - prefix;
            const int word = (i & 2) ? rows.mask_word[1] : rows.mask_word[0];  // (no dynamic index: a local array)
            vis = (__ldg(p.mask_bits + word + (k >> 5)) >> (k & 31)) & 1;
          }
          bits |= static_cast<uint32_t>(vis) << i;
        }
      }
#pragma unroll
      for (int i = 0; i < N; ++i) s[i] = (bits >> i) & 1 ? s[i] : -INFINITY;
    }
  } else {
#pragma unroll
    for (int j = 0; j < N / 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = s[4 * j + e] * p.scale_log2;
        if (tail) {
          const int pos = tile_start + 8 * j + 2 * (lane % 4) + (e & 1);
          if (pos >= end) {
            v = -INFINITY;
          } else if (pos >= prefix) {
            const int k = pos - prefix;
            const int word = __ldg(p.mask_bits + rows.mask_word[e >> 1] + (k >> 5));
            if (!((word >> (k & 31)) & 1)) v = -INFINITY;
          }
        }
        s[4 * j + e] = v;
      }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float v;
    if constexpr (RAW) {  // a tree (depth log2 N / 2 instead of a chain of N / 4)
      static_assert(N % 8 == 0, "pairs of pairs");
      float t[N / 4];
#pragma unroll
      for (int j = 0; j < N / 4; ++j) t[j] = fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]);
#pragma unroll
      for (int w = N / 8; w >= 1; w /= 2)
#pragma unroll
        for (int j = 0; j < w; ++j) t[j] = fmaxf(t[j], t[j + w]);
      v = t[0];
    } else {
      v = -INFINITY;
#pragma unroll
      for (int j = 0; j < N / 4; ++j) v = fmaxf(v, fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]));
    }
    v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, 1));
    mx[h] = fmaxf(v, __shfl_xor_sync(0xffffffff, v, 2));
    if constexpr (RAW) mx[h] *= p.scale_log2;  // scale_log2 > 0 (validate.check_inputs; the binding checks it)
  }
}

// A row max that is usable as an exponent offset (-inf: the row saw nothing yet, P is 0 anyway).
__device__ __forceinline__ float finite_max(float m) { return m == -INFINITY ? 0.f : m; }

// The running max m after a tile whose row maxima are mx: m_use (the exponent offset of P) and `scale` (the
// factor of the O and l accumulated so far). LAZY: m moves only when a score passes it by 2^LAZY_LOG2, so
// scale is exactly 1 (the rescale skips) on most tiles; P stays <= 2^LAZY_LOG2.
template <bool LAZY>
__device__ __forceinline__ void move_max(float (&m)[2], const float (&mx)[2], float (&m_use)[2], float (&scale)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if constexpr (LAZY) {
      const bool move = mx[h] > m[h] + LAZY_LOG2;  // -inf + 8 = -inf: the first finite max moves it
      const float m_new = move ? mx[h] : m[h];
      m_use[h] = finite_max(m_new);
      scale[h] = move ? exp2f(m[h] - m_use[h]) : 1.f;
      m[h] = m_new;
    } else {
      const float m_new = fmaxf(m[h], mx[h]);
      m_use[h] = finite_max(m_new);
      scale[h] = exp2f(m[h] - m_use[h]);
      m[h] = m_new;
    }
  }
}

// 2^x as one MUFU.EX2 (denormal results flushed to 0; exp2f adds a range check and two multiplies).
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// P = exp2(S - m_use) in place; the row sums (reduced over the quad). FAST: exp2_ftz.
template <int N, bool FAST = false>
__device__ __forceinline__ void exp_rows(float (&s)[N], const float (&m_use)[2], float (&sum)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < N / 4; ++j) {
      const float a = s[4 * j + 2 * h] - m_use[h], b = s[4 * j + 2 * h + 1] - m_use[h];
      s[4 * j + 2 * h] = FAST ? exp2_ftz(a) : exp2f(a);
      s[4 * j + 2 * h + 1] = FAST ? exp2_ftz(b) : exp2f(b);
      acc += s[4 * j + 2 * h] + s[4 * j + 2 * h + 1];
    }
    acc += __shfl_xor_sync(0xffffffff, acc, 1);
    sum[h] = acc + __shfl_xor_sync(0xffffffff, acc, 2);
  }
}

// exp_rows<N, true> on unscaled S (mask_rowmax RAW): P = 2^(S * scale_log2 - m_use), one FFMA and one MUFU.EX2
// per score instead of FMUL, FADD and MUFU, and the row sums added as a tree instead of a chain.
template <int N>
__device__ __forceinline__ void exp_rows_raw(float (&s)[N], float scale_log2, const float (&m_use)[2],
                                             float (&sum)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float t[N / 4];
#pragma unroll
    for (int j = 0; j < N / 4; ++j) {
      s[4 * j + 2 * h] = exp2_ftz(fmaf(s[4 * j + 2 * h], scale_log2, -m_use[h]));
      s[4 * j + 2 * h + 1] = exp2_ftz(fmaf(s[4 * j + 2 * h + 1], scale_log2, -m_use[h]));
      t[j] = s[4 * j + 2 * h] + s[4 * j + 2 * h + 1];
    }
#pragma unroll
    for (int w = N / 8; w >= 1; w /= 2)
#pragma unroll
      for (int j = 0; j < w; ++j) t[j] += t[j + w];
    float acc = t[0];
    acc += __shfl_xor_sync(0xffffffff, acc, 1);
    sum[h] = acc + __shfl_xor_sync(0xffffffff, acc, 2);
  }
}

// P (fp32 accumulator order) as bf16 A fragments: pa[kk] = tokens 16 kk .. 16 kk + 15.
template <int N>
__device__ __forceinline__ void pack_p(const float (&s)[N], uint32_t (&pa)[N / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < N / 8; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i) pa[kk][i] = pack_bf16(s[8 * kk + 2 * i], s[8 * kk + 2 * i + 1]);
}

// Online softmax of one tile: scale, mask (tail tiles), new row max / sum from the previous (m, l),
// P (bf16, A-fragment order) and the rescale factor of the O accumulated so far.
// TAIL: how the tail mask is found (mask_rowmax; TAIL_BITS: `bits` from tail_bits). LAZY: exp2 as one MUFU.EX2
// (exp2_ftz) and the running max moved lazily (only when a score passes it by 2^LAZY_LOG2, as in HALF; P <= 2^8
// then), so the O rescale is rarely taken.
template <int TAIL = TAIL_LOADS, bool LAZY = false>
__device__ __forceinline__ void softmax_tile(const VerifyParams& p, const Rows& rows, float (&s)[32], int tile_start,
                                             int prefix, int end, float (&m)[2], float (&l)[2], float (&scale)[2],
                                             uint32_t (&pa)[4][4], uint32_t bits = 0) {
  float mx[2], m_use[2], sum[2];
  mask_rowmax<32, TAIL>(p, rows, s, tile_start, prefix, end, mx, bits);
  move_max<LAZY>(m, mx, m_use, scale);
  exp_rows<32, LAZY>(s, m_use, sum);
#pragma unroll
  for (int h = 0; h < 2; ++h) l[h] = l[h] * scale[h] + sum[h];
  pack_p(s, pa);
}

__device__ __forceinline__ void rescale(float (&o)[128], const float (&scale)[2]) {
  if (!__any_sync(0xffffffff, scale[0] != 1.f || scale[1] != 1.f)) return;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    o[4 * j] *= scale[0], o[4 * j + 1] *= scale[0];
    o[4 * j + 2] *= scale[1], o[4 * j + 3] *= scale[1];
  }
}

// P (bf16) into the tile's rope chunk, 128-byte swizzled (the K-major A layout of issue_pv_ss).
__device__ __forceinline__ void store_p(unsigned char* tile, const Rows& rows, const uint32_t (&pa)[4][4]) {
  const int q = threadIdx.x % 4;
  unsigned char* dst = tile + P_CHUNK * CHUNK_BYTES;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = rows.local[i & 1], unit = 2 * kk + (i >> 1);  // columns 8 unit + 2 q
      *reinterpret_cast<uint32_t*>(dst + r * 128 + ((unit ^ (r & 7)) << 4) + 4 * q) = pa[kk][i];
    }
}

// store_p with stmatrix: k-step kk's four A-fragment registers are four 8x8 matrices (rows 0-7 / 8-15 of the warp's 16,
// columns 16 kk + 0-7 / 8-15), one stmatrix.x4 each; lane l names row (l & 7) + 8 ((l >> 3) & 1) of matrix l >> 3.
// tile: the shared-window address of the tile (P goes over its rope chunk); wtid: the thread in its warpgroup.
__device__ __forceinline__ void store_p_stsm(uint32_t tile, int wtid, const uint32_t (&pa)[4][4]) {
  const int lane = wtid % 32, r = (wtid / 32) * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, hi = lane >> 4;
  const uint32_t row = tile + P_CHUNK * CHUNK_BYTES + r * 128;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const uint32_t a = row + (((2 * kk + hi) ^ (r & 7)) << 4);
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(pa[kk][0]),
                 "r"(pa[kk][1]), "r"(pa[kk][2]), "r"(pa[kk][3])
                 : "memory");
  }
}

// P * sc (per row) into the tile's rope chunk, the same layout as store_p, packed on the fly from the
// fp32 P (the A fragments of an in-flight P V stay untouched).
__device__ __forceinline__ void store_p_scaled(unsigned char* tile, const Rows& rows, const float (&s)[32],
                                               const float (&sc)[2]) {
  const int q = threadIdx.x % 4;
  unsigned char* dst = tile + P_CHUNK * CHUNK_BYTES;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = rows.local[i & 1], unit = 2 * kk + (i >> 1);
      const float f = sc[i & 1];
      *reinterpret_cast<uint32_t*>(dst + r * 128 + ((unit ^ (r & 7)) << 4) + 4 * q) =
          pack_bf16(s[8 * kk + 2 * i] * f, s[8 * kk + 2 * i + 1] * f);
    }
}

// HALF, PAIR, SEESAW2_BAR: each warpgroup's row sums hold the P it computed: add the other's (a table of [2][BM]).
// SEESAW2 passes an mbarrier of 256 arrivals (bar) that every thread arrives on and waits for, instead of a
// bar.sync of both warpgroups: compute-sanitizer racecheck reports this exchange around the bar.sync in that
// kernel, not around the mbarrier (perf_history/kernel/s2race_6a95ae1/).
__device__ __forceinline__ void add_row_sums(float (&l)[2], float* tab, const Rows& rows, int w, int wtid,
                                             uint32_t bar = 0) {
  if (wtid % 4 == 0)
#pragma unroll
    for (int h = 0; h < 2; ++h) tab[w * BM + rows.local[h]] = l[h];
  if (bar != 0) {
    mbar_arrive(bar);
    mbar_wait(bar, 0);
  } else {
    bar_sync(BAR_CONSUMERS, 128 * CONSUMERS);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) l[h] += tab[(1 - w) * BM + rows.local[h]];
}

// HALF: this warpgroup's P (bf16 A fragments of its 32 tokens, from token 32 w of the tile) into the
// tile's rope chunk, the layout of store_p (16-byte units 4 w .. 4 w + 3 of each row).
__device__ __forceinline__ void store_p_half(unsigned char* tile, const Rows& rows, const uint32_t (&pa)[2][4], int w) {
  const int q = threadIdx.x % 4;
  unsigned char* dst = tile + P_CHUNK * CHUNK_BYTES;
#pragma unroll
  for (int kk = 0; kk < 2; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = rows.local[i & 1], unit = 4 * w + 2 * kk + (i >> 1);
      *reinterpret_cast<uint32_t*>(dst + r * 128 + ((unit ^ (r & 7)) << 4) + 4 * q) = pa[kk][i];
    }
}

// Zero token rows [first, BN) of a tile (all 576 dims), generic stores fenced for the async proxy.
__device__ __forceinline__ void zero_rows(unsigned char* tile, int first, int tid, int nthreads) {
  const int units = (BN - first) * NCHUNK * 8;
  for (int u = tid; u < units; u += nthreads) {
    const int row = first + u / (NCHUNK * 8), rest = u % (NCHUNK * 8);
    *reinterpret_cast<uint4*>(tile + (rest / 8) * CHUNK_BYTES + row * 128 + (rest % 8) * 16) = make_uint4(0, 0, 0, 0);
  }
  fence_async_smem();
}

__device__ __forceinline__ void release(uint32_t empty_bar) {
  if (threadIdx.x % 32 == 0) mbar_arrive(empty_bar);
}

// The pool row of the KV tile at tile_start when one page holds the whole tile (page_size >= BN), else -1
// (load_group / load_chunks then look up each page itself). Read when the load is issued: consecutive tiles' entries share
// a 128-byte line, so it mostly hits L1 (holding rows read a step ahead in registers spilled).
__device__ __forceinline__ int tile_row(const VerifyParams& p, const int* pages, int tile_start) {
  const int ps = p.page_size;
  return ps >= BN ? __ldg(pages + (tile_start >> p.page_shift)) * ps + (tile_start & (ps - 1)) : -1;
}

// The TMA loads of chunks [c0, c1) of the KV tile at tile_start into dst, counted on full barrier fb.
__device__ __forceinline__ void load_group(const VerifyParams& p, const CUtensorMap* kv_map, const int* pages,
                                           int tile_start, int end, uint32_t dst, int c0, int c1, uint32_t fb) {
  const int ps = p.page_size;
  if (ps >= BN) {
    const int row = tile_row(p, pages, tile_start);
    mbar_expect_tx(fb, (c1 - c0) * CHUNK_BYTES);
    for (int k = c0; k < c1; ++k) tma_load(dst + k * CHUNK_BYTES, kv_map, k * SW, row, fb);
  } else {  // several pages per tile: one box of ps rows per page that holds tokens before `end`
    const int npages = min(BN / ps, (end - tile_start + ps - 1) / ps);
    mbar_expect_tx(fb, npages * ps * 128 * (c1 - c0));
    for (int pg = 0; pg < npages; ++pg) {
      const int row = __ldg(pages + ((tile_start + pg * ps) >> p.page_shift)) * ps;
      for (int k = c0; k < c1; ++k) tma_load(dst + k * CHUNK_BYTES + pg * ps * 128, kv_map, k * SW, row, fb);
    }
  }
}

// --- pieces of SEESAW2 ---------------------------------------------------------------------------------

// The TMA loads of chunks [c0, c1) of the KV tile at tile_start (pool row `row`: tile_row) into dst, chunk k
// counted on its own full barrier fb + 8 k (so S starts on a chunk as soon as it lands; two chunks per barrier:
// up to 5.7% slower, at 65k T=64, perf_history/kernel/g2_e0dfbe9/). Called by one thread. With a page of >= 64 tokens the loop is
// unrolled (c0, c1 constants at every call): rolled, the loader's warp ran a branch per chunk at each reload, and
// unrolled seesaw2 is 2.7% faster at 65k T=64 (the same run); the several-pages loops stay rolled.
__device__ __forceinline__ void load_chunks(const VerifyParams& p, const CUtensorMap* kv_map, const int* pages,
                                            int tile_start, int row, int end, uint32_t dst, int c0, int c1,
                                            uint32_t fb) {
  const int ps = p.page_size;
  if (ps >= BN) {
#pragma unroll
    for (int k = c0; k < c1; ++k) {
      mbar_expect_tx(fb + 8 * k, CHUNK_BYTES);
      tma_load(dst + k * CHUNK_BYTES, kv_map, k * SW, row, fb + 8 * k);
    }
  } else {  // several pages per tile: one box of ps rows per page that holds tokens before `end`
    const int npages = min(BN / ps, (end - tile_start + ps - 1) / ps);
#pragma unroll 1
    for (int k = c0; k < c1; ++k) mbar_expect_tx(fb + 8 * k, npages * ps * 128);
#pragma unroll 1
    for (int pg = 0; pg < npages; ++pg) {
      const int row = __ldg(pages + ((tile_start + pg * ps) >> p.page_shift)) * ps;
#pragma unroll 1
      for (int k = c0; k < c1; ++k) tma_load(dst + k * CHUNK_BYTES + pg * ps * 128, kv_map, k * SW, row, fb + 8 * k);
    }
  }
}

// S k-steps of chunks [C0, C1) of a tile, each chunk once its full barrier (fb + 8 chunk, `parity`) has
// flipped; the rope chunk (8) from Q in registers (q8), the others from shared memory. FIRST: the first
// k-step starts S (scale-d 0). Not committed. Each k-step's descriptors in desc_at's 32-bit form (d32_905c234/).
template <int C0, int C1, bool FIRST>
__device__ __forceinline__ void issue_qk_chunks(float (&s)[32], uint64_t qd, uint64_t kd, const uint32_t (&q8)[4][4],
                                                uint32_t fb, int parity) {
  // the low words opaque per call: no descriptors hoisted and kept live across the loop
  uint32_t ql = static_cast<uint32_t>(qd), kl = static_cast<uint32_t>(kd);
  asm volatile("" : "+r"(ql), "+r"(kl));
#pragma unroll
  for (int c = C0; c < C1; ++c) {
    mbar_wait(fb + 8 * c, parity);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint32_t off = c * (CHUNK_BYTES >> 4) + kk * 2;  // 16-byte units
      const int acc = !FIRST || c > C0 || kk > 0;
      if (c == P_CHUNK)
        wgmma_qk_rs(s, q8[kk], desc_at<true>(kl, off), acc);
      else
        wgmma_qk(s, desc_at<true>(ql, off), desc_at<true>(kl, off), acc);
    }
  }
}

#ifdef KDENGINE_TIMELINE
// The timeline build's S issue times in seesaw2's tile loop (timeline::SPLIT_SISSUE*): [warpgroup][its first, second S
// issue call of a step] ns, summed by the warpgroup's thread wtid 0 only; zeroed after that warpgroup's prologue S.
__device__ __forceinline__ unsigned long long* s_issue_ns() {
  __shared__ unsigned long long ns[4];
  return ns;
}
#endif
// issue() (an S issue of the tile loop: its chunks' full-barrier waits, then its wgmma issues), timed into
// s_issue_ns()[slot] in the timeline build: the reloads' exposed latency plus the issues themselves.
template <class F>
__device__ __forceinline__ void timed_s_issue(int slot, F&& issue) {
#ifdef KDENGINE_TIMELINE
  long long t0, t1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0)::"memory");
  issue();
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1)::"memory");
  if (threadIdx.x % 128 == 0) s_issue_ns()[slot] += static_cast<unsigned long long>(t1 - t0);
#else
  (void)slot;
  issue();
#endif
}

// Q's rope chunk (64 rows x 64 dims, 128-byte swizzled) as the A fragments of its 4 k-steps: the inverse
// of store_p.
__device__ __forceinline__ void load_q8(const unsigned char* q_tile, const Rows& rows, uint32_t (&q8)[4][4]) {
  const int q = threadIdx.x % 4;
  const unsigned char* src = q_tile + P_CHUNK * CHUNK_BYTES;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = rows.local[i & 1], unit = 2 * kk + (i >> 1);
      q8[kk][i] = *reinterpret_cast<const uint32_t*>(src + r * 128 + ((unit ^ (r & 7)) << 4) + 4 * q);
    }
}

// --- the kernel -------------------------------------------------------------------------------------

// The kernel's body; the two wrappers below launch it (launch bounds, or SEESAW2's register cap). The maps
// are the kernel's __grid_constant__ parameters (TMA reads them at their parameter address).
template <int SCHEDULE>
__device__ __forceinline__ void verify_sm90_body(const VerifyParams& p, const CUtensorMap& kv_map,
                                                 const CUtensorMap& q_map) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if (is_seesaw2(SCHEDULE) && threadIdx.x == 0) timeline::timeline_mark(timeline::SPLIT_ENTRY);
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  unsigned char* sm = smem_raw + (((raw + 1023) & ~1023u) - raw);  // 1024-byte aligned (swizzle atoms)
  const uint32_t base = smem_u32(sm);
  const uint32_t q_s = base + Q_OFF, kv_s = base + KV_OFF;
  // full[stage][group] at full_bar + 8 (NGROUP stage + group); empty[stage]; q; PAIR's empty[stage][group]
  const uint32_t full_bar = base + BAR_OFF, empty_bar = full_bar + 8 * STAGES * NGROUP;
  // SEESAW2: full[stage][chunk] at full_bar + 8 (NCHUNK stage + chunk), then q
  const uint32_t q_bar = is_seesaw2(SCHEDULE) ? full_bar + 8 * STAGES * NCHUNK : empty_bar + 8 * STAGES;
  const uint32_t pair_empty = q_bar + 8;
  float* m_tab = reinterpret_cast<float*>(sm + (is_seesaw2(SCHEDULE) ? S2_STATE_OFF : STATE_OFF));  // [2][BM]
  float* l_tab = m_tab + 2 * BM;
  float* sc_tab = l_tab + 2 * BM;

  const int b = blockIdx.z, split = blockIdx.y, row0 = blockIdx.x * BM;
  const int tid = threadIdx.x, wg = tid / 128, wtid = tid % 128;
  const int prefix = p.prefix_len[b];
  const int L = prefix + p.T;
  int chunk = (L + p.nsplit - 1) / p.nsplit;
  chunk = (chunk + BN - 1) / BN * BN;
  const int start = split * chunk, end = min(L, start + chunk);
  const size_t part_row0 = ((size_t)b * p.nsplit + split) * p.R;
  if (start >= end) {  // an empty split: weight 0 in the merge
    for (int r = tid; r < BM; r += THREADS)
      if (row0 + r < p.R) p.part_lse[part_row0 + row0 + r] = -INFINITY;
    if (tid == 0) timeline::timeline_mark(timeline::SPLIT_END);  // (-DKDENGINE_TIMELINE only; no start record)
    return;
  }
  const int ntiles = (end - start + BN - 1) / BN;

  const bool producer = wg == CONSUMERS && wtid == 0;
  if constexpr (is_seesaw2(SCHEDULE)) {
    if (tid == 0) {
      for (int i = 0; i < STAGES * NCHUNK; ++i) mbar_init(full_bar + 8 * i, 1);
      mbar_init(q_bar, 1);
      for (int i = 0; i < S2_HANDOFFS; ++i)  // every thread of the writing warpgroup; of both for the row sums
        mbar_init(q_bar + 8 * (1 + i), i < 4 ? 128 : 256);
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
  } else if (producer) {
    for (int s = 0; s < STAGES; ++s) {
      for (int g = 0; g < NGROUP; ++g) mbar_init(full_bar + 8 * (NGROUP * s + g), 1);
      mbar_init(empty_bar + 8 * s, 4 * CONSUMERS);  // one arrival per consumer warp
      for (int g = 0; g < NGROUP; ++g) mbar_init(pair_empty + 8 * (NGROUP * s + g), 4 * CONSUMERS);
    }
    mbar_init(q_bar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (tid == 0) timeline::timeline_mark(timeline::SPLIT_START);
  // p.merge_early: the merge may launch now (it waits for this grid to complete before any read); else below
  if (p.merge_early) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");

  if (!is_seesaw2(SCHEDULE) && wg == CONSUMERS) {
    // --- producer: Q (rows of the flattened [B * R, 576] q; past R: the next sequence's rows or the
    // zero fill past B * R, never written out), then the split's KV tiles ---
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PRODUCER_REGS));
    const int* pages = p.page_table + (size_t)b * p.max_pages;
    if constexpr (SCHEDULE == PAIR) {  // lane 0 of warp g streams chunk group g: each group reloads once freed
      const int g = wtid / 32;
      if (wtid % 32 != 0 || g >= NGROUP) return;
      if (g == 0) {
        mbar_expect_tx(q_bar, TILE_BYTES);
        for (int k = 0; k < NCHUNK; ++k) tma_load(q_s + k * CHUNK_BYTES, &q_map, k * SW, b * p.R + row0, q_bar);
      }
      for (int t = 0; t < ntiles; ++t) {
        const int stage = t & 1;
        if (t >= STAGES) mbar_wait(pair_empty + 8 * (NGROUP * stage + g), ((t >> 1) + 1) & 1);
        load_group(p, &kv_map, pages, start + t * BN, end, kv_s + stage * TILE_BYTES, pair_group(g), pair_group(g + 1),
                   full_bar + 8 * (NGROUP * stage + g));
      }
      return;
    }
    if (!producer) return;
    mbar_expect_tx(q_bar, TILE_BYTES);
#pragma unroll
    for (int k = 0; k < NCHUNK; ++k) tma_load(q_s + k * CHUNK_BYTES, &q_map, k * SW, b * p.R + row0, q_bar);
    for (int t = 0; t < ntiles; ++t) {
      const int stage = t & 1;
      if (t >= STAGES) {
        if constexpr (SCHEDULE == STAGGERED_SMALL)
          mbar_wait_suspend(empty_bar + 8 * stage, ((t >> 1) + 1) & 1);
        else
          mbar_wait(empty_bar + 8 * stage, ((t >> 1) + 1) & 1);
      }
#pragma unroll
      for (int g = 0; g < NGROUP; ++g)
        load_group(p, &kv_map, pages, start + t * BN, end, kv_s + stage * TILE_BYTES, g * GROUP_CHUNKS,
                   (g + 1) * GROUP_CHUNKS, full_bar + 8 * (NGROUP * stage + g));
    }
    return;
  }

  // --- consumers ---
  if constexpr (!is_seesaw2(SCHEDULE)) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGS));
  if constexpr (is_seesaw2(SCHEDULE)) {  // Q, all of tile 0, tile 1 (its chunks 4-8 first: the order of its S)
    if (tid == 0) {
      const int* pages = p.page_table + (size_t)b * p.max_pages;
      mbar_expect_tx(q_bar, TILE_BYTES);
      for (int k = 0; k < NCHUNK; ++k) tma_load(q_s + k * CHUNK_BYTES, &q_map, k * SW, b * p.R + row0, q_bar);
      timeline::timeline_mark(timeline::SPLIT_Q_ISSUED);
      const int r0 = tile_row(p, pages, start);
      timeline::timeline_mark_after(timeline::SPLIT_ROW0, r0);
      load_chunks(p, &kv_map, pages, start, r0, end, kv_s, 0, NCHUNK, full_bar);
      timeline::timeline_mark(timeline::SPLIT_T0_ISSUED);
      if (ntiles > 1) {
        const int row1 = tile_row(p, pages, start + BN);
        load_chunks(p, &kv_map, pages, start + BN, row1, end, kv_s + TILE_BYTES, 4, NCHUNK, full_bar + 8 * NCHUNK);
        load_chunks(p, &kv_map, pages, start + BN, row1, end, kv_s + TILE_BYTES, 0, 4, full_bar + 8 * NCHUNK);
      }
      timeline::timeline_mark(timeline::SPLIT_ISSUED);  // (-DKDENGINE_TIMELINE only, as every mark)
    }
  }
  const int w = wg;
  mbar_wait(q_bar, 0);
  if (is_seesaw2(SCHEDULE) && tid == 0) timeline::timeline_mark(timeline::SPLIT_Q_READY);
  const Rows rows = make_rows(p, b, row0, wtid);
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, scale[2];
  float s[32];
  uint32_t pa[4][4];

  if constexpr (SCHEDULE == BOTH || SCHEDULE == STAGGERED || SCHEDULE == STAGGERED_SMALL ||
                SCHEDULE == STAGGERED_TAIL) {
    constexpr bool SMALL = SCHEDULE == STAGGERED_SMALL, STAG = SCHEDULE != BOTH;
    constexpr int TAIL = SMALL ? TAIL_BITS : SCHEDULE == STAGGERED_TAIL ? TAIL_ROLLED : TAIL_LOADS;
    if (STAG && w == 1) bar_arrive(BAR_SCHED, 128 * CONSUMERS);  // warpgroup 0 goes first
    for (int t = 0; t < ntiles; ++t) {
      const int stage = t & 1, tile_start = start + t * BN;
      const uint32_t tile = kv_s + stage * TILE_BYTES;
      const uint32_t fb = full_bar + 8 * NGROUP * stage;
      if (tile_start + BN > end) {
        wait_tile(fb, (t >> 1) & 1);
        zero_rows(sm + KV_OFF + stage * TILE_BYTES, end - tile_start, tid, 128 * CONSUMERS);
        bar_sync(BAR_CONSUMERS, 128 * CONSUMERS);
      }
      if (STAG) bar_sync(BAR_SCHED + w, 128 * CONSUMERS);
#pragma unroll
      for (int i = 0; i < 32; ++i) s[i] = 0.f;
      issue_qk(s, q_s, tile, fb, (t >> 1) & 1);
      if (STAG) bar_arrive(BAR_SCHED + 1 - w, 128 * CONSUMERS);
      uint32_t bits = 0;  // SMALL: a tail tile's mask, its loads in flight under S
      if (SMALL && tile_start + BN > prefix) bits = tail_bits(p, rows, tile_start, prefix, end);
      if (t > 0) {
        wgmma_wait<1>();  // P V of tile t - 1 done: its stage is free for this warp
        release(empty_bar + 8 * (stage ^ 1));
      }
      wgmma_wait<0>();
      reg_fence(s);
      reg_fence(o);
      softmax_tile<TAIL, SMALL>(p, rows, s, tile_start, prefix, end, m, l, scale, pa, bits);
      rescale(o, scale);
      reg_fence(o);
      issue_pv_rs(o, pa, tile, w);
    }
    wgmma_wait<0>();
    reg_fence(o);
    if (STAG && w == 0) bar_sync(BAR_SCHED, 128 * CONSUMERS);  // warpgroup 1's last arrival
  } else if constexpr (SCHEDULE == SEESAW) {
    const int last = ntiles - 1;
    for (int t = w; t < ntiles; t += 2) {  // the tiles this warpgroup owns
      const int stage = t & 1, tile_start = start + t * BN;
      const uint32_t tile = kv_s + stage * TILE_BYTES;
      unsigned char* tile_ptr = sm + KV_OFF + stage * TILE_BYTES;
      const uint32_t fb = full_bar + 8 * NGROUP * stage;
      if (tile_start + BN > end) {
        wait_tile(fb, (t >> 1) & 1);
        zero_rows(tile_ptr, end - tile_start, wtid, 128);
        bar_sync(BAR_WG + w, 128);
      }
#pragma unroll
      for (int i = 0; i < 32; ++i) s[i] = 0.f;
      issue_qk(s, q_s, tile, fb, (t >> 1) & 1);
      if (t >= 1) {  // the other warpgroup's tile t - 1: its P from shared memory
        const int slot = (t - 1) & 1;
        bar_sync(BAR_P + slot, 128 * CONSUMERS);
        float sc[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          sc[h] = sc_tab[slot * BM + rows.local[h]];
          m[h] = m_tab[slot * BM + rows.local[h]];
          l[h] = l_tab[slot * BM + rows.local[h]];
        }
        wait_tile(full_bar + 8 * NGROUP * slot, ((t - 1) >> 1) & 1);  // (complete: the owner saw it)
        reg_fence(o);
        rescale(o, sc);
        reg_fence(o);
        issue_pv_ss(o, kv_s + slot * TILE_BYTES, w);
      }
      // S of tile t and P V of tile t - 1 done. (wait_group 1 would let P V run on under the softmax,
      // but ptxas then serializes every wgmma of the kernel: C7514.)
      wgmma_wait<0>();
      reg_fence(s);
      bar_sync(BAR_WG + w, 128);  // every warp's S read the rope chunk before P overwrites it
      softmax_tile(p, rows, s, tile_start, prefix, end, m, l, scale, pa);
      store_p(tile_ptr, rows, pa);
      if (wtid % 4 == 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          m_tab[stage * BM + rows.local[h]] = m[h];
          l_tab[stage * BM + rows.local[h]] = l[h];
          sc_tab[stage * BM + rows.local[h]] = scale[h];
        }
      }
      fence_async_smem();
      bar_arrive(BAR_P + stage, 128 * CONSUMERS);
      if (t >= 1) release(empty_bar + 8 * (stage ^ 1));
      reg_fence(o);
      rescale(o, scale);
      reg_fence(o);
      issue_pv_rs(o, pa, tile, w);
      wgmma_wait<0>();
      reg_fence(o);
      release(empty_bar + 8 * stage);
    }
    if ((last & 1) != w) {  // the other warpgroup owns the last tile
      const int slot = last & 1;
      bar_sync(BAR_P + slot, 128 * CONSUMERS);
      float sc[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        sc[h] = sc_tab[slot * BM + rows.local[h]];
        m[h] = m_tab[slot * BM + rows.local[h]];
        l[h] = l_tab[slot * BM + rows.local[h]];
      }
      wait_tile(full_bar + 8 * NGROUP * slot, (last >> 1) & 1);
      reg_fence(o);
      rescale(o, sc);
      reg_fence(o);
      issue_pv_ss(o, kv_s + slot * TILE_BYTES, w);
      wgmma_wait<0>();
      reg_fence(o);
    }
  } else if constexpr (is_seesaw2(SCHEDULE)) {
    // SEESAW2 (FlashMLA's order in our layout): per step i, warpgroup 0 owns the even tile a = 2i (stage
    // 0), warpgroup 1 the odd tile b = 2i + 1 (stage 1); each computes S of its tile only. The step starts
    // with both S complete. Warpgroup 0: softmax of a (running max m -> m', lazy), m' published (bar 11),
    // P_a V_aL issued and waited, stage 0's chunks 0-3 (read only by it) reloaded with tile a + 2; then the
    // step's max m'' (bar 12), P_a relative to m'' over stage 0's rope chunk (bar 13), O rescaled, P_b V_bL
    // from Q's rope chunk (bar 14) issued, S of tile a + 2 on chunks 0-3 issued, P_b V_bL waited, stage
    // 1's chunks 0-3 reloaded with tile b + 2, S on chunks 4-8 issued, all waited. Warpgroup 1: the row
    // max of b (before it waits), m' (bar 11) -> m'' (published, bar 12), P_b over Q's rope chunk (bar 14),
    // P_b V_bR from registers, P_a V_aR from shared memory (bar 13), reloads stage 1's chunks 4-8 (b + 2)
    // once P_b V_bR is done and stage 0's chunks 4-8 (a + 2) once P_a V_aR is done, then S of tile b + 2
    // (chunks 4-8, then 0-3), waited. Q's rope chunk lives in registers (q8) for both S, so its shared
    // memory holds P_b. Every chunk has its own full barrier; no empty barriers, no producer warpgroup.
    // The running max moves lazily (STAGGERED_SMALL's rule); both warpgroups hold the same m.
    // Every k-step's S and P V descriptor as a 32-bit add on the low word beside the constant high word
    // (desc_at; FlashMLA's SASS form): 0.5-1.0% faster at 65k T=64 than 64-bit adds, 168 fewer uniform adds
    // (perf_history/kernel/d32_905c234/).
    constexpr bool D32 = true;
    const int* pages = p.page_table + (size_t)b * p.max_pages;
    // The loaders of a warpgroup's stage-0 and stage-1 reloads, in two warps: with both on thread 0 its warp stepped
    // through both TMA issues and both page lookups alone (0.6-0.8% slower at 65k T=64: perf_history/kernel/la_ab24c16/).
    const bool loader = wtid == 0, loader_b = wtid == 32;
    // The visibility bits of the split's first two tail tiles (tfirst: the tile holding `prefix`; a split without
    // tree tokens has none), found with tail_bits before the first S: their loads land under the prologue's waits, and
    // those tiles' masks take no load in the loop (a later tail tile, T > ~64, takes the rolled loop). With the
    // rolled loop on every tail tile the last split was the slowest block in 22 of 24 replays of the timeline at 65k
    // (1.1-3.2 us past the median split, the L2 flushed or warm); found ahead, it is not, and the call is 0.6-2.8 us
    // faster at all six sizes (perf_history/kernel/tb2_de9b6f0/).
    const int tfirst = end > prefix ? max(prefix - start, 0) / BN : ntiles;
    const uint32_t tb0 = tfirst < ntiles ? tail_bits(p, rows, start + tfirst * BN, prefix, end) : 0u;
    const uint32_t tb1 = tfirst + 1 < ntiles ? tail_bits(p, rows, start + (tfirst + 1) * BN, prefix, end) : 0u;
    auto pre_has = [&](int t) { return t == tfirst || t == tfirst + 1; };
    auto pre_bits = [&](int t) { return t == tfirst ? tb0 : tb1; };
    uint32_t q8[4][4];
    load_q8(sm + Q_OFF, rows, q8);
    const uint64_t qd = make_desc(q_s, 16, 1024);
    const uint32_t stage0 = kv_s, stage1 = kv_s + TILE_BYTES;
    const uint64_t kd0 = make_desc(stage0, 16, 1024), kd1 = make_desc(stage1, 16, 1024);
    const uint32_t fb0 = full_bar, fb1 = full_bar + 8 * NCHUNK;
    // The four one-way hand-offs between the warpgroups, once per step i (k = 0: m', 1: m'', 2: P_a, 3: P_b).
    // SEESAW2: on mbarriers (every thread of the writing warpgroup arrives, with release semantics; the
    // readers wait on the step's parity, with acquire). SEESAW2_BAR: on named barriers 11-14 (the writers
    // bar.arrive, the readers bar.sync), the same order for the hardware, but compute-sanitizer racecheck
    // does not model bar.arrive and reports the tables handed through them (perf_history/kernel/s2race_6a95ae1/).
    // A side cannot arrive twice before the other has waited: each one's next arrival on k follows its wait
    // on a hand-off that the other side signals after its wait on k.
    const uint32_t handoff_bar = q_bar + 8;
    auto handoff_signal = [&](int k) {
      if constexpr (SCHEDULE != SEESAW2_BAR) mbar_arrive(handoff_bar + 8 * k);
      else bar_arrive(BAR_S2_MAX0 + k, 128 * CONSUMERS);
    };
    auto handoff_wait = [&](int k, int step) {
      if constexpr (SCHEDULE != SEESAW2_BAR) mbar_wait(handoff_bar + 8 * k, step & 1);
      else bar_sync(BAR_S2_MAX0 + k, 128 * CONSUMERS);
    };
    float* mid_tab = m_tab;  // [step parity][BM]: m' (warpgroup 0's running max after tile a)
    float* max_tab = l_tab;  // [step parity][BM]: m'' (the step's running max, warpgroup 1)
    const int steps = (ntiles + 1) / 2;
    // The pool rows of the loads of step i (tiles ta + 2, ta + 3), looked up by each warpgroup's loaders (row_a2 by
    // loader, row_b2 by loader_b) at the end of step i - 1 (after its S issue, under the S wait; t = ta + 2 of step i)
    // and at the first S.
    int row_a2 = 0, row_b2 = 0;
    auto look_ahead = [&](int t) {
      if (loader) row_a2 = t < ntiles ? tile_row(p, pages, start + t * BN) : 0;
      if (loader_b) row_b2 = t + 1 < ntiles ? tile_row(p, pages, start + (t + 1) * BN) : 0;
    };
    auto zero_tail = [&](int t, int st, uint32_t fb) {  // rows past `end` of tile t (stage st), this warpgroup
      const int tile_start = start + t * BN;
      if (tile_start + BN > end) {
        for (int c = 0; c < NCHUNK; ++c) mbar_wait(fb + 8 * c, (t >> 1) & 1);
        zero_rows(sm + KV_OFF + st * TILE_BYTES, end - tile_start, wtid, 128);
        bar_sync(BAR_WG + w, 128);
      }
    };
    if (w == 0) {
      zero_tail(0, 0, fb0);
      issue_qk_chunks<0, NCHUNK, true>(s, qd, kd0, q8, fb0, 0);
      wgmma_commit();
      look_ahead(2);
      if constexpr (SCHEDULE == SEESAW2_EL) {  // tile 0 has landed: tiles 2 and 3 into L2, from row tile 0's block
        if (blockIdx.x == 0 && p.page_size >= BN) {
          if (loader && ntiles > 2)
            for (int k = 0; k < NCHUNK; ++k) tma_prefetch(&kv_map, k * SW, row_a2);
          if (loader_b && ntiles > 3)
            for (int k = 0; k < NCHUNK; ++k) tma_prefetch(&kv_map, k * SW, row_b2);
        }
      }
      wgmma_wait<0>();
      reg_fence(s);
#ifdef KDENGINE_TIMELINE  // the first S complete (the timer read depends on its result), recorded at the end
      if (tid == 0) timeline::timeline_keep(sm + BAR_OFF + T_STEP_OFF + 16, __float_as_int(s[0]));
      if (wtid == 0)
        for (int k = 0; k < 2; ++k) s_issue_ns()[k] = 0;  // the loop's issues only
#endif
      for (int i = 0; i < steps; ++i) {
        const int ta = 2 * i, slot = (i & 1) * BM;
        const bool has_b = ta + 1 < ntiles, next_a = ta + 2 < ntiles, next_b = ta + 3 < ntiles;
        float mx[2], m_use[2], sc[2], sum[2];
#ifdef KDENGINE_TIMELINE  // the step marks: thread 0 keeps the times in shared memory (T_STEP_OFF), recorded at the end
        if (tid == 0 && i == 1) timeline::timeline_keep(sm + BAR_OFF + T_STEP_OFF, i);
        if (tid == 0 && i == steps - 1) timeline::timeline_keep(sm + BAR_OFF + T_STEP_OFF + 8, i);
#endif
        mask_rowmax<32, TAIL_ROLLED, true>(p, rows, s, start + ta * BN, prefix, end, mx, pre_bits(ta), pre_has(ta));
        move_max<true>(m, mx, m_use, sc);
        if (wtid % 4 == 0)
#pragma unroll
          for (int h = 0; h < 2; ++h) mid_tab[slot + rows.local[h]] = m[h];
        handoff_signal(0);
        exp_rows_raw<32>(s, p.scale_log2, m_use, sum);
#pragma unroll
        for (int h = 0; h < 2; ++h) l[h] = l[h] * sc[h] + sum[h];
        reg_fence(o);
        rescale(o, sc);
        reg_fence(o);
        pack_p(s, pa);
        issue_pv_rs<BN / 16, D32>(o, pa, stage0, 0);  // O_L += P_a V_aL
        auto reload_a = [&]() {  // P_a V_aL done: stage 0's chunks 0-3 are free
          wgmma_wait<0>();
          reg_fence(o);
          if (next_a && loader) load_chunks(p, &kv_map, pages, start + (ta + 2) * BN, row_a2, end, stage0, 0, 4, fb0);
        };
        reload_a();
        handoff_wait(1, i);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float m2 = max_tab[slot + rows.local[h]];
          sc[h] = m2 != m[h] ? exp2f(m[h] - finite_max(m2)) : 1.f;
          m[h] = m2;
          l[h] *= sc[h];
        }
        if (__any_sync(0xffffffff, sc[0] != 1.f || sc[1] != 1.f)) {  // (rare: the max moved in tile b)
#pragma unroll
          for (int kk = 0; kk < 4; ++kk)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              pa[kk][e] = pack_bf16(s[8 * kk + 2 * e] * sc[e & 1], s[8 * kk + 2 * e + 1] * sc[e & 1]);
        }
        store_p_stsm(base + KV_OFF, wtid, pa);  // P_a relative to m'', over stage 0's rope chunk (S of a read it)
        fence_async_smem();
        handoff_signal(2);
        reg_fence(o);
        rescale(o, sc);
        reg_fence(o);
        if (has_b) {
          handoff_wait(3, i);
          issue_pv_ss_from<BN / 16, D32>(o, q_s, stage1, 0);  // O_L += P_b V_bL
        }
        if (next_a) {  // (then has_b too)
          zero_tail(ta + 2, 0, fb0);
          timed_s_issue(0, [&] { issue_qk_chunks<0, 4, true>(s, qd, kd0, q8, fb0, (i + 1) & 1); });
          wgmma_commit();
          wgmma_wait<1>();  // P_b V_bL done: stage 1's chunks 0-3 are free
          reg_fence(o);
          if (next_b && loader_b) load_chunks(p, &kv_map, pages, start + (ta + 3) * BN, row_b2, end, stage1, 0, 4, fb1);
          timed_s_issue(1, [&] { issue_qk_chunks<4, NCHUNK, false>(s, qd, kd0, q8, fb0, (i + 1) & 1); });
          wgmma_commit();
          look_ahead(ta + 4);
        }
        wgmma_wait<0>();
        reg_fence(s);
        reg_fence(o);
      }
    } else {
      if (ntiles > 1) {
        zero_tail(1, 1, fb1);
        issue_qk_chunks<4, NCHUNK, true>(s, qd, kd1, q8, fb1, 0);
        issue_qk_chunks<0, 4, false>(s, qd, kd1, q8, fb1, 0);
        wgmma_commit();
        look_ahead(2);
        wgmma_wait<0>();
        reg_fence(s);
        if (wtid == 0) timeline::timeline_mark_after(timeline::SPLIT_S1, __float_as_int(s[0]));
#ifdef KDENGINE_TIMELINE
        if (wtid == 0)
          for (int k = 2; k < 4; ++k) s_issue_ns()[k] = 0;  // the loop's issues only
#endif
      }
      for (int i = 0; i < steps; ++i) {
        const int ta = 2 * i, tb = ta + 1, slot = (i & 1) * BM;
        const bool has_b = tb < ntiles, next_a = ta + 2 < ntiles, next_b = tb + 2 < ntiles;
        float mx[2] = {-INFINITY, -INFINITY}, m_use[2], sc[2], sc0[2], sum[2] = {0.f, 0.f};
        if (has_b)
          mask_rowmax<32, TAIL_ROLLED, true>(p, rows, s, start + tb * BN, prefix, end, mx, pre_bits(tb), pre_has(tb));
        handoff_wait(0, i);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float m1 = mid_tab[slot + rows.local[h]];
          sc0[h] = m1 != m[h] ? exp2f(m[h] - finite_max(m1)) : 1.f;
          m[h] = m1;
        }
        move_max<true>(m, mx, m_use, sc);
        if (wtid % 4 == 0)
#pragma unroll
          for (int h = 0; h < 2; ++h) max_tab[slot + rows.local[h]] = m[h];
        handoff_signal(1);
        if (has_b) {
          exp_rows_raw<32>(s, p.scale_log2, m_use, sum);
          pack_p(s, pa);
          store_p_stsm(base + Q_OFF, wtid, pa);  // over Q's rope chunk (held in registers)
          fence_async_smem();
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          sc[h] *= sc0[h];
          l[h] = l[h] * sc[h] + sum[h];
        }
        reg_fence(o);
        rescale(o, sc);
        reg_fence(o);
        auto reload_a = [&]() {  // P_a V_aR done: stage 0's chunks 4-8 are free
          if (next_a && loader) load_chunks(p, &kv_map, pages, start + (ta + 2) * BN, row_a2, end, stage0, 4, NCHUNK, fb0);
        };
        auto reload_b = [&]() {  // P_b V_bR done: stage 1's chunks 4-8 are free
          if (next_b && loader_b) load_chunks(p, &kv_map, pages, start + (tb + 2) * BN, row_b2, end, stage1, 4, NCHUNK, fb1);
        };
        if (has_b) issue_pv_rs<BN / 16, D32>(o, pa, stage1, 1);  // O_R += P_b V_bR
        handoff_wait(2, i);
        issue_pv_ss<BN / 16, D32>(o, stage0, 1);  // O_R += P_a V_aR
        if (has_b) handoff_signal(3);  // (after both P V of this side are issued: FlashMLA's order)
        if (has_b) {
          wgmma_wait<1>();
          reload_b();
        }
        wgmma_wait<0>();
        reg_fence(o);
        reload_a();
        if (next_b) {
          zero_tail(tb + 2, 1, fb1);
          timed_s_issue(2, [&] { issue_qk_chunks<4, NCHUNK, true>(s, qd, kd1, q8, fb1, (i + 1) & 1); });
          timed_s_issue(3, [&] { issue_qk_chunks<0, 4, false>(s, qd, kd1, q8, fb1, (i + 1) & 1); });
          wgmma_commit();
          look_ahead(ta + 4);
          wgmma_wait<0>();
          reg_fence(s);
        }
      }
    }
    wgmma_wait<0>();
    reg_fence(o);
    add_row_sums(l, sc_tab, rows, w, wtid, SCHEDULE != SEESAW2_BAR ? handoff_bar + 8 * 4 : 0);
  } else if constexpr (SCHEDULE == HALF) {
    // HALF: warpgroup w computes S of tokens [32 w, 32 w + 32) of every tile (m64n32k16). Per tile: the
    // rows' max over its tokens into mx_tab[tile parity][w], both warpgroups meet (bar 8), each takes the
    // other's and moves the shared running max lazily (both compute the same m); P of its tokens (bf16)
    // goes over the tile's rope chunk (both S of the tile are complete after bar 8) and into P V from
    // registers, the other warpgroup's half from shared memory after bar 3. Issue order per tile t:
    // [P V(t), own tokens], bar 3, [P V(t), other tokens], then P V(t) waited and stage t freed before
    // [S(t + 1)] is issued, so the next load (tile t + 2) does not wait for tile t + 1 to land (freeing it
    // after the S(t + 1) issue instead measured the same: the probe half_v0 in ..._f59d68d.json).
    // Every hand-off between the warpgroups is a bar.sync of both (no bar.arrive); mx_tab is written for
    // tile t + 2 only after bar 8 of tile t + 1, which the reader of tile t passes after its read.
    float sh[16];
    uint32_t ph[2][4];
    float* mx_tab = m_tab;  // [tile parity][warpgroup][BM] (m_tab and l_tab)
    const uint32_t k_rows = w * HALF_N * 128;  // this warpgroup's token rows in each chunk of a tile
    auto issue_s = [&](int t) {  // S of tile t (its tail rows zeroed first: both warpgroups' P V read every row)
      const int stage = t & 1, tile_start = start + t * BN;
      const uint32_t fb = full_bar + 8 * NGROUP * stage;
      if (tile_start + BN > end) {
        wait_tile(fb, (t >> 1) & 1);
        zero_rows(sm + KV_OFF + stage * TILE_BYTES, end - tile_start, tid, 128 * CONSUMERS);
        bar_sync(BAR_CONSUMERS, 128 * CONSUMERS);
      }
#pragma unroll
      for (int i = 0; i < 16; ++i) sh[i] = 0.f;
      issue_qk(sh, q_s, kv_s + stage * TILE_BYTES + k_rows, fb, (t >> 1) & 1);
    };
    // The softmax of tile t (S(t) complete in sh), in two parts: the rows' max (exchanged) and the moved
    // running max (m_use, `scale`), then P(t) in sh (fp32) and l. The caller rescales O and packs P into
    // ph once no P V is in flight.
    float m_use[2];
    auto softmax_max = [&](int t) {
      const int stage = t & 1;
      float mx[2];
      mask_rowmax(p, rows, sh, start + t * BN + w * HALF_N, prefix, end, mx);
      if (wtid % 4 == 0)
#pragma unroll
        for (int h = 0; h < 2; ++h) mx_tab[(2 * stage + w) * BM + rows.local[h]] = mx[h];
      bar_sync(BAR_MAX, 128 * CONSUMERS);  // (also: both S of tile t are complete, its rope chunk is free)
#pragma unroll
      for (int h = 0; h < 2; ++h) mx[h] = fmaxf(mx[h], mx_tab[(2 * stage + 1 - w) * BM + rows.local[h]]);
      move_max<true>(m, mx, m_use, scale);
    };
    auto softmax_exp = [&]() {
      float sum[2];
      exp_rows(sh, m_use, sum);
#pragma unroll
      for (int h = 0; h < 2; ++h) l[h] = l[h] * scale[h] + sum[h];  // this warpgroup's tokens only
    };
    auto rescale_o = [&]() {
      reg_fence(o);
      rescale(o, scale);
      reg_fence(o);
    };
    auto issue_pv = [&](int t) {
      const int stage = t & 1;
      const uint32_t tile = kv_s + stage * TILE_BYTES;
      store_p_half(sm + KV_OFF + stage * TILE_BYTES, rows, ph, w);
      fence_async_smem();
      issue_pv_rs(o, ph, tile, w, 2 * w);
      bar_sync(BAR_P, 128 * CONSUMERS);
      issue_pv_ss<2>(o, tile, w, 2 * (1 - w));
    };
    // Nothing is in flight across the loop's back edge or out of the loop: the last tile's P V is issued
    // after it (a `break` with P V in flight made ptxas serialize every wgmma: C7514).
    issue_s(0);
    wgmma_wait<0>();
    reg_fence(sh);
    softmax_max(0);
    softmax_exp();  // (O is still 0: no rescale)
    pack_p(sh, ph);
    for (int t = 0; t + 1 < ntiles; ++t) {
      const int stage = t & 1;
      issue_pv(t);
      wgmma_wait<0>();  // P V of tile t done: stage t is free for this warp
      reg_fence(o);
      release(empty_bar + 8 * stage);
      issue_s(t + 1);
      wgmma_wait<0>();
      reg_fence(sh);
      softmax_max(t + 1);
      softmax_exp();
      rescale_o();
      pack_p(sh, ph);
    }
    issue_pv(ntiles - 1);
    wgmma_wait<0>();
    reg_fence(o);
    add_row_sums(l, sc_tab, rows, w, wtid);
  } else {
    // PAIR: tiles 2i (stage 0, warpgroup 0 computes S) and 2i + 1 (stage 1, warpgroup 1) per step i.
    // Row state: both warpgroups hold the same running max m; each its own part of the row sum (the
    // P it computed), added up at the end. Per step, with mp0 = max(m, rowmax S_a) and
    // mp1 = max(mp0, rowmax S_b):  O_L = (O_L e^(m-mp0) + P_a V_aL) e^(mp0-mp1) + P_b V_bL,
    // O_R = O_R e^(m-mp1) + (P_a e^(mp0-mp1)) V_aR + P_b V_bR. Only the row maxima cross between the
    // warpgroups before the P V issue (bar 8, 9); each P goes through its tile's rope chunk (bar 3, 4).
    float* mp0_tab = m_tab;  // [step parity][BM]
    float* mp1_tab = l_tab;  // [step parity][BM]
    const int steps = (ntiles + 1) / 2;
    const uint32_t stage0 = kv_s, stage1 = kv_s + TILE_BYTES;
    auto free_group = [&](int stage, int g) { release(pair_empty + 8 * (NGROUP * stage + g)); };
    if (w == 0) {
      for (int i = 0; i < steps; ++i) {
        const int tile_start = start + 2 * i * BN, slot = (i & 1) * BM;
        const bool has_b = 2 * i + 1 < ntiles;
        if (i > 0) {  // P_b V_bL of the previous step done: stage 1 is free on this side (before S waits on stage 0)
          wgmma_wait<0>();
          reg_fence(o);
          for (int g = 0; g < NGROUP; ++g) free_group(1, g);
        }
        if (tile_start + BN > end) {
          wait_tile(full_bar, i & 1);
          zero_rows(sm + KV_OFF, end - tile_start, wtid, 128);
          bar_sync(BAR_WG, 128);
        }
#pragma unroll
        for (int k = 0; k < 32; ++k) s[k] = 0.f;
        issue_qk_pair<false>(s, q_s, stage0, full_bar, i & 1);
        if (has_b) bar_arrive(BAR_ISSUE, 128 * CONSUMERS);  // warpgroup 1's S queues behind this one
        wgmma_wait<0>();
        reg_fence(s);
        reg_fence(o);
        float mx[2], mp0[2], m_use[2], sc[2], sum[2];
        mask_rowmax(p, rows, s, tile_start, prefix, end, mx);
#pragma unroll
        for (int h = 0; h < 2; ++h) mp0[h] = fmaxf(m[h], mx[h]);
        if (wtid % 4 == 0)
#pragma unroll
          for (int h = 0; h < 2; ++h) mp0_tab[slot + rows.local[h]] = mp0[h];
        bar_arrive(BAR_MAX, 128 * CONSUMERS);
        free_group(0, 1);  // S was this side's last use of warpgroup 1's V columns
#pragma unroll
        for (int h = 0; h < 2; ++h) m_use[h] = finite_max(mp0[h]), sc[h] = exp2f(m[h] - m_use[h]);
        exp_rows(s, m_use, sum);
#pragma unroll
        for (int h = 0; h < 2; ++h) l[h] = l[h] * sc[h] + sum[h];
        pack_p(s, pa);
        rescale(o, sc);
        reg_fence(o);
        issue_pv_rs(o, pa, stage0, 0);
        bar_sync(BAR_MAX + 1, 128 * CONSUMERS);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float mp1 = mp1_tab[slot + rows.local[h]];
          sc[h] = exp2f(mp0[h] - finite_max(mp1));
          m[h] = mp1;
        }
        store_p_scaled(sm + KV_OFF, rows, s, sc);  // P_a relative to mp1, for warpgroup 1
        fence_async_smem();
        bar_arrive(BAR_P, 128 * CONSUMERS);
        __syncwarp();
        free_group(0, 2);
        wgmma_wait<0>();
        reg_fence(o);
        free_group(0, 0);
        rescale(o, sc);
#pragma unroll
        for (int h = 0; h < 2; ++h) l[h] *= sc[h];
        reg_fence(o);
        if (has_b) {
          bar_sync(BAR_P + 1, 128 * CONSUMERS);
          wait_tile(full_bar + 8 * NGROUP, i & 1);  // (complete: warpgroup 1 saw it)
          issue_pv_ss(o, stage1, 0);
        }
      }
    } else {
      for (int i = 0; i < steps; ++i) {
        const int tile_start = start + (2 * i + 1) * BN, slot = (i & 1) * BM;
        const bool has_b = 2 * i + 1 < ntiles;
        float mx[2] = {-INFINITY, -INFINITY}, m_use[2], sc[2];
        if (has_b) {
          if (tile_start + BN > end) {
            wait_tile(full_bar + 8 * NGROUP, i & 1);
            zero_rows(sm + KV_OFF + TILE_BYTES, end - tile_start, wtid, 128);
            bar_sync(BAR_WG + 1, 128);
          }
#pragma unroll
          for (int k = 0; k < 32; ++k) s[k] = 0.f;
          bar_sync(BAR_ISSUE, 128 * CONSUMERS);
          issue_qk_pair<true>(s, q_s, stage1, full_bar + 8 * NGROUP, i & 1);
          wgmma_wait<0>();
          reg_fence(s);
          mask_rowmax(p, rows, s, tile_start, prefix, end, mx);
          free_group(1, 0);  // S was this side's last use of warpgroup 0's V columns
        }
        bar_sync(BAR_MAX, 128 * CONSUMERS);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float mp1 = fmaxf(mp0_tab[slot + rows.local[h]], mx[h]);
          m_use[h] = finite_max(mp1);
          sc[h] = exp2f(m[h] - m_use[h]);
          m[h] = mp1;
          l[h] *= sc[h];
        }
        if (wtid % 4 == 0)
#pragma unroll
          for (int h = 0; h < 2; ++h) mp1_tab[slot + rows.local[h]] = m[h];
        bar_sync(BAR_MAX + 1, 128 * CONSUMERS);  // (sync, not arrive: warpgroup 0 is normally there first)
        reg_fence(o);
        rescale(o, sc);
        reg_fence(o);
        bar_sync(BAR_P, 128 * CONSUMERS);
        wait_tile(full_bar, i & 1);  // (complete: warpgroup 0 saw it)
        issue_pv_ss(o, stage0, 1);
        free_group(0, 0);  // never read on this side
        if (has_b) {
          float sum[2];
          exp_rows(s, m_use, sum);
#pragma unroll
          for (int h = 0; h < 2; ++h) l[h] += sum[h];
          pack_p(s, pa);
          store_p(sm + KV_OFF + TILE_BYTES, rows, pa);
          fence_async_smem();
          bar_arrive(BAR_P + 1, 128 * CONSUMERS);
          __syncwarp();
          free_group(1, 2);
          issue_pv_rs(o, pa, stage1, 1);
          wgmma_wait<1>();
          free_group(0, 1);
          free_group(0, 2);
          wgmma_wait<0>();
          reg_fence(o);
          free_group(1, 1);
        } else {
          wgmma_wait<0>();
          reg_fence(o);
          free_group(0, 1);
          free_group(0, 2);
        }
      }
    }
    wgmma_wait<0>();
    reg_fence(o);
    add_row_sums(l, sc_tab, rows, w, wtid);
  }

  // Normalise and write this split's partial rows (bf16) and their lse (natural log). The merge may
  // launch now (programmatic dependent launch; it waits for this grid to complete before any read; with
  // p.merge_early it could since the start, and a second trigger changes nothing).
  if (tid == 0) timeline::timeline_mark(timeline::SPLIT_TRIGGER);
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  const int lane = tid % 32;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float inv = l[h] > 0.f ? 1.f / l[h] : 0.f;
    const size_t row = part_row0 + row0 + rows.local[h];  // rows.local[h] < R - row0 where valid
    __nv_bfloat16* dst = p.part_out + (rows.valid[h] ? row : part_row0) * DV + w * V_COLS;
#pragma unroll
    for (int j = 0; j < V_COLS / 8; j += 2)  // whole sectors (verify_partials.cuh)
      store_partial16<evict_last_partials(SCHEDULE)>(dst + 8 * j, lane % 4, rows.valid[h], o[4 * j + 2 * h] * inv,
                                              o[4 * j + 2 * h + 1] * inv, o[4 * j + 4 + 2 * h] * inv,
                                              o[4 * j + 4 + 2 * h + 1] * inv);
    if (rows.valid[h] && w == 0 && lane % 4 == 0)
      p.part_lse[row] = l[h] > 0.f ? (m[h] + log2f(l[h])) * 0.69314718056f : -INFINITY;
  }
  if (tid == 0) timeline::timeline_mark(timeline::SPLIT_END);
#ifdef KDENGINE_TIMELINE  // seesaw2's step marks (kept by thread 0 in the loop), once O is written; ntiles > 2: 2 steps
  if (is_seesaw2(SCHEDULE) && tid == 0 && ntiles > 2) {
    timeline::timeline_mark_at(timeline::SPLIT_STEP1, timeline::timeline_kept(sm + BAR_OFF + T_STEP_OFF));
    timeline::timeline_mark_at(timeline::SPLIT_LAST_STEP, timeline::timeline_kept(sm + BAR_OFF + T_STEP_OFF + 8));
  }
  if (is_seesaw2(SCHEDULE) && tid == 0) {
    timeline::timeline_mark_at(timeline::SPLIT_S0, timeline::timeline_kept(sm + BAR_OFF + T_STEP_OFF + 16));
    if (ntiles > 2)  // (a split of one step issues no S in its loop; with one tile warpgroup 1 zeroed nothing)
      for (int k = 0; k < 4; ++k) {
        const volatile unsigned long long* ns = s_issue_ns();
        timeline::timeline_mark_at(timeline::SPLIT_SISSUE0_A + k, static_cast<long long>(ns[k]));
      }
  }
#endif
#else
  __trap();  // built without sm_90a: the launcher never selects this kernel there
#endif
}

template <int SCHEDULE>
__global__ void __launch_bounds__(threads_of(SCHEDULE), 1)
    verify_sm90_kernel(const VerifyParams p, const __grid_constant__ CUtensorMap kv_map,
                       const __grid_constant__ CUtensorMap q_map) {
  verify_sm90_body<SCHEDULE>(p, kv_map, q_map);
}

// SEESAW2 runs capped at 240 registers (237 used, no spills) in place of its launch bounds' 255 (247 used): the same
// 6184 SASS instructions, allocated differently. On the H200 (two runs of two timing sets each) equal or faster at every
// size (4k T=16 within its spread): 65k T=64 112.2-112.7 against 112.8-113.6 us, the split kernel alone 109.2-109.4
// against 109.9, ncu 113.7-114.0 against 115.0-115.7 (perf_history/kernel/res_8ce7d1a/, res2_7053082/). Capped at 236 it was as fast or slower,
// at 232 (6200 instructions) 4% slower at 65k T=64. The cap also leaves room for a merge block (64 threads x 64
// registers) beside a running split block, but that did not shorten the merge (res_8ce7d1a/). __maxnreg__ and
// __launch_bounds__ cannot be combined, not even on a specialization, and the 384-thread schedules keep their launch
// bounds (under __maxnreg__(168) in their place ptxas gave three of them a 536-byte stack), hence a second wrapper.
__host__ __device__ constexpr int maxnreg_of(int schedule) {
  return schedule == SEESAW2 || schedule == SEESAW2_EL ? 240 : 0;
}
template <int SCHEDULE>
__global__ void __maxnreg__(maxnreg_of(SCHEDULE))
    verify_sm90_kernel_capped(const VerifyParams p, const __grid_constant__ CUtensorMap kv_map,
                              const __grid_constant__ CUtensorMap q_map) {
  verify_sm90_body<SCHEDULE>(p, kv_map, q_map);
}

// The kernel of a schedule.
template <int SCHEDULE>
constexpr auto kernel_of() {
  if constexpr (maxnreg_of(SCHEDULE) > 0)
    return verify_sm90_kernel_capped<SCHEDULE>;
  else
    return verify_sm90_kernel<SCHEDULE>;
}

}  // namespace sm90
}  // namespace kdengine
