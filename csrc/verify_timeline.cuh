// Opt-in in-kernel timeline (built with -DKDENGINE_TIMELINE: `python -m kdengine.ops.build --timeline`): thread 0 of a
// marked block calls timeline_mark(kind), which writes one record (kind, block linear index, %smid, %globaltimer ns)
// into a slot fixed by the kind and the block index, so no atomics and no order between blocks. Without the macro
// timeline_mark is empty and every kernel's code is unchanged (tests/ops/test_timeline.py: no globaltimer in the
// default PTX; the SASS was compared with cuobjdump when the marks went in).
//
// Each translation unit holds its own buffer (no relocatable device code: a __device__ variable is per unit), and one
// that marks a kernel exports it with KDENGINE_TIMELINE_EXPORT(name); the binding (verify_api.cpp) resets and reads
// every unit's buffer. Marked so far: the sm90 split kernel (verify_sm90.cu), the grouped merge (combine 4 and 7) and
// the mma.sync lean split kernel, the default layout's (verify_kernel.cu; its trigger in write_partials, which the
// other wide layouts share: they record triggers only).
#pragma once

#include <cuda_runtime.h>

namespace kdengine {
namespace timeline {

enum Kind : int {
  SPLIT_START = 0,    // after the split block's first __syncthreads (the mma.sync lean kernel: after its split range)
  SPLIT_TRIGGER = 1,  // just before its griddepcontrol.launch_dependents ahead of the partial writes
  SPLIT_END = 2,      // after thread 0's partial writes (an empty split: after its lse writes, no other record)
  MERGE_START = 3,    // the merge block's start, before griddepcontrol.wait
  MERGE_WAITED = 4,   // after griddepcontrol.wait
  MERGE_END = 5,      // after thread 0's stores
  SPLIT_STEP1 = 6,    // sm90 seesaw2: warpgroup 0 starts step 1 (tiles 2, 3), steps 0 behind it
  SPLIT_LAST_STEP = 7,  // sm90 seesaw2: warpgroup 0 starts the split's last step (the tile loop's steady part behind)
  SPLIT_ISSUED = 8,   // sm90 seesaw2: thread 0 has looked up tiles 0 and 1's pages and issued the prologue's loads
  SPLIT_Q_READY = 9,  // sm90 seesaw2: thread 0 is past the Q tile's wait
  SPLIT_S0 = 10,      // sm90 seesaw2: warpgroup 0's first S (tile 0) is complete
  SPLIT_Q_ISSUED = 11,   // sm90 seesaw2: thread 0 has issued the Q tile's loads
  SPLIT_ROW0 = 12,       // sm90 seesaw2: thread 0 has tile 0's pool row (its page lookup returned)
  SPLIT_T0_ISSUED = 13,  // sm90 seesaw2: thread 0 has issued tile 0's loads
  SPLIT_S1 = 14,         // sm90 seesaw2: warpgroup 1's first S (tile 1) is complete
  SPLIT_ENTRY = 15,      // sm90 seesaw2: thread 0 entering the kernel's body (before the barriers' init and the first
                         // __syncthreads: a probe that moves work ahead of SPLIT_START is compared from here)
  // sm90 seesaw2, durations (t_ns holds ns, not a time): warpgroup w's S issues of the next step's tile in the tile
  // loop, summed over the steps by its thread wtid 0: each its chunks' full-barrier waits (the reloads' exposed
  // latency) and its wgmma issues. Warpgroup 0 issues chunks 0-3 (A), then 4-8 (B); warpgroup 1 chunks 4-8 (A), then 0-3.
  SPLIT_SISSUE0_A = 16,
  SPLIT_SISSUE0_B = 17,
  SPLIT_SISSUE1_A = 18,
  SPLIT_SISSUE1_B = 19,
  NUM_KINDS = 20,
};

constexpr int SPLIT_BLOCKS = 8192;   // slots per split kind: blocks past it are not recorded
constexpr int MERGE_BLOCKS = 32768;  // slots per merge kind

__host__ __device__ constexpr bool is_split(int kind) { return kind < MERGE_START || kind >= SPLIT_STEP1; }
__host__ __device__ constexpr int capacity_of(int kind) { return is_split(kind) ? SPLIT_BLOCKS : MERGE_BLOCKS; }
// the slots: the split kinds 0-2, the merge kinds 3-5 (from MERGE_OFF), then the split kinds from 6 (from STEP_OFF)
// (not recursive: a call left in a kernel serializes its wgmma)
constexpr int MERGE_OFF = MERGE_START * SPLIT_BLOCKS;
constexpr int STEP_OFF = MERGE_OFF + (SPLIT_STEP1 - MERGE_START) * MERGE_BLOCKS;
__host__ __device__ constexpr int offset_of(int kind) {
  return kind <= MERGE_START   ? kind * SPLIT_BLOCKS
         : kind <= SPLIT_STEP1 ? MERGE_OFF + (kind - MERGE_START) * MERGE_BLOCKS
                               : STEP_OFF + (kind - SPLIT_STEP1) * SPLIT_BLOCKS;
}
constexpr int SLOTS = offset_of(NUM_KINDS);

// One record, 16 bytes; a zero t_ns marks an unwritten slot (the reset zeroes the buffer).
struct alignas(16) Record {
  long long t_ns;  // %globaltimer
  int block;       // blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)
  short kind;      // Kind
  short smid;      // %smid
};
static_assert(sizeof(Record) == 16, "the binding reads records as pairs of int64");

#ifdef __CUDACC__  // the rest: device code (the binding, a host-compiler unit, needs only the layout above)
#ifdef KDENGINE_TIMELINE
static __device__ Record records[SLOTS];  // this translation unit's buffer (internal linkage)
#endif

// For marks inside a kernel's hot loop (the sm90 seesaw2 step marks): the %globaltimer read as a plain asm that depends
// on `after` (a loop counter: it is not hoisted), kept in shared memory with a plain store and recorded once the
// kernel's accumulators are dead (timeline_mark_at). In this form seesaw2's timeline build has no spills and no added
// warpgroup waits (13 more loop instructions). Forms built while offset_of was recursive (ptxas left it a call and
// serialised the wgmma around it, C7509) spilled and ran 4x slower; the forms are not compared otherwise.
__device__ __forceinline__ void timeline_keep(unsigned char* slot, int after) {
#ifdef KDENGINE_TIMELINE
  long long t;
  asm("mov.u64 %0, %%globaltimer;" : "=l"(t) : "r"(after));
  *reinterpret_cast<long long*>(slot) = t;
#else
  (void)slot;
  (void)after;
#endif
}
__device__ __forceinline__ long long timeline_kept(const unsigned char* slot) {
  return *reinterpret_cast<const volatile long long*>(slot);
}

// Thread 0 of a block calls these (the caller checks). timeline_mark_at records time t (a %globaltimer reading);
// timeline_mark reads the timer itself, its asm's memory clobber keeping the block's earlier stores and loads on their
// side of the read in the compiled order.
__device__ __forceinline__ void timeline_mark_at(int kind, long long t) {
#ifdef KDENGINE_TIMELINE
  const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  if (block >= static_cast<unsigned>(capacity_of(kind))) return;
  unsigned smid;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  Record r;
  r.t_ns = t;
  r.block = static_cast<int>(block);
  r.kind = static_cast<short>(kind);
  r.smid = static_cast<short>(smid);
  records[offset_of(kind) + block] = r;
#else
  (void)kind;
  (void)t;
#endif
}

__device__ __forceinline__ void timeline_mark(int kind) {
#ifdef KDENGINE_TIMELINE
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  timeline_mark_at(kind, t);
#else
  (void)kind;
#endif
}
// The same once `after` (a loaded value) is in its register: the timer read waits for the load.
__device__ __forceinline__ void timeline_mark_after(int kind, int after) {
#ifdef KDENGINE_TIMELINE
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) : "r"(after) : "memory");
  timeline_mark_at(kind, t);
#else
  (void)kind;
  (void)after;
#endif
}
#endif  // __CUDACC__

}  // namespace timeline
}  // namespace kdengine

#if defined(__CUDACC__) && defined(KDENGINE_TIMELINE)
// Defines `void* NAME()`: the device address of this translation unit's buffer (timeline::SLOTS records), nullptr on
// error. Declared for the binding in verify_launch.h.
#define KDENGINE_TIMELINE_EXPORT(NAME)                                                        \
  void* NAME() {                                                                             \
    void* ptr = nullptr;                                                                     \
    return cudaGetSymbolAddress(&ptr, ::kdengine::timeline::records) == cudaSuccess ? ptr : nullptr; \
  }
#endif
