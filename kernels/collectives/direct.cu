// The direct module of the base element types — f32, f16, bf16, i32, u32 —
// (collectives/src/algorithms/direct/module.rs): the direct and read entry points over the body in
// collectives/direct.cuh. The other types' are in collectives/direct_wide.cu, a module of its own that only a
// process using them compiles, so that these kernels keep their registers (the direct kernel runs 896 threads
// per block on large messages).
#define MSCCLPP_COLLECTIVE_WIDE 0
#include "collectives/direct.cuh"

// Every collective by the direct algorithm (collectives/src/algorithms/direct/spec.md).
// Launch with a one-dimensional grid of at most `max_blocks` blocks, all resident at once (block
// b waits for block b of the peers: a block left unscheduled on one rank could stall the others),
// at least `nranks` threads per block, and the same grid, kind, count, dtype, op, chunk_bytes,
// slot_bytes and max_blocks on every rank.
extern "C" __global__ void mscclpp_collective_direct(mscclpp::DirectCollectiveArgs a) {
#include "collectives/direct_entry.cuh"
}

// All-reduce by the read algorithm (collectives/src/algorithms/read/spec.md). Launch with the grid of
// ReadCollectiveArgs::grid (the same on every rank, at most `max_blocks` blocks, all resident), at
// least `nranks` threads per block, and the same count, dtype and op on every rank.
extern "C" __global__ void mscclpp_collective_read_allreduce(mscclpp::ReadCollectiveArgs a) {
  mscclpp::readAllReduce(a);
}
