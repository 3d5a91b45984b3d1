// The direct module of the wide element types — f64, i64, u64, i8, u8, float8 e4m3 and e5m2 —
// (collectives/src/algorithms/direct/module.rs): the same kernels as collectives/direct.cu, over the same body
// (collectives/direct.cuh), for these types only; compiled on first use of one of them.
#define MSCCLPP_COLLECTIVE_WIDE 1
#include "collectives/direct.cuh"

// Every collective by the direct algorithm, for these types (launched as mscclpp_collective_direct).
extern "C" __global__ void mscclpp_collective_direct_wide(mscclpp::DirectCollectiveArgs a) {
#include "collectives/direct_entry.cuh"
}

// All-reduce by the read algorithm, for these types (launched as mscclpp_collective_read_allreduce).
extern "C" __global__ void mscclpp_collective_read_allreduce_wide(mscclpp::ReadCollectiveArgs a) {
  mscclpp::readAllReduce(a);
}
