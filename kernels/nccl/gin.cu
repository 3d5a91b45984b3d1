// The device half of the GIN proxy (nccl/src/devapi/gin.rs): a signal add that lands after the
// data the proxy copied before it on the same stream. A host thread cannot add atomically to
// GPU memory that other ranks' proxies add to as well, so one thread of one block does it, at
// system scope, fenced so that the copies before it are visible first.
// Vendor-neutral: the same text is compiled by NVRTC and by hipRTC.
#include "mscclpp/core.cuh"

namespace mscclpp {

// Mirrored by `GinAddArgs` in nccl/src/devapi/gin.rs.
struct GinAddArgs {
  uint64_t addr;   // device address of the u64 to add to
  uint64_t value;  // what to add
};

}  // namespace mscclpp

extern "C" __global__ void mscclpp_gin_signal_add(mscclpp::GinAddArgs a) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    mscclpp::fenceSystem();
    mscclpp::fetchAddAcqRelSystem((mscclpp::uint64_t*)a.addr, a.value);
  }
}
