// pybind11 binding: torch tensors in, one launch of the split kernel and the merge on the current
// stream. Shapes were validated in Python (kdengine.ops.validate); this file only checks what the
// kernels need to be memory safe. The torch custom op is registered in kdengine/ops/cuda_backend.py.
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include <cmath>
#include <initializer_list>
#include <string>
#include <vector>

#include "verify_launch.h"
#ifdef KDENGINE_TIMELINE
#include "verify_timeline.cuh"
#endif

namespace {

template <typename T>
T* ptr(const at::Tensor& t) {
  return reinterpret_cast<T*>(t.data_ptr());
}

// A number in a check's message, formatted here (std::to_string) instead of by TORCH_CHECK's stream insertion: on the
// H200 image (torch 2.11) a failing TORCH_CHECK whose arguments include an int64 or a double killed the process with
// SIGSEGV, as did the same check in a one-function extension, whatever the C++ standard; strings and dtypes were
// fine (perf_history/kernel/pdl_288100a/, binding_fix_*/). Every number in a message below goes through this.
std::string num(int64_t v) { return std::to_string(v); }

// The launch parameters of one call: checks what the kernels need to be memory safe, then fills p.
// out [B, T, H, 512] bf16, lse [B, T, H] fp32, part_out [B, nsplit, T*H, 512] bf16, part_lse [B, nsplit, T*H] fp32.
kdengine::VerifyParams make_params(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& page_table,
                                   const at::Tensor& prefix_len, const at::Tensor& mask_bits, at::Tensor& out,
                                   at::Tensor& lse, at::Tensor& part_out, at::Tensor& part_lse, double sm_scale,
                                   int64_t nsplit) {
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&q, &kv, &page_table, &prefix_len, &mask_bits, &out, &lse, &part_out, &part_lse}) {
    TORCH_CHECK(t->is_cuda() && t->is_contiguous(), "kdengine verify: every tensor must be contiguous on the GPU");
  }
  const int page_size = static_cast<int>(kv.size(1));
  TORCH_CHECK(page_size > 0 && (page_size & (page_size - 1)) == 0, "page_size must be a power of two");
  // the merge indexes one sequence's partial rows with 32-bit offsets in 16-byte units
  TORCH_CHECK(nsplit * q.size(1) * q.size(2) < (int64_t{1} << 26),
              "nsplit * T * H must be below 2^26 (the merge's 32-bit offsets), got nsplit " + num(nsplit) + " at T * H " +
                  num(q.size(1) * q.size(2)));
  TORCH_CHECK(part_out.size(1) == nsplit && part_lse.size(1) == nsplit, "partials must hold nsplit splits");
  TORCH_CHECK(part_out.scalar_type() == at::kBFloat16 && part_lse.scalar_type() == at::kFloat,
              "partials: part_out must be bf16 and part_lse fp32, got ", part_out.scalar_type(), " and ",
              part_lse.scalar_type());
  kdengine::VerifyParams p{};
  p.q = ptr<const __nv_bfloat16>(q);
  p.kv = ptr<const __nv_bfloat16>(kv);
  p.page_table = ptr<const int>(page_table);
  p.prefix_len = ptr<const int>(prefix_len);
  p.mask_bits = ptr<const int>(mask_bits);
  p.part_out = ptr<__nv_bfloat16>(part_out);
  p.part_lse = ptr<float>(part_lse);
  p.out = ptr<__nv_bfloat16>(out);
  p.lse = ptr<float>(lse);
  p.B = static_cast<int>(q.size(0));
  p.T = static_cast<int>(q.size(1));
  p.H = static_cast<int>(q.size(2));
  p.R = p.T * p.H;
  p.W = static_cast<int>(mask_bits.size(2));
  p.page_size = page_size;
  p.page_shift = __builtin_ctz(page_size);
  p.max_pages = static_cast<int>(page_table.size(1));
  p.nsplit = static_cast<int>(nsplit);
  p.scale_log2 = static_cast<float>(sm_scale * 1.4426950408889634);
  return p;
}

// The mma.sync split kernel + merge.
void launch(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& page_table, const at::Tensor& prefix_len,
            const at::Tensor& mask_bits, at::Tensor& out, at::Tensor& lse, at::Tensor& part_out, at::Tensor& part_lse,
            double sm_scale, int64_t nsplit, int64_t col_warps, int64_t max_row_groups, int64_t pingpong,
            int64_t combine, bool merge_early) {
  TORCH_CHECK(col_warps == 2 || col_warps == 4 || col_warps == 8 || col_warps == 16 || col_warps == 32,
              "col_warps must be 2, 4, 8, 16 or 32, got " + num(col_warps));
  TORCH_CHECK(pingpong == 0 || pingpong == 1 || (pingpong >= 2 && pingpong < kdengine::NUM_PINGPONGS && col_warps == 16),
              "pingpong must be 0, 1 or (col_warps 16 only) 2.." + num(kdengine::NUM_PINGPONGS - 1) + ", got " +
                  num(pingpong) + " with col_warps " + num(col_warps));
  TORCH_CHECK((combine >= 0 && combine <= 4 && combine != 3) || combine == 7,
              "combine must be 0, 1, 2, 4 or 7 (3 was retired), got " + num(combine));
  TORCH_CHECK(max_row_groups == 1 || max_row_groups == 2 || max_row_groups == 4, "max_row_groups must be 1, 2 or 4");
  const c10::cuda::CUDAGuard guard(q.device());
  kdengine::VerifyParams p =
      make_params(q, kv, page_table, prefix_len, mask_bits, out, lse, part_out, part_lse, sm_scale, nsplit);
  p.merge_early = merge_early ? 1 : 0;
  const cudaError_t err = kdengine::launch_verify(p, static_cast<int>(col_warps), static_cast<int>(max_row_groups),
                                                   static_cast<int>(pingpong), static_cast<int>(combine),
                                                   c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "kdengine verify launch failed: ", cudaGetErrorString(err));
}

// The Hopper (sm_90a, wgmma + TMA) split kernel, then the merge kernel `combine` (0, 1, 2, 4 or 7; -1: none, the
// split kernel alone: out / lse not written, for timing the merge's share only).
void launch_sm90(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& page_table,
                 const at::Tensor& prefix_len, const at::Tensor& mask_bits, at::Tensor& out, at::Tensor& lse,
                 at::Tensor& part_out, at::Tensor& part_lse, double sm_scale, int64_t nsplit, int64_t schedule,
                 int64_t combine, bool merge_early) {
  TORCH_CHECK((combine >= -1 && combine <= 4 && combine != 3) || combine == 7,
              "combine must be -1, 0, 1, 2, 4 or 7 (3 was retired), got " + num(combine));
  const c10::cuda::CUDAGuard guard(q.device());
  kdengine::VerifyParams p =
      make_params(q, kv, page_table, prefix_len, mask_bits, out, lse, part_out, part_lse, sm_scale, nsplit);
  const char* reason = kdengine::sm90_unsupported(p);
  TORCH_CHECK(reason == nullptr, "kdengine verify sm90 path: ", reason ? reason : "");
  p.merge_early = merge_early ? 1 : 0;
  const cudaError_t err = kdengine::launch_verify_sm90(p, kv.size(0) * kv.size(1), static_cast<int>(schedule), static_cast<int>(combine),
                                                        c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "kdengine verify sm90 launch failed: ", cudaGetErrorString(err));
}

// Why the sm90 path cannot run with this page size / pool on the current device ("" when it can).
std::string sm90_unsupported(const at::Tensor& kv) {
  const c10::cuda::CUDAGuard guard(kv.device());
  kdengine::VerifyParams p{};
  p.kv = ptr<const __nv_bfloat16>(kv);
  p.page_size = static_cast<int>(kv.size(1));
  const char* reason = kdengine::sm90_unsupported(p);
  return reason ? reason : "";
}

#ifdef KDENGINE_TIMELINE
// --- the timeline build only (-DKDENGINE_TIMELINE; csrc/verify_timeline.cuh) --------------------------------------
// Every translation unit's buffer as an int64 [SLOTS, 2] view on the current device (no copy): per record t_ns, then
// block | kind << 32 | smid << 48 (the Record layout, little-endian).
std::vector<at::Tensor> timeline_buffers() {
  const auto options = at::TensorOptions().dtype(at::kLong).device(at::kCUDA, c10::cuda::current_device());
  std::vector<at::Tensor> views;
  for (void* ptr : {kdengine::timeline_records_sm90(), kdengine::timeline_records_mma()}) {
    TORCH_CHECK(ptr != nullptr, "kdengine timeline: the buffer's device address is not available");
    views.push_back(torch::from_blob(ptr, {kdengine::timeline::SLOTS, 2}, options));
  }
  return views;
}

// Zeroes every record (on the current stream: before the replay it precedes).
void timeline_reset() {
  for (at::Tensor& view : timeline_buffers()) view.zero_();
}

// The records written since the reset, [n, 4] int64 on the CPU: kind, block, smid, t_ns (the sm90 unit's first, each
// unit's in slot order: by kind, then block). Waits for the current stream.
at::Tensor timeline_read() {
  std::vector<at::Tensor> rows;
  for (const at::Tensor& view : timeline_buffers()) {
    const at::Tensor host = view.cpu();
    const at::Tensor written = host.index({host.select(1, 0) != 0});  // t_ns 0: not written
    const at::Tensor tag = written.select(1, 1);
    rows.push_back(at::stack({tag.bitwise_right_shift(32).bitwise_and(0xffff), tag.bitwise_and(0xffffffff),
                              tag.bitwise_right_shift(48).bitwise_and(0xffff), written.select(1, 0)},
                             1));
  }
  return at::cat(rows, 0);
}
#endif

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "kdengine MLA tree-verify attention (split-KV, mma.sync)";
  m.def("launch", &launch, "split kernel + log-sum-exp merge into out/lse");
  m.def("blocks_per_sm", &kdengine::blocks_per_sm,
        "resident split blocks per SM for (R, col_warps, row_groups, pingpong)");
  m.def("row_tiles", &kdengine::row_tiles, "row tiles per (sequence, split) for R = T * H rows");
  m.def("launch_sm90", &launch_sm90, "Hopper wgmma split kernel + log-sum-exp merge into out/lse");
  m.def("sm90_unsupported", &sm90_unsupported, "why the sm90 path cannot run here ('' when it can)");
  m.def("sm90_row_tiles", &kdengine::sm90_row_tiles, "64-row tiles per (sequence, split) of the sm90 kernel");
#ifdef KDENGINE_TIMELINE
  m.def("timeline_reset", &timeline_reset, "zero the in-kernel timeline records (the -DKDENGINE_TIMELINE build)");
  m.def("timeline_read", &timeline_read, "the timeline records since the reset: CPU int64 [n, 4] kind, block, smid, t_ns");
  m.attr("TIMELINE_SLOTS") = kdengine::timeline::SLOTS;
#endif
  // The shape contract (verify_launch.h), checked against kdengine/ops/shapes.py on load.
  m.attr("D_QK") = kdengine::D_QK;
  m.attr("DV") = kdengine::DV;
  m.attr("D_ROPE") = kdengine::D_ROPE;
  m.attr("ROWS_PER_GROUP") = kdengine::ROWS_PER_GROUP;
  m.attr("MAX_ROW_GROUPS") = kdengine::MAX_ROW_GROUPS;
  m.attr("NUM_PINGPONGS") = kdengine::NUM_PINGPONGS;
}
