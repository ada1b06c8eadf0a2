// Host launchers of the verify kernels (no torch here: this translation unit also compiles alone
// to PTX for the CI check in tests/ops/test_ptx.py).
#include "static_switch.h"
#include "verify_kernel.cuh"
#include "verify_launch.h"

namespace kdengine {

int row_groups(int R) { return R <= 16 ? 1 : (R <= 32 ? 2 : 4); }

int row_tiles(int R) {
  const int m = block_m(row_groups(R));
  return (R + m - 1) / m;
}

template <int RG>
static cudaError_t launch_split(const VerifyParams& p, cudaStream_t stream) {
  static bool configured = false;  // the attribute is per function, set once
  const int smem = smem_bytes(RG);
  if (!configured) {
    cudaError_t err = cudaFuncSetAttribute(verify_split_kernel<RG>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return err;
    configured = true;
  }
  const dim3 grid((p.R + block_m(RG) - 1) / block_m(RG), p.nsplit, p.B);
  verify_split_kernel<RG><<<grid, 64 * RG, smem, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_verify(const VerifyParams& p, cudaStream_t stream) {
  cudaError_t err = ROWGROUPS_SWITCH(row_groups(p.R), RG, [&] { return launch_split<RG>(p, stream); });
  if (err != cudaSuccess) return err;
  verify_combine_kernel<<<dim3(p.R, p.B), COMBINE_THREADS, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kdengine
