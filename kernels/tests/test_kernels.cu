// The HAL conformance kernels (their module and host versions: tests/src/kernels.rs).
// Including the layout checks here makes every compile of this module check the device layouts
// against the Rust definitions.
#include "mscclpp/mscclpp.cuh"
#include "mscclpp/layout_check.h"
#include "tests/args.cuh"
#include "tests/args_check.h"

// Fills a.count words at a.dst with a.value; any grid shape (grid-stride loop).
extern "C" __global__ void mscclpp_fill_u32(mscclpp::FillU32Args a) {
  const mscclpp::uint64_t threads = (mscclpp::uint64_t)gridDim.x * gridDim.y * gridDim.z * blockDim.x * blockDim.y * blockDim.z;
  const mscclpp::uint64_t block = ((mscclpp::uint64_t)blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  const mscclpp::uint64_t thread = ((mscclpp::uint64_t)threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
  const mscclpp::uint64_t perBlock = (mscclpp::uint64_t)blockDim.x * blockDim.y * blockDim.z;
  mscclpp::uint32_t* dst = (mscclpp::uint32_t*)a.dst;
  for (mscclpp::uint64_t i = block * perBlock + thread; i < a.count; i += threads) dst[i] = a.value;
}

// Every thread of the grid adds a.value to the 64-bit counter at a.counter (acquire-release,
// system scope: the counter may be host-mapped or a peer's memory).
extern "C" __global__ void mscclpp_atomic_add_u64(mscclpp::AtomicAddU64Args a) {
  mscclpp::fetchAddAcqRelSystem((mscclpp::uint64_t*)a.counter, a.value);
}
