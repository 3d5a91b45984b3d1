// A compute load for the overlap benchmark (`mscclpp-perf overlap`; its module and host version:
// mscclpp/src/bench_compute.rs): a GEMM-like kernel that keeps every SM busy with fused
// multiply-adds on bf16 operands (converted to f32, as a GEMM's accumulation is), streaming its
// operand array through the caches on every pass. Vendor-neutral: NVRTC and hipRTC compile it.
#include "mscclpp/core.cuh"
#include "mscclpp/numeric.cuh"

namespace mscclpp {

// Mirror of `ComputeArgs` (mscclpp/src/bench_compute.rs; bench/compute_check.h checks it).
struct ComputeArgs {
  uint64_t data;   // `words` u32 words, each two bf16 operands
  uint64_t out;    // one u32 per thread of the grid
  uint64_t words;
  uint32_t passes; // passes over `data`
  uint32_t fmas;   // rounds of four FMAs per word
};

}  // namespace mscclpp

#include "bench/compute_check.h"

// Every thread of the grid takes words `tid, tid + n, ...` on every pass; four independent
// accumulators keep the FMA pipes full; the sum is stored so that nothing is optimised away.
extern "C" __global__ void mscclpp_bench_compute(mscclpp::ComputeArgs a) {
  const mscclpp::uint64_t tid = (mscclpp::uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const mscclpp::uint64_t n = (mscclpp::uint64_t)gridDim.x * blockDim.x;
  const mscclpp::uint32_t* in = reinterpret_cast<const mscclpp::uint32_t*>(a.data);
  float c0 = 0.f, c1 = 1.f, c2 = 2.f, c3 = 3.f;
  for (mscclpp::uint32_t p = 0; p < a.passes; ++p) {
    for (mscclpp::uint64_t i = tid; i < a.words; i += n) {
      const mscclpp::uint32_t w = in[i];
      const float x = mscclpp::bf16ToFloat(w);
      const float y = mscclpp::bf16ToFloat(w >> 16);
      for (mscclpp::uint32_t k = 0; k < a.fmas; ++k) {
        c0 = fmaf(c0, x, y);
        c1 = fmaf(c1, y, x);
        c2 = fmaf(c2, x, x);
        c3 = fmaf(c3, y, y);
      }
    }
  }
  reinterpret_cast<mscclpp::uint32_t*>(a.out)[tid] = mscclpp::floatBits(c0 + c1 + c2 + c3);
}
