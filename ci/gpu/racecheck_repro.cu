// Minimal kernels for compute-sanitizer racecheck: is the report on the sm90 PAIR schedule's row-table
// hand-off (csrc/verify_sm90.cuh; perf_history/kernel/sm90_pairload_752b824/sass_racecheck_sites.txt) about
// the hand-off itself, or about the block around it? Each variant runs the same hand-off between two
// 128-thread warpgroups, which is race-free by the PTX barrier rules: quad leaders store their two rows'
// values into a shared table, a named barrier of the 256 threads (bar.sync 5, 256), then every thread
// loads the other warpgroup's values of its rows. The variants change one thing each:
//   0  a block of 256 threads (the two warpgroups only)
//   1  384 threads; the third warpgroup returns at once (the sm90 kernel's producer threads but one per warp)
//   2  384 threads; the third warpgroup waits at the end instead (__syncthreads after the hand-off, no exit)
//   3  as 1, with setmaxnreg (producer dec 40, consumers inc 232), as in the sm90 kernel
//   4  as 1, looped 8 times over a 2-slot table by step parity, one side signalling with bar.arrive
//      (PAIR's row-max form: writer bar.arrive 9, reader bar.sync 9; slots reused two steps later)
//   5  as 0, but the hand-off is barrier 0 of the whole block (__syncthreads)
//   6  the sm90 SEESAW2 schedule's barrier sequence, 256 threads, 4 steps over 2-slot tables: warpgroup 0
//      stores m' and arrives (bar 11), syncs on bar 12 and loads m'', stores P_a and arrives (bar 13), syncs on
//      bar 14 and loads P_b; warpgroup 1 syncs on 11, loads m', stores m'' and arrives on 12, stores P_b and
//      arrives on 14, syncs on 13 and loads P_a; then the row sums through a table around a bar.sync of both.
//   7  as 6, with warpgroup 0 also syncing its own 128 threads once (bar 1, the tail tile's zeroing)
//   8  as 7, the four one-way hand-offs on mbarriers instead (128 arrivals each; the reader waits on the
//      step's parity): no bar.arrive left
//   9  as 6 on mbarriers
// Variants 6-9 (trace of the SEESAW2 kernel under --racecheck-trace-sync, perf_history/kernel/
// s2race_6a95ae1/): racecheck logs bar.sync as a barrier but bar.arrive only as the warpsync before it.
// H200 result (perf_history/kernel/racecheck_repro_9bb22a7/): racecheck reports nothing on any of the six,
// so the pair schedule's reports are not about this hand-off form, the exited producer threads, setmaxnreg
// or bar.arrive as the release; what the kernel adds around it (wgmma in flight, TMA writes to the same
// block's shared memory, dynamic shared memory) is the next suspect to add here one at a time.
// Build: nvcc -std=c++17 -O3 -lineinfo -gencode=arch=compute_90a,code=sm_90a ci/gpu/racecheck_repro.cu -o repro
// Run:   compute-sanitizer --tool racecheck ./repro <variant>   (prints the check sum; rc 0 when it matches)
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }

// One hand-off: thread t (of 256) holds rows r0 = (t % 128) / 4 and r0 + 32 of its warpgroup's 64; its
// quad leader publishes them; after the barrier it reads the other warpgroup's values of the same rows.
__device__ float handoff(float* tab, int t, float v, int slot, bool use_syncthreads) {
  const int w = t / 128, r0 = (t % 128) / 4;
  if (t % 4 == 0) {
    tab[slot + w * 64 + r0] = v;
    tab[slot + w * 64 + r0 + 32] = v + 1.f;
  }
  __syncwarp();
  if (use_syncthreads) __syncthreads(); else bar_sync(5, 256);
  return tab[slot + (1 - w) * 64 + r0] + tab[slot + (1 - w) * 64 + r0 + 32];
}

__device__ __forceinline__ void mb_init(uint64_t* b, int n) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"((unsigned)__cvta_generic_to_shared(b)), "r"(n) : "memory");
}
__device__ __forceinline__ void mb_arrive(uint64_t* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"((unsigned)__cvta_generic_to_shared(b)) : "memory");
}
__device__ __forceinline__ void mb_wait(uint64_t* b, int parity) {
  asm volatile("{\n.reg .pred done;\nWAIT:\nmbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n@!done bra WAIT;\n}\n"
               ::"r"((unsigned)__cvta_generic_to_shared(b)), "r"(parity) : "memory");
}

// SEESAW2's hand-off sequence (variants 6-9). Returns the thread's check value.
__device__ float seesaw2_form(int t, bool mbar, bool wg_sync) {
  __shared__ float mid[2][64], mx[2][64], pa[64], pb[64], sums[2][64];
  __shared__ uint64_t bars[4];  // m' ready, m'' ready, P_a ready, P_b ready
  const int w = t / 128, wt = t % 128, r = wt / 2 % 64;
  if (t < 4) mb_init(&bars[t], 128);
  __syncthreads();
  float acc = 0.f;
  for (int i = 0; i < 4; ++i) {
    const int slot = i & 1, par = i & 1;
    if (w == 0) {
      if (wt % 2 == 0) mid[slot][r] = float(i + r);
      if (mbar) mb_arrive(&bars[0]); else bar_arrive(11, 256);
      if (wg_sync && i == 1) bar_sync(1, 128);
      if (mbar) mb_wait(&bars[1], par); else bar_sync(12, 256);
      acc += mx[slot][r];
      if (wt % 2 == 0) pa[r] = float(2 * i + r);
      if (mbar) mb_arrive(&bars[2]); else bar_arrive(13, 256);
      if (mbar) mb_wait(&bars[3], par); else bar_sync(14, 256);
      acc += pb[r];
    } else {
      if (mbar) mb_wait(&bars[0], par); else bar_sync(11, 256);
      const float m1 = mid[slot][r];
      if (wt % 2 == 0) mx[slot][r] = m1 + 1.f;
      if (mbar) mb_arrive(&bars[1]); else bar_arrive(12, 256);
      if (wt % 2 == 0) pb[r] = float(3 * i + r);
      if (mbar) mb_arrive(&bars[3]); else bar_arrive(14, 256);
      if (mbar) mb_wait(&bars[2], par); else bar_sync(13, 256);
      acc += m1 + pa[r];
    }
    // P_a / P_b are rewritten next step: each side's read is done before the other's next write (the
    // writer of P_a waits on m'' of the next step, which the reader publishes after its read; likewise P_b).
  }
  if (wt % 2 == 0) sums[w][r] = acc;
  bar_sync(5, 256);
  return acc + sums[1 - w][r];
}

__global__ void __launch_bounds__(384, 1) repro(int variant, float* out) {
  __shared__ float tab[2 * 128];
  if (variant >= 6) {
    if (threadIdx.x < 256) out[threadIdx.x] = seesaw2_form(threadIdx.x, variant >= 8, variant == 7 || variant == 8);
    return;
  }
  const int t = threadIdx.x;
  if (variant == 3) {
    if (t >= 256) asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    else asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  }
  if (t >= 256 && (variant == 1 || variant == 3 || variant == 4)) return;
  if (t >= 256) {  // variants 2 and 5: the third warpgroup stays for the block barriers
    if (variant == 5) __syncthreads();
    __syncthreads();
    return;
  }
  float acc = 0.f;
  if (variant == 4) {  // the PAIR form: warpgroup 1 writes, arrives; warpgroup 0 syncs, reads; 2 slots
    for (int i = 0; i < 8; ++i) {
      const int slot = (i & 1) * 128, w = t / 128, r0 = (t % 128) / 4;
      if (w == 1) {
        if (t % 4 == 0) tab[slot + r0] = float(i + r0);
        __syncwarp();
        bar_arrive(9, 256);
        bar_sync(8, 256);  // warpgroup 0 is done with the step (it arrives after its read)
      } else {
        bar_sync(9, 256);
        acc += tab[slot + r0];
        bar_arrive(8, 256);
      }
    }
  } else {
    acc = handoff(tab, t, float(t / 4), 0, variant == 5);
  }
  if (variant == 2) __syncthreads();
  out[t] = acc;
}

int main(int argc, char** argv) {
  const int variant = argc > 1 ? atoi(argv[1]) : 0;
  const int threads = variant == 0 || variant >= 6 ? 256 : 384;
  float* out = nullptr;
  cudaMalloc(&out, 384 * sizeof(float));
  cudaMemset(out, 0, 384 * sizeof(float));
  repro<<<1, threads>>>(variant, out);
  cudaError_t err = cudaDeviceSynchronize();
  float h[384];
  cudaMemcpy(h, out, sizeof(h), cudaMemcpyDeviceToHost);
  double sum = 0;
  for (int i = 0; i < 256; ++i) sum += h[i];
  // expected: handoff variants: each thread reads (other w's r0 value) + (value + 1) = 2 * (r0 + 32 * w') + 1 ...
  double want = 0;
  for (int t = 0; t < 256; ++t) {
    const int w = t / 128, r0 = (t % 128) / 4;
    if (variant >= 6) {
      const int r = (t % 128) / 2 % 64;
      double a[2] = {0, 0};
      for (int w = 0; w < 2; ++w)
        for (int i = 0; i < 4; ++i) a[w] += w == 0 ? (i + r + 1) + (3 * i + r) : (i + r) + (2 * i + r);
      want += a[t / 128] + a[1 - t / 128];
    } else if (variant == 4) {
      if (w == 0) for (int i = 0; i < 8; ++i) want += i + r0;
    } else {
      const float v = float(((1 - w) * 128 + r0 * 4) / 4);  // the other warpgroup's quad leader of row r0
      want += 2.0 * v + 1.0;
    }
  }
  printf("variant %d: %s, sum %.1f want %.1f\n", variant, cudaGetErrorString(err), sum, want);
  return err == cudaSuccess && sum == want ? 0 : 1;
}
