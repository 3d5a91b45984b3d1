// A grid-wide barrier for kernels whose blocks are all resident at once (launch no more blocks
// than the device can hold). Device-only state: put one in zeroed device memory (for instance a
// `__device__ mscclpp::DeviceSyncer` global) and never reset it; it stays consistent across
// launches, so it replays in CUDA graphs. Vendor-neutral.
#pragma once

#include "mscclpp/core.cuh"
#include "mscclpp/spin.cuh"

namespace mscclpp {

struct DeviceSyncer {
  // The barrier's sense: flipped by the last block to arrive.
  uint32_t flag;
  // Blocks arrived at the current barrier (wraps to 0 with the last one).
  uint32_t count;

  // Waits until all `numBlocks` blocks of the grid have called sync.
  MSCCLPP_DEVICE_INLINE void sync(uint32_t numBlocks, int64_t maxSpinCount = MSCCLPP_DEFAULT_MAX_SPIN) {
    __syncthreads();
    if (numBlocks <= 1) return;
    if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
      // The flag cannot change before this block arrives, so its value now is this barrier's
      // starting sense, whichever barrier this block passed last.
      const uint32_t sense = loadRelaxedDevice(&flag) ^ 1u;
      // Acquire-release: this block's writes reach the last arriver, which releases them to all.
      if (fetchIncWrapAcqRelDevice(&count, numBlocks - 1) == numBlocks - 1) {
        storeReleaseDevice(&flag, sense);
      } else {
        spinUntil([&] { return loadAcquireDevice(&flag) == sense; }, maxSpinCount);
      }
    }
    __syncthreads();
  }
};

}  // namespace mscclpp
