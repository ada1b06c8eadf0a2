// Merge 7's padding (csrc/verify_kernel.cu launch_combine): host arithmetic only, no CUDA, so that
// tests/ops/test_merge_spread.py compiles it with the host C++ compiler and checks it on every device's limits.
#pragma once

#include <cstddef>

namespace kdengine {

// A device's shared-memory limits (cudaDeviceGetAttribute): SMs, bytes per SM, the opt-in maximum per block, the
// bytes the system reserves per block. All zero when they could not be read.
struct SmemLimits {
  int sms = 0, per_sm = 0, optin = 0, reserved = 0;
};

constexpr long long SMEM_STEP = 128;  // shared memory is allocated to a block in steps of this many bytes

// The dynamic shared memory of a merge-7 block: the fewest bytes (whole steps) with which k = ceil(blocks / SMs) blocks
// fit on an SM and k + 1 do not, so the grid's blocks spread over every SM instead of piling onto the first ones the
// split grid frees. `own` (the merge's own bytes) where no step does both, where own already caps an SM at k, where the
// padding would pass the opt-in maximum, or where the limits are unknown.
inline size_t merge_spread_smem(const SmemLimits& d, long long blocks, size_t own) {
  if (d.sms <= 0 || d.per_sm <= 0 || d.optin <= 0 || d.reserved < 0 || blocks <= 0) return own;
  const long long k = (blocks + d.sms - 1) / d.sms;
  // (k + 1) * (smem + reserved) > per_sm  <=>  smem >= per_sm / (k + 1) + 1 - reserved
  long long smem = d.per_sm / (k + 1) + 1 - d.reserved;
  smem = (smem + SMEM_STEP - 1) / SMEM_STEP * SMEM_STEP;
  if (smem <= static_cast<long long>(own) || smem > d.optin || k * (smem + d.reserved) > d.per_sm) return own;
  return static_cast<size_t>(smem);
}

}  // namespace kdengine
