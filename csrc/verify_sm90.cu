// Host launcher of the Hopper verify kernel (verify_sm90.cuh): the KV pool's TMA descriptor, the
// kernel attributes and the launch. Torch-free; this translation unit also compiles alone for sm_90a to
// PTX / SASS for the CI check in tests/ops/test_sm90.py.
#include <cudaTypedefs.h>

#include <utility>

#include "verify_launch.h"
#include "verify_sm90.cuh"

namespace kdengine {

namespace {

// cuTensorMapEncodeTiled through the runtime's driver entry point (no -lcuda at link time).
PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  if (fn == nullptr) {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &found) ==
            cudaSuccess &&
        found == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }
  return fn;
}

// A [rows, 576] bf16 array in boxes of 64 dims x box_rows rows, 128-byte swizzle (the layout the
// kernel's wgmma descriptors expect); rows past the end read as zeros.
bool make_map(CUtensorMap* map, const __nv_bfloat16* data, long long rows, int box_rows) {
  const auto encode = encode_tiled();
  if (encode == nullptr) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(D_QK), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(D_QK) * 2};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(sm90::SW), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<__nv_bfloat16*>(data), dims, strides, box,
                elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The kernel's shared memory, set once per schedule and device.
template <int SCHEDULE>
cudaError_t configure_sm90() {
  static std::atomic<unsigned long long> configured{0};
  if (configured_here(configured)) return cudaSuccess;
  const cudaError_t err = cudaFuncSetAttribute(sm90::kernel_of<SCHEDULE>(),
                                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               sm90::smem_of(SCHEDULE));
  if (err == cudaSuccess) mark_here(configured);
  return err;
}

// A plain launch, one block per (row tile, split, sequence) with the row tile fastest, so the blocks that read one KV
// range are adjacent in launch order, run on neighbouring SMs and share their reads on the way to L2 (interleaving
// them the other way cost up to 7 us at 65k T=64: perf_history/kernel/stream_d70f087/; 2-CTA clusters along the
// splits, which split them apart, 3.1x the L2 read sectors and 5.7 us there: cp_7ceb62a/placement_08f6017/).
// Measured on the H200 and not adopted: the row tiles in clusters of 2 (equal within 0.6 us; of 4, two waves at
// T=64: cluster_43579f8/) and the kernel as a programmatic dependent of the one before it (0.1-0.2 us in the sweep's
// back-to-back form, nothing in the decode engine: pdlsplit_d747bc7/).
template <int SCHEDULE>
cudaError_t launch_sm90_kernel(const VerifyParams& p, const CUtensorMap& kv_map, const CUtensorMap& q_map,
                               cudaStream_t stream) {
  const cudaError_t err = configure_sm90<SCHEDULE>();
  if (err != cudaSuccess) return err;
  const dim3 grid((p.R + sm90::BM - 1) / sm90::BM, p.nsplit, p.B);
  sm90::kernel_of<SCHEDULE>()<<<grid, sm90::threads_of(SCHEDULE), sm90::smem_of(SCHEDULE), stream>>>(p, kv_map, q_map);
  return cudaGetLastError();
}

// The kernel of `schedule` (0 .. NUM_SCHEDULES - 1; any other value: BOTH), one instantiation per schedule.
template <int... S>
cudaError_t launch_schedule(int schedule, const VerifyParams& p, const CUtensorMap& kv_map, const CUtensorMap& q_map,
                            cudaStream_t stream, std::integer_sequence<int, S...>) {
  cudaError_t err = cudaSuccess;
  const bool known = ((schedule == S && ((err = launch_sm90_kernel<S>(p, kv_map, q_map, stream)), true)) || ...);
  return known ? err : launch_sm90_kernel<sm90::BOTH>(p, kv_map, q_map, stream);
}

}  // namespace

int sm90_row_tiles(int R) { return (R + sm90::BM - 1) / sm90::BM; }

bool sm90_discards_partials(int schedule) { return sm90::evict_last_partials(schedule); }

const char* sm90_unsupported(const VerifyParams& p) {
  if (p.page_size < 8) return "page_size below 8 (a TMA box row group of the 128-byte swizzle)";
  if (reinterpret_cast<uintptr_t>(p.kv) % 16 != 0 || reinterpret_cast<uintptr_t>(p.q) % 16 != 0)
    return "q or the KV pool is not 16-byte aligned";
  int device = 0, major = 0, minor = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (major != 9 || minor != 0) return "not an sm_90 device";
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, sm90::verify_sm90_kernel<sm90::BOTH>) != cudaSuccess || attr.binaryVersion != 90)
    return "the extension holds no sm_90a code";
  if (encode_tiled() == nullptr) return "cuTensorMapEncodeTiled is not available from the driver";
  return nullptr;
}

cudaError_t launch_split_sm90(const VerifyParams& p, long long pool_tokens, int schedule, cudaStream_t stream) {
  // The pool viewed as [pool_tokens, 576], one box per page (or 64 tokens of a longer page); q as [B * R, 576].
  alignas(64) CUtensorMap kv_map, q_map;
  if (!make_map(&kv_map, p.kv, pool_tokens, p.page_size < sm90::BN ? p.page_size : sm90::BN) ||
      !make_map(&q_map, p.q, static_cast<long long>(p.B) * p.R, sm90::BM))
    return cudaErrorInvalidValue;
  return launch_schedule(schedule, p, kv_map, q_map, stream, std::make_integer_sequence<int, sm90::NUM_SCHEDULES>{});
}

#ifdef KDENGINE_TIMELINE
KDENGINE_TIMELINE_EXPORT(timeline_records_sm90)  // this unit's timeline buffer (verify_timeline.cuh)
#endif

}  // namespace kdengine
