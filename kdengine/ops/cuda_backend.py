"""Backend adapter for the CUDA C++ verify kernel in csrc/ (JIT-built on first use, see
kdengine.ops.build), registered as the torch custom op `kdengine::verify_cuda` with a fake
implementation so torch.compile and CUDA graphs see it.

    run(q, kv_cache, page_table, prefix_len, mask_bits, *, sm_scale, nsplit, return_lse)
      q [B, T, H, 576] bf16 -> out [B, T, H, 512] bf16, lse [B, T, H] fp32 (natural log) or None
"""

from __future__ import annotations

import torch

from kdengine import env
from kdengine.ops import build, shapes
from kdengine.ops.schedule import resolve_nsplit
from kdengine.ops.validate import check_scale

DV = shapes.DV
# Warps per 16-row group of the split kernel (csrc/verify_kernel.cuh): 2 (BN 32, 2 stages, 255
# registers) or 4 (BN 16, 3 stages, 128 registers, twice the warps per SM); 8 = the wide layout
# (csrc/verify_wide.cuh: 8 warps share all rows of the block, each K/V fragment feeds 2-4 m16 tiles;
# BN 16, 4 stages, at least 32 rows per block); 16 = "wide2", the wide layout with the streaming
# KV loader (fixed thread -> token map, page ids read a tile ahead) and lazy rescaling; 32 = "wide2x16",
# wide2 with 16 warps (4 per scheduler at 128 registers) and always 64 rows per block, with pingpong its
# row halves of 8 warps each in opposite phase orders ("wide2x16pp").
COL_WARPS = (2, 4, 8, 16, 32)
WIDE = 8
WIDE2 = 16
WIDE2X16 = 32
WIDE_LAYOUTS = (WIDE, WIDE2, WIDE2X16)
# Default: wide2 with ping-pong halves and the chunked merge, the fastest mma.sync layout at every
# benchmarked size on the H200 (perf_history/kernel/verify_kernel_gpu-nvidia-h200-sm90_f1344fe.json:
# 65k T=16 105.3 us against 125.6 for the wide layout, T=64 372.6 against 435.5; 4k-16k 8-16% faster).
# wide2x16 (32) with ping-pong halves was slower at all six sizes (65k T=16 114.2 against 101.7 us, T=64
# 417.2 against 368.2; without ping-pong 109.0 / 397.3: ..._mma2_gpu-nvidia-h200-sm90_2e1c440.json): twice
# the threads pay the per-thread softmax and address work at 128 registers (8.64 warp instructions per HMMA
# against 5.27).
DEFAULT_COL_WARPS = WIDE2
TILE_TOKENS = {2: 32, 4: 16, 8: 16, 16: 16, 32: 16}  # KV tokens per tile (BN) of each layout; a split is whole tiles
# Most 16-row groups per block (1, 2 or 4): 4 = 64 query rows per block (each KV tile read by fewer
# blocks), 2 = 32 rows (blocks small enough for two per SM on sm_90).
ROW_GROUPS = shapes.ROW_GROUPS
DEFAULT_ROW_GROUPS = 4
# Wide layouts only: the two row halves of a block run their softmax and P*V in opposite orders (each
# half's softmax overlaps the other half's tensor-core work; two P buffers, one barrier of half the block).
# 2 (wide2 only, "wide2pp2"): both halves run P*V of a tile in two column halves, one beside the next tile's
# Q*K^T and one beside its softmax (every phase between the barriers has tensor work). A bool is 0 / 1.
# Default 2: in one H200 run beside 1 and 1 again as an A/A control (perf_history/kernel/
# verify_kernel_mma2_gpu-nvidia-h200-sm90_4c2df52.json), 2 / 1 / 1 again, us: 65k T=64 363.6 / 370.0 / 367.5,
# 65k T=16 101.2 / 102.4 / 102.4, 16k T=64 102.7 / 103.5 / 103.6 (faster by more than the A/A spread), 16k
# T=16 37.1 / 37.3 / 37.3, 4k T=64 36.6 / 36.7 / 36.7, 4k T=16 20.2 / 20.1 / 20.2 (within it); its auto NSPLIT
# was the best fixed one or within 0.2% at all six sizes. A small step (<= 1.7%): see csrc/verify_wide.cuh.
# 3 (wide2 only, "wide2pp2_lean"): the schedule of 2 with less integer work per tile (32-bit shared addresses,
# the KV copy after Q*K^T, one "max moved" word instead of 8 alpha checks: csrc/verify_wide_lean.cuh).
# Default 3: in one H200 run beside 2 and 2 again as an A/A control (perf_history/kernel/
# verify_kernel_mma3_gpu-nvidia-h200-sm90_a987463.json), 3 / 2 / 2 again, us: 4k T=16 19.9 / 20.2 / 20.3, 4k T=64
# 34.2 / 36.6 / 36.6, 16k T=16 34.8 / 37.1 / 37.1, 16k T=64 93.2 / 102.8 / 102.8, 65k T=16 92.3 / 100.7 / 101.4,
# 65k T=64 324.8 / 363.9 / 362.8: faster by more than the A/A spread at all six sizes; ncu at 65k T=16 4.37
# executed warp instructions per HMMA against 5.29, tensor pipe 33.9% against 30.3%. Timed at 64 rows per block
# only: 32-row blocks (T*H <= 32, 128 registers) spill in both forms, more in the lean one (ptxas -v).
# 4-11 (wide2 only; probes of branch mma4, ci/gpu/mma4.sh, retired: ci/gpu/README.md): 4 = the lean form at 32-row blocks too (3 runs wide2pp2
# there); 5-11 = lean variants at 64-row blocks, wide2pp2 at 32-row blocks (WideCfg::LV bits of csrc/verify_wide.cuh:
# 1 Q*K^T's K fragments loaded per n8 tile a k-step ahead, 2 one branch on the tail tile, 4 the KV copy after the
# softmax's partial-score loads, 8 the row max's shuffles on demand, 16 exp2 as one ex2.approx.ftz): 5 = 1, 6 = 2,
# 7 = 4, 8 = all (the lean form's second version, "wide2pp2_lean2": the default up to branch mma6), 9 = 8 + 16, 10 = all but 1,
# 11 = all but 2.
# 12-15 (wide2 only; probes of branch mma6, ci/gpu/mma6.sh; 64-row blocks, wide2pp2 at 32): the previous default (8) plus
# WideCfg::LV bits of csrc/verify_wide_lean.cuh: 32 / 64 = the block's Q staged through shared memory by 16-byte
# cp.async and read by ldmatrix.x4 instead of 72 four-byte global loads per thread (lean_stage_q; 32: all 64 rows at
# once after KV tile 0's copy, tiles 1-2 after Q is in registers; 64: one row half at a time, the first before KV
# tiles 0-2, the second beside them), 128 = the page-table row pointer warp-uniform (KvStreamLean). 12 = 32, 13 = 64,
# 14 = 128, 15 = 32 + 128.
PINGPONGS = tuple(range(shapes.NUM_PINGPONGS))
SPLIT_PV_PINGPONGS = tuple(range(2, shapes.NUM_PINGPONGS))  # wide2 only
# 8 (the default from branch mma4 to mma6): the lean form with all five probe bits (LV 31). In one H200 run beside 3 (the
# previous default) and 3 again as an A/A control
# (perf_history/kernel/verify_kernel_mma4_gpu-nvidia-h200-sm90_896dc1b.json), 8 / 3 / 3 again, us: 4k T=16 19.4 /
# 20.1 / 20.1, 4k T=64 32.3 / 34.2 / 34.2, 16k T=16 32.6 / 34.8 / 34.8, 16k T=64 83.6 / 92.4 / 92.7, 65k T=16 81.9 /
# 91.1 / 90.7, 65k T=64 287.9 / 325.4 / 327.0: faster by more than the A/A spread at all six sizes (each bit alone,
# and the combinations 9-11, faster by less: the record's rows pp2leankx2 .. pp2leanv4k); ncu at 65k T=16 4.13
# executed warp instructions per HMMA against 4.37 (perf_history/kernel/mma4_896dc1b/). 32-row blocks (T * H <= 32)
# still run wide2pp2: the lean form there (4) / wide2pp2 / wide2pp2 again, us: 4k T=1 12.1 / 11.5 / 11.5, 4k T=2
# 12.8 / 12.2 / 12.2, 4k T=4 13.7 / 13.3 / 13.2, 16k T=1 19.1 / 18.9 / 18.8, 16k T=2 19.9 / 19.2 / 19.3, 16k T=4
# 21.1 / 20.5 / 20.5, 65k T=1 42.7 / 44.8 / 44.8, 65k T=2 43.8 / 45.2 / 45.3, 65k T=4 45.2 / 46.7 / 46.7 (faster at
# 65k, slower at 4k-16k).
# 12 (the default since branch mma6): 8 with the block's Q staged through shared memory (LV 31 + 32). In one H200 run
# beside 8 (the previous default) and 8 again as an A/A control
# (perf_history/kernel/verify_kernel_mma6_gpu-nvidia-h200-sm90_0c41cd6.json), 12 / 8 / 8 again, us: 4k T=16 18.5 / 19.2
# / 19.3, 4k T=64 31.3 / 32.2 / 32.3, 16k T=16 31.7 / 32.5 / 32.5, 16k T=64 83.0 / 83.6 / 83.6, 65k T=16 81.6 / 82.7 /
# 82.5, 65k T=64 286.5 / 288.5 / 287.7: faster by more than the A/A spread at all six sizes (IQRs apart at 65k); 13 /
# 14 / 15, us: 4k T=16 19.1 / 19.7 / 18.8, 4k T=64 31.6 / 33.4 / 32.3, 16k T=16 32.4 / 34.0 / 33.1, 16k T=64 83.3 /
# 88.7 / 87.5, 65k T=16 82.0 / 87.7 / 86.8, 65k T=64 285.6 / 306.3 / 305.3 (13 slower than 12 except at 65k T=64; 14
# slower than 8 and 15 slower than 12 at all six sizes, by 2.1-6.6%, most at 65k: the page-table pointer in a register
# pair (254 registers) cost more than the 4 instructions per tile it saved; not profiled). ncu at 65k T=16
# (perf_history/kernel/mma6_0c41cd6/): lg_throttle stalls per issue 0.34 -> 0.00, tensor pipe 37.96% -> 38.28%, issue
# active 26.12% -> 26.65%; the loop is unchanged (SASS 284 instructions per tile against 285). 32-row blocks (T * H <=
# 32) run wide2pp2 as before.
DEFAULT_PINGPONG = 12
# Merge kernel (csrc/verify_kernel.cuh; the split partials are bf16 [B, nsplit, T*H, 512], their lse
# fp32): 0 = one loop over the splits per thread, 1 = split weights computed in parallel first, then 4
# thread groups over the splits with 8 partial rows in flight per thread; 2 = the same over 4 blocks
# per row (128 columns each) and 8 thread groups (4x the blocks of 1); 4 = "grouped": 2 blocks per row,
# one warp per split group with its own log-sum-exp state (lse and partial loads of a batch issued
# together, one barrier), any nsplit, with few instructions (the row bases formed once, 32-bit offsets, a batch's loads
# all issued before the row max, the weights as one ex2.approx.ftz each, no branch per split; csrc/verify_kernel.cuh).
# 3 = the first grouped merge (the same work split without those), retired: it was the default from 75d088d (against 2
# on the same bf16 partials in one H200 run 0.5-1.8 us faster on the mma.sync path and 0.2-15.3 us on the sm90 path at
# the six sizes: perf_history/kernel/verify_kernel_gpu-nvidia-h200-sm90_75d088d_paths.json) until 4 replaced it; its
# source is in the git history up to d403430, and 3 is refused here and in the binding. The numbers of 0, 1, 2 and 4
# stay (records' labels such as comb4 name them). 4 (the default from b44f69a until 7): against 3 in two sets of one H200
# run (perf_history/kernel/verify_kernel_merge2{0,1}_gpu-nvidia-h200-sm90_b44f69a.json, merge2_b44f69a/), us, 3 / 4 /
# 3 again, set 1 then 2: after the sm90 kernel 4k T64 20.2 / 19.9 / 20.2 both, 16k T16 20.9 / 20.4 / 21.0 and 21.0 /
# 20.4 / 21.0, 16k T64 40.3 / 39.9 / 40.3 and 40.3 / 39.9 / 40.2, 65k T16 44.8 / 44.5 / 44.9 and 44.9 / 44.4 / 44.8,
# 65k T64 118.9 / 118.6 / 118.8 and 118.7 / 118.4 / 118.7 (4k T16 13.4 / 13.2 / 13.4 and 13.0 / 13.2 / 13.4: its first
# row reads low, position in the process); after the mma.sync default 0.2-0.7 us faster at four sizes, equal at 65k;
# ncu of the merge alone with warm partials at 65k T64: 5.34-6.05 -> 4.77-4.83 us, 1.52M -> 1.29M warp instructions.
# 7 (5 and 6 were merges since removed): 4 with its blocks spread over the SMs (at most ceil(blocks / SMs) per SM, by
# padding its dynamic shared memory; csrc/merge_spread.h merge_spread_smem). H200, the sweep set `spread` (merge 4,
# 7, 7 again, 4 again after each path's default split kernel), two sets in one run at 0117714
# (perf_history/kernel/spread2_0117714/): after the mma.sync default 1.2-1.4 us faster at 4k and 16k T16 (18.0 ->
# 16.7, 31.5-31.6 -> 30.1-30.2), 0.4 us at 4k and 16k T64, equal at 65k (82.2-82.4 against 82.3-82.6, 286.3-287.4
# against 286.7-286.9); the mma.sync A/A pairs within 0.1 us but one (0.5 us, 65k T64); its blocks on 128-130 SMs
# and 3.0 us from the last split block's end to the last merge block's end at 65k T64, against 3.3-4.9 us for 4 (20
# timeline replays each). The
# mma.sync path's merge since. After the sm90 call it was 2.2-2.6 us slower at 65k T64 (114.5-115.0 against
# 112.2-112.5) in both sets, as in the first run (spread_591e4a6/), though its timeline tail there was shorter too
# (3.0 against 3.5 us), and within 0.3 us elsewhere. That loss belongs to the sweep's form, K = 8 calls back to back
# per graph replay (ci/gpu/merge_ab.py, perf_history/kernel/merge_ab_999594e/, A B B A): at one call per replay merge 7
# was equal at 65k T64 (1.1 us faster at 65k T16), and in the decode engine, where other kernels run between the
# verify calls, it was faster at every context measured on both paths, in all 8 runs of 4 7 7 4 4 7 7 4 each: the sm90 path's
# verify attention 0.948 / 0.336 / 0.192 -> 0.933 / 0.324 / 0.180 ms per step of 8 layers at 65k / 16k / 4k (T=64),
# 1276 -> 1282 and 1629 -> 1637 tok/s at 65k / 16k (means of 4 runs). The sm90 path's merge since, although the sweep
# (and so the suite's verify/cuda, which times that form) reads 65k T64 1.6-2.6 us slower with it.
COMBINES = (0, 1, 2, 4, 7)  # (3 retired: above)
DEFAULT_COMBINE = 7  # the mma.sync path's merge
SM90_COMBINE = 7  # the sm90 path's merge (4 before 32f7b9b)
# Shortest split for `auto`: four 16-token tiles of the wide layout. At ctx 4096, T 16 one wave of 64
# splits of 64 tokens ran faster than 32 splits of 128 on the H200
# (perf_history/records/verify_kernel_cudagraph.txt).
MIN_TOKENS_PER_SPLIT = 64
# The Hopper path (csrc/verify_sm90.cuh: wgmma + TMA, warp-specialized, 64-row blocks, 64-token
# page tiles, one block per SM). "mma" = the mma.sync kernels above (every arch), "sm90" = the wgmma
# kernel (sm_90 only), "auto" = sm90 where it can run, else mma. KDENGINE_CUDA_PATH overrides the default.
# auto: on the H200 the sm90 kernel (staggered) ran 1.35-2.4x faster than the mma.sync default at all six
# benchmarked sizes in one run (perf_history/kernel/verify_kernel_sm90_gpu-nvidia-h200-sm90_3543d28.json).
PATHS = ("mma", "sm90", "auto")
DEFAULT_PATH = "auto"
SM90_ROWS = 64
SM90_TILE_TOKENS = 64
# Shortest split for `auto` on the sm90 path: 128 tokens (two tiles). At ctx 4096, T 16 32 splits ran
# 16.7 us against 17.7 us for 64 one-tile splits; at every other benchmarked size the auto count was
# already limited by one wave, so it is unchanged (same JSON).
SM90_MIN_TOKENS_PER_SPLIT = 128
# Schedules of the two consumer warpgroups (csrc/verify_sm90.cuh): both = each computes S of every
# tile (twice the Q*K^T work, no state between them); seesaw = they alternate S + softmax per tile and
# share P through shared memory; staggered = both, with their S issue ordered so that one's softmax
# overlaps the other's S.
# staggered ran fastest at all six sizes (same JSON); seesaw (no duplicated Q*K^T) is slower today: its
# softmax chain crosses the warpgroups every tile, and compute-sanitizer racecheck reports its
# bar.arrive / bar.sync hand-offs of the row state (a false positive as far as the PTX barrier
# semantics go, but not shown otherwise): it stays a launch choice, not the default.
# pair = FlashMLA's split of the work: warpgroup 0 computes S of the even tiles, 1 of the odd ones, they
# exchange only the per-row max before P V, and each runs P V of both tiles on its own 256 O columns (each
# tile's P goes through its rope chunk); every KV tile is released in three chunk groups as its users finish.
# H200, one run beside staggered and FlashMLA (perf_history/kernel/verify_kernel_pair_*_6094a27.json): at
# T=64 pair ran 28.9 / 57.6 / 176.8 us against 29.3 / 60.3 / 182.2 for staggered at 4k / 16k / 65k
# (FlashMLA 25.2 / 49.8 / 119.6); at T=16 16.0 / 26.4 / 57.5 against 16.8 / 26.0 / 58.1 (mixed). It does
# 0.65x the tensor work of staggered but its tensor pipe is idle half the time (ncu at 65k T=64: 52% busy
# against 74%; csrc/verify_sm90.cuh says why, as far as known): opt-in, see PAIR_MIN_ROWS.
# half = the tokens of each tile split between the warpgroups: warpgroup w computes S of tokens
# [32 w, 32 w + 32) (m64n32k16, no duplicated Q*K^T, one KV tile per step), they exchange the rows' max
# (lazy: it moves only when a score passes it by 2^8) and their bf16 P through the tile's rope chunk, and
# each runs P V of all 64 tokens on its own 256 O columns (own half from registers, the other's from
# shared memory). Every hand-off is a bar.sync of both warpgroups. Opt-in, see HALF_MIN_ROWS.
# staggered_small = staggered with a smaller hot loop (instruction fetch): the tail tile's mask from the <= 3
# packed words each row's scores reach, loaded under S (csrc tail_bits), the running max moved lazily (half's
# rule: only when a score passes it by 2^8, so the O rescale is rarely taken), exp2 as one MUFU.EX2 (ftz), and
# the producer's empty-barrier waits with a suspend-time hint; staggered_tail = staggered with only the tail
# mask as bits from a rolled loop (the same math as staggered, a smaller loop). staggered_small is the default
# (below; csrc/verify_sm90.cuh header).
# seesaw2 = FlashMLA's order in our layout, without a producer warpgroup (256 threads): per step of two
# tiles warpgroup 0 computes S of the even tile, 1 of the odd one; warpgroup 0's softmax and P V run
# while warpgroup 1's S is on the tensor cores and the other way round; the rows' running max (lazy, as in
# staggered_small) crosses through shared memory twice per step, each P through a rope chunk (the even
# tile's own; the odd tile's over Q's, whose rope dims stay in registers); each chunk of a tile arrives on
# its own barrier and is reloaded by the consumer that saw its last reader finish (csrc/verify_sm90.cuh).
# Its four one-way hand-offs between the warpgroups (two row maxima, two P) and the row-sum exchange are on
# mbarriers; seesaw2_bar is the same kernel with them on named barriers (bar.arrive / bar.sync), which racecheck
# does not model (a probe). Its softmax runs on the unscaled scores (the row max scaled once, one FFMA + MUFU.EX2 per
# score, trees for the row max and sums): 0.4-0.8% faster at T=64 (perf_history/kernel/s2soft_f222390/). The default
# from SEESAW2_MIN_ROWS query rows and SEESAW2_MIN_TILES KV tiles per split (below).
SCHEDULES = {"both": 0, "seesaw": 1, "staggered": 2, "pair": 3, "half": 4, "staggered_small": 5, "staggered_tail": 6,
             "seesaw2": 7, "seesaw2_bar": 8, "seesaw2_el": 9}
# Schedules compiled under a register cap (csrc/verify_sm90.cuh maxnreg_of; their kernel is verify_sm90_kernel_capped):
# seesaw2 at 240, faster than at its launch bounds' 255 (perf_history/kernel/res_8ce7d1a/, res2_7053082/).
REGISTER_CAPS = {"seesaw2": 240, "seesaw2_el": 240}
# seesaw2_el: seesaw2 with its partial rows stored under an L2 evict_last policy, and its merge discarding their lines
# once read (csrc/verify_sm90.cuh SEESAW2_EL). pick_schedule takes it where it would take seesaw2, the call has at most
# EL_MAX_ROWS query rows (two row tiles) and a sequence's KV capacity is larger than EL_L2_SHARE of the device's L2
# (past the whole L2 until 2026-12-03, then widened: below). Past the L2 the blocks
# still running stream their KV through L2 for ~3 us after the first partials are written (65k T=16's split ends
# spread), and ncu of the merge alone read its partials from DRAM (L2 read hit rate 13-17%, perf_history/kernel/
# merge_ncu_e730c78/). H200, two runs A B B A with the decode engine (el_9fb95fb/, el_8523781/, the second form with
# the discard): 65k T=16 faster in both beyond their A/A spreads (B - A -1.57 to -0.81 and -1.30 to -0.72 us), 16k T=16
# within the spread (its 19 MB of KV fit in L2), 65k T=64 slower (+0.23 to +0.73 and +0.10 to +0.76 us: its split ends
# spread only ~1 us, so its partials were not evicted, and the evict_last lines take L2 from its 8 row tiles' KV
# re-reads), the engine (T=64) within its spread: so not at T=64. Since probe pf0 its row tile 0 block also prefetches
# tiles 2 and 3 into L2 under its first S (65k T=16 0.45-0.49 us faster in three A/B sets, perf_history/kernel/
# pf0_5e1119c/; csrc/verify_sm90.cuh SEESAW2_EL). Within the L2 (H200, perf_history/kernel/el_l2_97c6a8c/, seesaw2 A
# against seesaw2_el B at T=16, 8 rows each, two sets in two calls): at the sweep's K B - A -1.29 us at 48k (56 MB of
# KV), -0.64 / -0.66 at 32k (38 MB), every B row below every A row at both; -0.20 / -0.24 at 16k (19 MB, the rows
# overlapping), -0.05 at 4k. The decode engine at T=16 (A B B A B A A B) read both alike in tok/s at 16k-65k
# (-0.07% to +0.24%), where its op-timed attention phase read B 0.7-2 us a call slower, and so did the K1 rows that
# follow the other schedule's code (B pays 0.3-1.6 us more for a code switch; cause not found; H=16 T=8 reads the same): so past half the L2.
EL_MAX_ROWS = 128
EL_L2_SHARE = 0.5
D_QK_BYTES = shapes.D_QK * 2  # one KV row (bf16): the bytes of a token of the pool
# seesaw2's probes (swap, early, se, qc, seq, eno, mid; 2-CTA multicast clusters; earlier v0, ahead, alate, apro, aolp;
# ring4 and late of 2026-12-01; stream, stream-K over the SMs, mpf, bulk, ldst, cp, pl, pf, shrink, shift, pf4,
# pt, pi and p2 of 2026-12-02; p2c and p2d of 2026-12-03), each measured on the H200 slower than seesaw2 or within
# the spread, are gone
# (csrc/verify_sm90.cuh says where each one's evidence is; their code: the csrc history up to dd10800, and the
# patches under perf_history/kernel/{ring4_1d11a74,late_14c0a94,stream_d70f087,bulk_12bb1ab,ldst_03a138e,cp_7ceb62a,
# pl_98b83ff,pf_659e0cb,shrink_e37e1ad,shift_951e696,pf4_f5a36a6,pt_c67ae56,pi_f04b6b0,p2_361beb2,p2cd_aa57768}/).
# The probe stsm (P written by stmatrix) became
# seesaw2 (perf_history/kernel/stsm_8449746/), and so did d32 (its descriptors as 32-bit adds; d32_905c234/) and
# unr (the TMA issue loops unrolled; g2_e0dfbe9/, where g2, two chunks per full barrier, was slower) and spread (a
# warpgroup's two reloads from two warps; la_ab24c16/, where la, the page lookups in every thread, was slower).
# The default sm90 schedule, at every size. staggered_small was the default only from 8 KV tiles per split
# (SMALL_MIN_TILES) while its tail mask was a rolled loop of a load per score: 3-9% slower than staggered at 4k
# (perf_history/kernel/verify_kernel_icache_*_986b231.json). With the mask from packed words (tail_bits), one
# H200 session timing both commits (perf_history/kernel/verify_kernel_small4k_*_{1cd259e,5d97cc8}.json; us,
# staggered / A/A / staggered_small before -> after (FlashMLA)): 4k T16 15.3 / 15.2 / 15.7 -> 13.3 (20.9), 4k
# T64 22.2 / 22.2 / 24.0 -> 21.0 (25.5), 16k T16 23.8 / 23.9 / 22.6 -> 22.7 (39.0), 16k T64 53.1 / 52.8 / 51.0
# -> 48.1 (50.7), 65k T16 55.2 / 55.8 / 51.2 -> 51.1 (52.8), 65k T64 174.7 / 182.9 / 167.1 -> 163.7 (125.8).
# Faster than staggered by more than the A/A spread at all six sizes, so no threshold.
DEFAULT_SCHEDULE = "staggered_small"  # below SEESAW2_MIN_ROWS query rows or SEESAW2_MIN_TILES tiles per split
# Query rows per sequence (R = T * H) from which the default is pair instead; None: never by default.
# pair was measured faster than staggered at all six sizes in one run (this pair code as pair_v0 in
# perf_history/kernel/verify_kernel_pairload_*_752b824.json: 14.2 / 23.5 / 54.8 us at T=16 and 21.3 / 50.8 /
# 173.5 at T=64 for 4k / 16k / 65k, staggered 15.2 / 24.0 / 56.0 and 22.1 / 53.1 / 181.5), so 128 rows (T=16
# at H=8) would be the threshold. It stays opt-in while compute-sanitizer racecheck reports its hand-offs
# from warpgroup 1 to warpgroup 0 (the row-max table mp1_tab; in one build the row-sum table too): in the
# SASS those are a predicated STS, then BAR.ARV / BAR.SYNC of the pair's 256 threads, then the other
# warpgroup's BAR.SYNC and LDS, the same form as the 0 -> 1 hand-off (mp0_tab) that racecheck never
# reports (perf_history/kernel/sm90_pairload_752b824/sass_racecheck_sites.txt), so it looks like a
# false positive, not yet shown one; moving those hand-offs onto mbarriers did not change the reports
# (pair_v0_mb, ..._fbbfd73.json). Set 128 to make pair the default.
PAIR_MIN_ROWS: int | None = None
# Query rows per sequence (R = T * H) from which the default is half instead (checked before pair); None:
# never by default. None, because half beat staggered by more than the A/A spread at no size in three H200
# runs (perf_history/kernel/verify_kernel_half_*_{90edcf6,f59d68d,45ed1b3}.json; in the last, us, staggered
# / A/A / half: 4k T16 15.4 / 15.4 / 15.8, 4k T64 22.4 / 22.4 / 24.4, 16k T16 24.0 / 24.0 / 26.3, 16k T64
# 53.1 / 52.9 / 54.3, 65k T16 55.4 / 55.5 / 56.3, 65k T64 171.9 / 173.5 / 171.7), although racecheck is
# clean for it: it does 0.65x staggered's tensor work in the same time (csrc/verify_sm90.cuh says why).
HALF_MIN_ROWS: int | None = None
# Query rows per sequence (R = T * H) from which the default is seesaw2 instead (checked first); None:
# never. Faster than staggered_small beyond the A/A spread at five of the six sizes (R = 128 and 512) in four
# H200 runs (perf_history/kernel/verify_kernel_seesaw2_*_{66c932a,d5a6c13,edc1c88,50dcc76}.json; us in
# 50dcc76, staggered_small / seesaw2 / staggered_small again (FlashMLA)): 4k T16 13.3 / 14.8 / 13.3 (20.9),
# 4k T64 20.8 / 20.1 / 21.0 (25.4), 16k T16 22.7 / 20.8 / 22.6 (39.0), 16k T64 48.0 / 41.2 / 48.0 (50.5),
# 65k T16 51.0 / 45.1 / 50.9 (53.4), 65k T64 158.0 / 132.7 / 159.1 (123.3). It loses 1.5 us at 4k T=16 (2
# KV tiles per split: one step, nothing to overlap); the rows cannot tell 4k from 16k at T=16 and the gain
# elsewhere is 2-25 us, so the threshold is 128 rows (T=16 at H=8). compute-sanitizer racecheck, synccheck
# and memcheck are clean since its hand-offs are on mbarriers (perf_history/kernel/s2race_6a95ae1/README.md:
# racecheck does not model bar.arrive, which drew its earlier reports). Since then its loaders read the page table
# a step ahead and warpgroup 1 publishes the odd tile's P after issuing both of its P V (csrc/verify_sm90.cuh
# SEESAW2; perf_history/kernel/verify_kernel_s2tune_*_5873571.json, seesaw2_ao there, against seesaw2_v0): 65k
# T64 124.6 / 123.5 against 128.1 / 129.6 us in two records, 65k T16 44.7 / 44.5 against 45.2 / 45.2, 16k T64
# 40.5 against 41.5, 4k equal.
SEESAW2_MIN_ROWS: int | None = 128
# ... and from this many KV tiles per split (split_tiles: at the page table's capacity and the planned NSPLIT, as
# the kernel cuts its splits), staggered_small below: with 2 tiles a split is one seesaw2 step with nothing to
# overlap. In every H200 set that timed both at 4k T=16 (2 tiles per split at NSPLIT 32), staggered_small / seesaw2 /
# staggered_small again, us: 13.3 / 14.8 / 13.3 (50dcc76), 12.9 / 14.9 / 13.3 (2503f03), 12.9 / 15.0 / 13.3 and
# interleaved 13.3 / 15.0 / 13.4 (e2a43f3: perf_history/kernel/verify_kernel_seesaw2{seq,}_*_e2a43f3.json); at 4
# tiles (16k T=16 at NSPLIT 64, 4k T=64 at 16) seesaw2 is the faster in all of them (e2a43f3, sequential: 20.9 /
# 22.8 and 20.2 / 21.0). 3 tiles per split was never timed. In a CUDA graph the capacity, not the prefix of a
# replay, decides: an engine whose page table holds 65k tokens runs seesaw2 at every prefix.
SEESAW2_MIN_TILES = 4


# The merge of the sm90 kernel is the merge kernel SM90_COMBINE (a programmatic dependent launch). Its
# own share of a call, timed as the split kernel alone (combine SPLIT_ONLY) against split + merge in the
# same CUDA graph and flush: 3.0-3.1 / 3.6-3.9 / 5.2-5.6 / 3.8-4.3 / 4.8-5.3 us at 4k T16 / 4k T64 / 16k T16 /
# 16k T64 / 65k T16 in three runs on the H200 (65k T64: within its run-to-run spread; kernel sweep set
# `fuse`). Two merges fused into the split kernel (clusters through distributed shared memory, a
# cooperative grid merge) were slower and are gone (csrc/verify_sm90.cuh header).
SPLIT_ONLY = -1  # launch_sm90's combine for the split kernel alone (out / lse not written): timing only
# When a split kernel lets the merge (its programmatic dependent, sm_90+) launch: True = as soon as every split block
# has started (the merge's blocks take the SMs the split grid leaves idle or frees, and wait there for the grid to
# complete), False = each block only before writing its partials (the merge's blocks are placed after the last one).
# sm90 kernel: DEFAULT_MERGE_EARLY; mma.sync wide2 / lean kernels: DEFAULT_MMA_MERGE_EARLY (the other mma layouts never
# trigger early). H200, kernel sweep set `pdl`, sequential and interleaved in each of two runs (perf_history/kernel/
# verify_kernel_pdl{,int}_*_{6268674,288100a}.json; pdl_*/): the sm90 kernel's early trigger was slower at five sizes,
# by 0.6-1.9 us (65k T64 121.5 against 119.6 us; 4k T16 within the A/A spread); the mma.sync default's early trigger
# (its form until 288100a) 1.0-1.3 us slower at the three T=64 sizes (4k T64 31.3 against 30.2, 65k T64 287.8 against
# 286.5), equal at T=16. Likely reading: merge blocks launched early fill the first SMs the split grid frees (up to 8
# each) instead of spreading over all of them once it completes. The flag stays for a GPU where that may differ
# (sm_120: `python -m kdengine.bench.kernel measure --set pdl`).
DEFAULT_MERGE_EARLY = False
DEFAULT_MMA_MERGE_EARLY = False


def check_merge_early(merge_early, default: bool) -> bool:
    """merge_early: None (the default) or a bool (the binding takes a bool: nothing else converts silently)."""
    if merge_early is None:
        return default
    if not isinstance(merge_early, bool):
        raise ValueError(f"merge_early: expected None or a bool, got {merge_early!r}")
    return merge_early


def check_combine(combine, allowed: tuple = COMBINES) -> None:
    """combine: one of `allowed` (COMBINES, or SPLIT_ONLY too for launch_sm90); the retired 3 is named as such."""
    if combine not in allowed:
        retired = " (3, the older grouped merge, was retired: slower than 4, perf_history/kernel/merge2_b44f69a/)" \
            if combine == 3 else ""
        raise ValueError(f"combine: expected one of {allowed}, got {combine!r}{retired}")


def l2_bytes(device) -> int:
    """The L2 cache size of a CUDA device (torch caches the device properties)."""
    return torch.cuda.get_device_properties(device).L2_cache_size


def split_tiles(capacity: int, nsplit: int) -> int:
    """KV tiles per split of the sm90 kernel at `capacity` tokens cut into `nsplit` splits (its split length:
    ceil(tokens / nsplit) rounded up to whole 64-token tiles)."""
    if capacity < 1 or nsplit < 1:
        raise ValueError(f"capacity and nsplit: expected >= 1, got {capacity} and {nsplit}")
    split_tokens = -(-capacity // nsplit)
    return -(-split_tokens // SM90_TILE_TOKENS)


def pick_schedule(T: int, H: int, tiles_per_split: int | None = None, kv_capacity: int | None = None,
                  l2_size: int | None = None) -> str:
    """The default sm90 schedule of a call with T tree tokens and H heads (tiles_per_split: split_tiles of the
    call; kv_capacity: a sequence's KV capacity in tokens, l2_size: the device's L2 bytes, l2_bytes; None: not
    considered)."""
    if (SEESAW2_MIN_ROWS is not None and T * H >= SEESAW2_MIN_ROWS
            and (tiles_per_split is None or tiles_per_split >= SEESAW2_MIN_TILES)):
        large = kv_capacity is not None and l2_size is not None and kv_capacity * D_QK_BYTES > EL_L2_SHARE * l2_size
        return "seesaw2_el" if T * H <= EL_MAX_ROWS and large else "seesaw2"
    if HALF_MIN_ROWS is not None and T * H >= HALF_MIN_ROWS:
        return "half"
    if PAIR_MIN_ROWS is not None and T * H >= PAIR_MIN_ROWS:
        return "pair"
    return DEFAULT_SCHEDULE


_REASON: dict[str, str | None] = {}
_BLOCKS_PER_SM: dict[tuple, int] = {}


def row_tiles(R: int, max_row_groups: int = DEFAULT_ROW_GROUPS, col_warps: int = DEFAULT_COL_WARPS) -> int:
    """Query-row tiles per (sequence, split) for R = T * H rows (mirrors csrc with_config: the wide
    layout holds at least two 16-row groups)."""
    groups = shapes.row_groups(R, max_row_groups)
    if col_warps in WIDE_LAYOUTS:
        groups = max(groups, 2)
    if col_warps == WIDE2X16:
        groups = shapes.MAX_ROW_GROUPS
    return -(-R // (shapes.ROWS_PER_GROUP * groups))


def available(device: torch.device) -> str | None:
    """None when the kernel can run on `device`, else a one-line reason. Never raises; the build
    outcome is cached per process."""
    device = torch.device(device)
    if device.type != "cuda":
        return f"no CUDA device ({device.type} tensors)"
    if not torch.cuda.is_available():
        return "no CUDA device visible to torch"
    if "build" not in _REASON:
        try:
            build.load_extension()
            _REASON["build"] = None
        except Exception as exc:  # noqa: BLE001 - any build failure becomes the reason
            lines = str(exc).strip().splitlines()
            _REASON["build"] = f"the CUDA extension did not build: {lines[0] if lines else type(exc).__name__}"
    return _REASON["build"]


def alloc_partials(q: torch.Tensor, nsplit: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The split partials of a call: part_out bf16 [B, nsplit, T*H, DV] (each split's O normalised by
    its own sum: half the merge's bytes of fp32), part_lse fp32 [B, nsplit, T*H]."""
    B, T, H, _ = q.shape
    return (torch.empty(B, nsplit, T * H, DV, dtype=torch.bfloat16, device=q.device),
            torch.empty(B, nsplit, T * H, dtype=torch.float32, device=q.device))


def launch(q, kv_cache, page_table, prefix_len, mask_bits, out, lse, *, sm_scale, nsplit, scalar_loads=False,
           col_warps=DEFAULT_COL_WARPS, row_groups=DEFAULT_ROW_GROUPS, combine=None,
           pingpong=DEFAULT_PINGPONG, merge_early=None):
    """Run the kernels into caller-given out/lse (tests poison them first; combine None: DEFAULT_COMBINE, read at
    the call, as launch_sm90 reads SM90_COMBINE; merge_early None: DEFAULT_MMA_MERGE_EARLY)."""
    check_scale(sm_scale)  # (verify_attention checked it already; direct callers too)
    merge_early = check_merge_early(merge_early, DEFAULT_MMA_MERGE_EARLY)
    if col_warps not in COL_WARPS:
        raise ValueError(f"col_warps: expected one of {COL_WARPS}, got {col_warps!r}")
    if row_groups not in ROW_GROUPS:
        raise ValueError(f"row_groups: expected one of {ROW_GROUPS}, got {row_groups!r}")
    if combine is None:
        combine = DEFAULT_COMBINE
    check_combine(combine)
    if int(pingpong) not in PINGPONGS or (int(pingpong) in SPLIT_PV_PINGPONGS and col_warps != WIDE2):
        raise ValueError(f"pingpong: expected one of {PINGPONGS} ({SPLIT_PV_PINGPONGS} with col_warps {WIDE2} only), "
                         f"got {pingpong!r}")
    part_out, part_lse = alloc_partials(q, nsplit)
    module = build.load_extension(scalar_loads=scalar_loads)
    module.launch(q, kv_cache, page_table, prefix_len, mask_bits, out, lse, part_out, part_lse, sm_scale, nsplit,
                  col_warps, row_groups, int(pingpong), combine, merge_early)


def sm90_unavailable(kv_cache: torch.Tensor) -> str | None:
    """None when the sm90 kernel can run with this KV pool on its device, else the reason."""
    if not kv_cache.is_cuda:
        return "not a CUDA tensor"
    if torch.cuda.get_device_capability(kv_cache.device) != (9, 0):
        return "not an sm_90 device"
    key = f"sm90/{kv_cache.device}/{kv_cache.shape[1]}/{kv_cache.data_ptr() % 16 == 0}"
    if key not in _REASON:
        _REASON[key] = build.load_extension().sm90_unsupported(kv_cache) or None
    return _REASON[key]


def resolve_path(kv_cache: torch.Tensor, path: str | None = None) -> str:
    """'mma' or 'sm90' for a call: the argument, else KDENGINE_CUDA_PATH, else DEFAULT_PATH; 'auto'
    falls back to mma where the sm90 kernel cannot run; 'sm90' that cannot run raises ValueError
    with the reason."""
    if path is not None and path not in PATHS:
        raise ValueError(f"path: expected one of {PATHS}, got {path!r}")
    choice = path or env.cuda_path_override() or DEFAULT_PATH
    if choice == "mma":
        return "mma"
    reason = sm90_unavailable(kv_cache)
    if reason is None:
        return "sm90"
    if choice == "sm90":
        raise ValueError(f"path: the sm90 kernel cannot run here ({reason})")
    return "mma"


def launch_sm90(q, kv_cache, page_table, prefix_len, mask_bits, out, lse, *, sm_scale, nsplit,
                schedule=None, combine=None, merge_early=None):
    """The Hopper kernel + merge into caller-given out/lse (schedule None: pick_schedule; combine None:
    SM90_COMBINE; SPLIT_ONLY: the split kernel alone, out/lse left unwritten; merge_early None:
    DEFAULT_MERGE_EARLY)."""
    check_scale(sm_scale)  # > 0: seesaw2 scales the row max of unscaled scores
    if schedule is None:
        capacity = page_table.shape[1] * kv_cache.shape[1]
        schedule = pick_schedule(q.shape[1], q.shape[2], split_tiles(capacity, nsplit), capacity, l2_bytes(q.device))
    if combine is None:
        combine = SM90_COMBINE
    check_combine(combine, (SPLIT_ONLY, *COMBINES))
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule: expected one of {tuple(SCHEDULES)}, got {schedule!r}")
    merge_early = check_merge_early(merge_early, DEFAULT_MERGE_EARLY)
    part_out, part_lse = alloc_partials(q, nsplit)
    build.load_extension().launch_sm90(q, kv_cache, page_table, prefix_len, mask_bits, out, lse, part_out, part_lse,
                                       sm_scale, nsplit, SCHEDULES[schedule], combine, merge_early)


# --- the in-kernel timeline (the -DKDENGINE_TIMELINE build: csrc/verify_timeline.cuh, kdengine.bench.timeline) ------


def _timeline_module():
    module = build.load_extension()
    if not hasattr(module, "timeline_read"):
        raise RuntimeError(f"the loaded CUDA extension was built without -D{build.TIMELINE_MACRO} (no timeline): build "
                           f"it with `python -m kdengine.ops.build --timeline` and set {env.TIMELINE_VAR}=1")
    return module


def timeline_reset() -> None:
    """Zero the timeline records (on the current stream, so before the launches that follow)."""
    _timeline_module().timeline_reset()


def timeline_read() -> torch.Tensor:
    """The records written since the last reset: CPU int64 [n, 4] (kind, block, smid, t_ns); waits for the stream."""
    return _timeline_module().timeline_read()


def split_shape_sm90(T: int, H: int) -> dict:
    """The sm90 planner's per-call inputs to schedule.auto_nsplit besides capacity, batch and the SM count."""
    return {"row_tiles": -(-(T * H) // SM90_ROWS), "min_tokens": SM90_MIN_TOKENS_PER_SPLIT,
            "tile_tokens": SM90_TILE_TOKENS}


def split_shape_mma(T: int, H: int, row_groups: int = DEFAULT_ROW_GROUPS, col_warps: int = DEFAULT_COL_WARPS,
                    pingpong: int = DEFAULT_PINGPONG, on_gpu: bool = False) -> dict:
    """The mma.sync planner's inputs likewise: row tiles counted per resident block slot of an SM (on_gpu: the
    occupancy API; else one block per SM)."""
    tiles = row_tiles(T * H, row_groups, col_warps)
    if on_gpu:
        tiles = -(-tiles // blocks_per_sm(T * H, col_warps, row_groups, pingpong))
    return {"row_tiles": tiles, "min_tokens": MIN_TOKENS_PER_SPLIT, "tile_tokens": TILE_TOKENS[col_warps]}


def plan_nsplit_sm90(q, kv_cache, page_table, nsplit) -> int:
    """The split count of the sm90 kernel: one wave of 64-row blocks (one block per SM)."""
    B, T, H, _ = q.shape
    return resolve_nsplit(nsplit, backend="cuda", capacity=page_table.shape[1] * kv_cache.shape[1], batch=B,
                          device=q.device, **split_shape_sm90(T, H))


def alloc_outputs(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """out [B, T, H, DV] (q's dtype) and lse [B, T, H] fp32 for a call on q [B, T, H, 576]."""
    B, T, H, _ = q.shape
    return torch.empty(B, T, H, DV, dtype=q.dtype, device=q.device), torch.empty(B, T, H, dtype=torch.float32,
                                                                                device=q.device)


@torch.library.custom_op("kdengine::verify_cuda_sm90", mutates_args=())
def verify_cuda_sm90(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    page_table: torch.Tensor,
    prefix_len: torch.Tensor,
    mask_bits: torch.Tensor,
    sm_scale: float,
    nsplit: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = alloc_outputs(q)
    launch_sm90(q, kv_cache, page_table, prefix_len, mask_bits, out, lse, sm_scale=sm_scale, nsplit=nsplit)
    return out, lse


@torch.library.custom_op("kdengine::verify_cuda", mutates_args=())
def verify_cuda(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    page_table: torch.Tensor,
    prefix_len: torch.Tensor,
    mask_bits: torch.Tensor,
    sm_scale: float,
    nsplit: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = alloc_outputs(q)
    launch(q, kv_cache, page_table, prefix_len, mask_bits, out, lse, sm_scale=sm_scale, nsplit=nsplit)
    return out, lse


def _verify_fake(q, kv_cache, page_table, prefix_len, mask_bits, sm_scale, nsplit):
    """Both ops' shapes for tracing (torch.compile, meta tensors): no launch."""
    B, T, H, _ = q.shape
    return q.new_empty(B, T, H, DV), q.new_empty(B, T, H, dtype=torch.float32)


verify_cuda.register_fake(_verify_fake)
verify_cuda_sm90.register_fake(_verify_fake)


def blocks_per_sm(R: int, col_warps: int = DEFAULT_COL_WARPS, row_groups: int = DEFAULT_ROW_GROUPS,
                  pingpong: int = DEFAULT_PINGPONG) -> int:
    """Split blocks resident per SM for this layout (the occupancy API, cached per process)."""
    key = (min(R, 64), col_warps, row_groups, int(pingpong))
    if key not in _BLOCKS_PER_SM:
        _BLOCKS_PER_SM[key] = max(1, build.load_extension().blocks_per_sm(R, col_warps, row_groups, int(pingpong)))
    return _BLOCKS_PER_SM[key]


def plan_nsplit(q, kv_cache, page_table, nsplit, row_groups: int = DEFAULT_ROW_GROUPS,
                col_warps: int = DEFAULT_COL_WARPS, pingpong: int = DEFAULT_PINGPONG) -> int:
    """The split count from host-known sizes only (graph safe). For `auto`, one wave of split blocks:
    row tiles are counted per resident block slot of an SM."""
    B, T, H, _ = q.shape
    return resolve_nsplit(nsplit, backend="cuda", capacity=page_table.shape[1] * kv_cache.shape[1], batch=B,
                          device=q.device, **split_shape_mma(T, H, row_groups, col_warps, pingpong, q.is_cuda))


def plan(q, kv_cache, page_table, nsplit, path=None) -> tuple[str, int]:
    """The kernel path of a call ('mma' or 'sm90', resolve_path) and its split count (that path's planner)."""
    chosen = resolve_path(kv_cache, path)
    planner = plan_nsplit_sm90 if chosen == "sm90" else plan_nsplit
    return chosen, planner(q, kv_cache, page_table, nsplit)


def run(q, kv_cache, page_table, prefix_len, mask_bits, *, sm_scale, nsplit, return_lse, path=None):
    chosen, splits = plan(q, kv_cache, page_table, nsplit, path)
    op = verify_cuda_sm90 if chosen == "sm90" else verify_cuda
    out, lse = op(q, kv_cache, page_table, prefix_len, mask_bits, float(sm_scale), splits)
    return out, (lse if return_lse else None)
