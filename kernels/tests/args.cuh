// Argument structs of the HAL conformance kernels (tests/src/kernels.rs: FillU32Args,
// AtomicAddU64Args; checked against them by tests/args_check.h). Vendor-neutral.
#pragma once

#include "mscclpp/core.cuh"

namespace mscclpp {

// mscclpp_fill_u32: fills `count` 32-bit words at `dst` with `value`.
struct FillU32Args {
  uint64_t dst;
  uint64_t count;
  uint32_t value;
  uint32_t _pad;
};

// mscclpp_atomic_add_u64: every thread of the grid adds `value` to the counter at `counter`.
struct AtomicAddU64Args {
  uint64_t counter;
  uint64_t value;
};

}  // namespace mscclpp
