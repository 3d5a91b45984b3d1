// The body of the direct entry points (mscclpp_collective_direct in collectives/direct.cu,
// mscclpp_collective_direct_wide in direct_wide.cu), included inside each: written in the kernel
// itself rather than in an inline function, since NVVM optimises the argument checks of an inlined
// function taking the arguments by reference differently (branches instead of one predicate), which
// would change the base kernel's code. `a` is the kernel's DirectCollectiveArgs.
  mscclpp::abortWordInit(a.abort);
  mscclpp::DirectCall c;
  const mscclpp::uint32_t esize = mscclpp::collDataTypeSize(a.dtype);
  if (esize == 0 || a.nranks < 2 || a.nranks > mscclpp::kCollectiveMaxRanks || a.rank >= a.nranks ||
      a.kind > mscclpp::kDirectAllToAll || (a.kind == mscclpp::kDirectBroadcast && a.root >= a.nranks) ||
      gridDim.x > a.max_blocks || a.chunk_bytes == 0 ||
      (a.chunk_bytes & 15) != 0 || (a.slot_bytes & 15) != 0 || a.chunk_bytes > a.slot_bytes ||
      blockDim.x < a.nranks) {
    mscclpp::deviceTrap();
  }
  c.input = (const char*)a.input;
  c.output = (char*)a.output;
  c.blockBytes = a.count * esize;
  c.chunk = a.chunk_bytes;
  c.flagsOff = (8ull * a.max_blocks + 127) / 128 * 128;
  c.dataOff = c.flagsOff + 2ull * mscclpp::kDirectBuffers * mscclpp::kCollectiveMaxRanks * 8 * a.max_blocks;
  c.slotBytes = a.slot_bytes;
  c.scratch = a.scratch;
  c.maxBlocks = a.max_blocks;
  c.block = blockIdx.x;
  c.rank = a.rank;
  c.nranks = a.nranks;

  const mscclpp::uint64_t stepBytes = a.kind == mscclpp::kDirectAllReduce ? a.nranks * c.chunk : c.chunk;
  const mscclpp::uint64_t steps = (c.blockBytes + stepBytes - 1) / stepBytes;
  if (c.block >= steps) return;
  const mscclpp::uint64_t iters = (steps - c.block - 1) / gridDim.x + 1;
  mscclpp::uint64_t* seq = (mscclpp::uint64_t*)(a.scratch + 8ull * c.block);
  const mscclpp::uint64_t base = *seq;

  if (a.kind == mscclpp::kDirectAllReduce) {
    mscclpp::allReduce(a, c, base, iters);
  } else {
    mscclpp::onePhase(a, c, a.kind, base, iters);
  }

  // Every thread of the block has read the counter: advance it.
  __syncthreads();
  if (threadIdx.x == 0) *seq = base + iters;
