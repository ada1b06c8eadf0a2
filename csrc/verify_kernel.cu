// Host launchers of the verify kernels (no torch here: this translation unit also compiles alone
// to PTX for the CI check in tests/ops/test_ptx.py).
#include "static_switch.h"
#include "verify_kernel.cuh"
#include "verify_launch.h"

namespace kdengine {

int row_groups(int R) { return R <= 16 ? 1 : (R <= 32 ? 2 : 4); }

int row_tiles(int R) {
  const int m = 16 * row_groups(R);
  return (R + m - 1) / m;
}

template <class C>
static cudaError_t launch_split(const VerifyParams& p, cudaStream_t stream) {
  static bool configured = false;  // the attribute is per function, set once
  if (!configured) {
    const cudaError_t err =
        cudaFuncSetAttribute(verify_split_kernel<C>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM);
    if (err != cudaSuccess) return err;
    configured = true;
  }
  const dim3 grid((p.R + C::BLOCK_M - 1) / C::BLOCK_M, p.nsplit, p.B);
  verify_split_kernel<C><<<grid, C::THREADS, C::SMEM, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_verify(const VerifyParams& p, int col_warps, cudaStream_t stream) {
  cudaError_t err = ROWGROUPS_SWITCH(row_groups(p.R), RG, [&] {
    return COLWARPS_SWITCH(col_warps, CW, [&] { return launch_split<Cfg<RG, CW>>(p, stream); });
  });
  if (err != cudaSuccess) return err;
  verify_combine_kernel<<<dim3(p.R, p.B), COMBINE_THREADS, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kdengine
