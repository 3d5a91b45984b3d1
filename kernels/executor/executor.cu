// The executor's interpreter kernel: one launch runs a rank's flattened execution plan (see
// executor/src/flat.rs and docs/executor.md), block b of the grid running threadblock b of the
// plan, op after op, with the semantics of the host interpreter (executor/src/kernel.rs), which is
// the reference. Vendor-neutral: the same text is compiled by NVRTC and by hipRTC (the module of
// executor/src/kernel.rs, with the host kernel beside it).
//
// Every thread of a block takes part in every op: data ops stride over 16-byte units (8-byte
// words, or elements, where the addresses are not aligned); channel ops give one channel to a
// thread (thread k signals, waits on or posts to the op's k-th channel), so that a signal leaves
// through one thread per peer as the device semaphores want. Blocks meet between ops with
// __syncthreads (the op is staged in shared memory), which also orders a channel's wait before
// the data reads of the block's other threads, and their writes before a signal.
//
// The LL flag is one per launch: the launch's blocks read the last flag from the context's state
// words and use the next; the last block to finish stores it (every block has read it by then).
// Every wait gives up on the communicator's abort word (ExecutorArgs::abort; mscclpp/core.cuh):
// a peer that died ends the kernel without a trap — the block that saw it stops at its next
// meeting between ops, the others give up at their next read of the word — and the host reports
// the failure (the next execution is refused, naming the rank). A trap would end the whole
// context, the process's other work with it. Every wait is also bounded (MSCCLPP_DEFAULT_MAX_SPIN
// polls, as spinUntil): a peer that hangs without dying ends the kernel with an error instead of
// hanging the GPU. What the host interpreter reports as an error (an index out of its table, an
// unknown code, misaligned packets) is checked before each op runs (execValid). Both trap at one
// place: the waits here return false instead of trapping where they are (execSpin), because
// LLVM's AMDGPU trap lowering wants the queue pointer in fixed registers at every trap site,
// which a kernel of this size cannot give it at dozens of them (hipRTC fails with "no registers
// from class available to allocate").
//
// execSpin reads the abort word; nothing here inlines spinUntil, whose trap would be another site.
#define MSCCLPP_DEVICE_ABORT 1
#include "mscclpp/core.cuh"
#include "mscclpp/spin.cuh"
#include "mscclpp/device_syncer.cuh"
#include "mscclpp/memory_channel.cuh"
#include "mscclpp/numeric.cuh"
#include "mscclpp/packet.cuh"
#include "mscclpp/port_channel.cuh"
#include "mscclpp/semaphore.cuh"
#include "executor/args.cuh"
#include "executor/args_check.h"

namespace mscclpp {

// Most threads per block (the planner clamps the plan's num_threads_per_block to it).
constexpr uint32_t kExecMaxThreads = 1024;
// ExecutorArgs::op when each op's own operator applies.
constexpr uint32_t kExecOwnOp = 0xffffffffu;

// A data offset into each op's ranges (pipelines) and the most bytes it may take.
struct ExecSlice {
  uint64_t offset;
  uint64_t unit;
};

// What every op of a block needs: the plan header (in shared memory), the arguments, this
// launch's flag and scratch half, and the calling thread.
struct ExecCtx {
  const DevicePlan* plan;
  const ExecutorArgs* args;
  uint32_t flag;
  uint64_t half;
  uint32_t tid;
  uint32_t nt;
};

// Bytes of a `size`-byte range that slice `s` covers.
MSCCLPP_DEVICE_INLINE uint64_t execSliced(uint32_t size, ExecSlice s) {
  const uint64_t rest = (uint64_t)size > s.offset ? (uint64_t)size - s.offset : 0;
  return rest < s.unit ? rest : s.unit;
}

// The scratch half offset when `r` points into a scratch buffer (ours or a peer's: every rank's
// launch uses the same flag, hence the same half).
MSCCLPP_DEVICE_INLINE uint64_t execHalfOf(const ExecCtx& c, const FlatRef& r) {
  return r.buffer == kExecBufferScratch ? c.half : 0;
}

// The accessors below take what execValid has checked: references of a known buffer and kind,
// indexes inside their tables.

MSCCLPP_DEVICE_INLINE char* execLocalBase(const ExecCtx& c, uint32_t buffer) {
  if (buffer == kExecBufferInput) return (char*)c.args->input;
  if (buffer == kExecBufferOutput) return (char*)c.args->output;
  return (char*)(c.args->scratch + c.half);
}

MSCCLPP_DEVICE_INLINE uint64_t execRemoteAddr(const ExecCtx& c, uint32_t id) {
  return ((const uint64_t*)c.plan->remote_addrs)[id];
}

// The address of `r` plus `extra` bytes, for local and memory-channel references.
MSCCLPP_DEVICE_INLINE char* execAddr(const ExecCtx& c, const FlatRef& r, uint64_t extra) {
  if (r.kind == kExecRefLocal) return execLocalBase(c, r.buffer) + r.offset + extra;
  return (char*)(execRemoteAddr(c, r.id) + execHalfOf(c, r) + r.offset + extra);
}

MSCCLPP_DEVICE_INLINE uint32_t execRemoteId(const ExecCtx& c, uint32_t id) {
  return ((const uint32_t*)c.plan->remote_ids)[id];
}

MSCCLPP_DEVICE_INLINE BaseMemoryChannelDeviceHandle execMemoryChannel(const ExecCtx& c, uint32_t idx) {
  return ((const BaseMemoryChannelDeviceHandle*)c.plan->memory_channels)[idx];
}

MSCCLPP_DEVICE_INLINE PortChannelDeviceHandle execPortChannel(const ExecCtx& c, uint32_t idx) {
  return ((const PortChannelDeviceHandle*)c.plan->port_channels)[idx];
}

// The context's state word `i` (see kExecStateHeaderWords).
MSCCLPP_DEVICE_INLINE uint64_t* execStateWord(const ExecCtx& c, uint32_t i) {
  return (uint64_t*)(c.args->state + 8ull * i);
}

MSCCLPP_DEVICE_INLINE uint64_t* execSemaphore(const ExecCtx& c, uint32_t id) {
  return execStateWord(c, kExecStateHeaderWords + id);
}

// `*p == expected ? (*p = desired, true) : false`; acquire-release, device scope (the device
// semaphores live in this GPU's memory and only its blocks use them).
MSCCLPP_DEVICE_INLINE bool execCasAcqRelDevice(uint64_t* p, uint64_t expected, uint64_t desired) {
#if defined(MSCCLPP_DEVICE_HIP)
  return __hip_atomic_compare_exchange_strong(p, &expected, desired, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED,
                                              __HIP_MEMORY_SCOPE_AGENT);
#else
  uint64_t old;
  asm volatile("atom.acq_rel.gpu.cas.b64 %0, [%1], %2, %3;"
               : "=l"(old)
               : "l"(p), "l"(expected), "l"(desired)
               : "memory");
  return old == expected;
#endif
}

// Polls `done()` until it returns true; false when it gave up: on the abort word (spinUntil's
// schedule: the block's state after the first failed poll, the word every kAbortPollSpins polls;
// once the block saw it, one failed poll), or after MSCCLPP_DEVICE_WAIT_SECONDS (spin.cuh: a
// bound in time, as spinUntil's with an abort word). The caller's op fails; execMain stops the
// block for the first and traps for the second.
template <typename Done>
MSCCLPP_DEVICE_INLINE bool execSpin(Done done) {
  uint64_t since = 0;
  for (int64_t n = 0;; ++n) {
    if (done()) return true;
    if ((n & (kAbortPollSpins - 1)) == 0) {
      if (abortRequested(n != 0)) return false;
      if (waitExpired(&since, n, MSCCLPP_DEFAULT_MAX_SPIN)) return false;
    }
    spinPause();
  }
}

// FifoDeviceHandle::push and sync with bounded waits (the same protocol, fifo.cuh). A push
// whose wait gave up publishes nothing: the slot may still hold a trigger the proxy has not read.
MSCCLPP_DEVICE_INLINE bool execFifoPush(const FifoDeviceHandle& f, ProxyTrigger t, uint64_t& pos) {
  const uint64_t n = f.size;
  pos = fetchAddRelaxedDevice((uint64_t*)f.head, 1);
  const uint64_t* tail = (const uint64_t*)f.tail;
  const uint64_t p = pos;
  if (!execSpin([&] { return p - loadAcquireSystem(tail) < n; })) return false;
  uint64_t* slot = (uint64_t*)(f.triggers + (p & (n - 1)) * sizeof(ProxyTrigger));
  storeRelaxedSystem(slot, t.fst);
  storeReleaseSystem(slot + 1, (t.snd & ~kTriggerParity) | ProxyTrigger::parityFor(p, n));
  return true;
}

MSCCLPP_DEVICE_INLINE bool execFifoSync(const FifoDeviceHandle& f, uint64_t pos) {
  const uint64_t* tail = (const uint64_t*)f.tail;
  return execSpin([&] { return loadAcquireSystem(tail) > pos; });
}

// Posts a trigger of `type` on a port channel; with TriggerSync, waits until the proxy has
// handled it.
MSCCLPP_DEVICE_INLINE bool execPortPost(const PortChannelDeviceHandle& h, uint64_t type, uint64_t dstOff,
                                        uint64_t srcOff, uint64_t bytes) {
  uint64_t pos = 0;
  if (!execFifoPush(h.fifo, h.trigger(type, dstOff, srcOff, bytes), pos)) return false;
  return (type & TriggerSync) == 0 || execFifoSync(h.fifo, pos);
}

// Reads a packet carrying `flag`, waiting for it. `v` is written at every poll: pass a local.
MSCCLPP_DEVICE_INLINE bool execReadPacket(const LL16Packet& p, uint32_t flag, uint64_t& v) {
  return execSpin([&] { return p.readOnce(flag, v); });
}

// DeviceSyncer::sync with a bounded wait (the same protocol, device_syncer.cuh); false in the
// thread that gave up.
MSCCLPP_DEVICE_INLINE bool execBarrier(DeviceSyncer* s, uint32_t numBlocks) {
  bool ok = true;
  __syncthreads();
  if (numBlocks > 1 && threadIdx.x == 0) {
    const uint32_t sense = loadRelaxedDevice(&s->flag) ^ 1u;
    if (fetchIncWrapAcqRelDevice(&s->count, numBlocks - 1) == numBlocks - 1) {
      storeReleaseDevice(&s->flag, sense);
    } else {
      ok = execSpin([&] { return loadAcquireDevice(&s->flag) == sense; });
    }
  }
  __syncthreads();
  return ok;
}

// ---- data movement ------------------------------------------------------------------------

// Copies `bytes` with every thread of the block (16-byte units where both ends allow).
MSCCLPP_DEVICE_INLINE void execCopy(const ExecCtx& c, char* dst, const char* src, uint64_t bytes) {
  // In-place plans copy a buffer onto itself (all-gather: the input is the output's block).
  if (dst == src || bytes == 0) return;
  copy(dst, src, bytes, c.tid, c.nt);
}

struct alignas(16) ExecWords16 {
  uint64_t lo;
  uint64_t hi;
};

// An element of `size` bytes (2 or 4) at any alignment, in the low bits of a word.
MSCCLPP_DEVICE_INLINE uint64_t execLoadElem(const char* p, uint32_t size) {
  uint64_t w = 0;
  for (uint32_t i = 0; i < size; ++i) w |= (uint64_t)(uint8_t)p[i] << (8 * i);
  return w;
}
MSCCLPP_DEVICE_INLINE void execStoreElem(char* p, uint64_t w, uint32_t size) {
  for (uint32_t i = 0; i < size; ++i) p[i] = (char)(uint8_t)(w >> (8 * i));
}

// dst[k] = src[0] op src[1] op ... for every k, over `bytes`: 16-byte units where every address
// is 16-byte aligned, 8-byte words where 8-byte aligned, then element by element.
template <uint32_t DT, uint32_t OP>
MSCCLPP_DEVICE_INLINE void execReduceRange(const ExecCtx& c, char* const* s, uint32_t ns, char* const* d, uint32_t nd,
                                           uint64_t bytes) {
  uintptr_t align = 0;
  for (uint32_t k = 0; k < ns; ++k) align |= (uintptr_t)s[k];
  for (uint32_t k = 0; k < nd; ++k) align |= (uintptr_t)d[k];
  uint64_t done = 0;
  if ((align & 15) == 0) {
    const uint64_t n = bytes / 16;
    for (uint64_t i = c.tid; i < n; i += c.nt) {
      const ExecWords16 w = ((const ExecWords16*)s[0])[i];
      Reducer<DT, OP> lo, hi;
      lo.load(w.lo);
      hi.load(w.hi);
      for (uint32_t k = 1; k < ns; ++k) {
        const ExecWords16 x = ((const ExecWords16*)s[k])[i];
        lo.add(x.lo);
        hi.add(x.hi);
      }
      ExecWords16 r;
      r.lo = lo.finish(1);
      r.hi = hi.finish(1);
      for (uint32_t k = 0; k < nd; ++k) ((ExecWords16*)d[k])[i] = r;
    }
    done = n * 16;
  } else if ((align & 7) == 0) {
    const uint64_t n = bytes / 8;
    for (uint64_t i = c.tid; i < n; i += c.nt) {
      Reducer<DT, OP> a;
      a.load(((const uint64_t*)s[0])[i]);
      for (uint32_t k = 1; k < ns; ++k) a.add(((const uint64_t*)s[k])[i]);
      const uint64_t r = a.finish(1);
      for (uint32_t k = 0; k < nd; ++k) ((uint64_t*)d[k])[i] = r;
    }
    done = n * 8;
  }
  // The rest, element by element (a trailing partial element is left alone, as on the host).
  const uint32_t es = dataTypeSize(DT);
  for (uint64_t at = done + (uint64_t)c.tid * es; at + es <= bytes; at += (uint64_t)c.nt * es) {
    Reducer<DT, OP> a;
    a.load(execLoadElem(s[0] + at, es));
    for (uint32_t k = 1; k < ns; ++k) a.add(execLoadElem(s[k] + at, es));
    const uint64_t r = a.finish(1);
    for (uint32_t k = 0; k < nd; ++k) execStoreElem(d[k] + at, r, es);
  }
}

// data[0] = src op packets[0] op packets[1] ...; then the result as packets into out[...]:
// one 8-byte word (one LL16 packet) per step.
template <uint32_t DT, uint32_t OP>
MSCCLPP_DEVICE_INLINE bool execReducePackets(const ExecCtx& c, const char* src, char* const* pk, uint32_t npk,
                                             char* data, char* const* out, uint32_t nout, uint64_t bytes) {
  const uint64_t n = bytes / 8;
  for (uint64_t i = c.tid; i < n; i += c.nt) {
    Reducer<DT, OP> a;
    a.load(((const uint64_t*)src)[i]);
    for (uint32_t k = 0; k < npk; ++k) {
      uint64_t v = 0;
      if (!execReadPacket(((const LL16Packet*)pk[k])[i], c.flag, v)) return false;
      a.add(v);
    }
    const uint64_t r = a.finish(1);
    ((uint64_t*)data)[i] = r;
    for (uint32_t k = 0; k < nout; ++k) ((LL16Packet*)out[k])[i].write(r, c.flag);
  }
  return true;
}

// The two reductions above for a run-time type and operator (Avg sums, as on the host).
struct ExecReduce {
  char* s[kExecMaxRefs];
  char* d[kExecMaxRefs];
  uint32_t ns;
  uint32_t nd;
  uint64_t bytes;
  bool packets;
};

template <uint32_t DT, uint32_t OP>
MSCCLPP_DEVICE_INLINE bool execReduceTyped(const ExecCtx& c, const ExecReduce& r) {
  if (r.packets) return execReducePackets<DT, OP>(c, r.s[0], r.s + 1, r.ns - 1, r.d[0], r.d + 1, r.nd - 1, r.bytes);
  execReduceRange<DT, OP>(c, r.s, r.ns, r.d, r.nd, r.bytes);
  return true;
}

template <uint32_t DT>
MSCCLPP_DEVICE_INLINE bool execReduceOp(const ExecCtx& c, uint32_t op, const ExecReduce& r) {
  switch (op) {
    case kReduceSum:
    case kReduceAvg:
      return execReduceTyped<DT, kReduceSum>(c, r);
    case kReduceProd:
      return execReduceTyped<DT, kReduceProd>(c, r);
    case kReduceMin:
      return execReduceTyped<DT, kReduceMin>(c, r);
    case kReduceMax:
      return execReduceTyped<DT, kReduceMax>(c, r);
    default:  // checked by execValid
      return false;
  }
}

// The operator of a reducing op: the launch's override, or the op's own.
MSCCLPP_DEVICE_INLINE uint32_t execReduceCode(const ExecCtx& c, const FlatOp& op) {
  return c.args->op == kExecOwnOp ? (uint32_t)op.reduce : c.args->op;
}

MSCCLPP_DEVICE_INLINE bool execReduce(const ExecCtx& c, const FlatOp& op, const ExecReduce& r) {
  const uint32_t rop = execReduceCode(c, op);
  switch (c.args->dtype) {
    case kDataTypeF32:
      return execReduceOp<kDataTypeF32>(c, rop, r);
    case kDataTypeF16:
      return execReduceOp<kDataTypeF16>(c, rop, r);
    case kDataTypeBF16:
      return execReduceOp<kDataTypeBF16>(c, rop, r);
    case kDataTypeI32:
      return execReduceOp<kDataTypeI32>(c, rop, r);
    case kDataTypeU32:
      return execReduceOp<kDataTypeU32>(c, rop, r);
    default:  // checked by execValid
      return false;
  }
}

// Puts through port channels: destination k over channel ids[k], from source k (or the only
// one; always src[0] with `firstSource`), one thread per destination. Packet references move
// twice their data bytes, whole (no pipeline slice).
MSCCLPP_DEVICE_INLINE bool execPortPut(const ExecCtx& c, const FlatOp& op, ExecSlice s, bool packets,
                                       bool firstSource) {
  for (uint32_t k = c.tid; k < op.n_dst; k += c.nt) {
    const FlatRef& d = op.dst[k];
    const FlatRef& sr = (firstSource || k >= op.n_src) ? op.src[0] : op.src[k];
    PortChannelDeviceHandle h = execPortChannel(c, op.ids[k]);
    h.dst = execRemoteId(c, d.id);
    h.src = c.plan->local_ids[sr.buffer & 3];
    const uint64_t bytes = packets ? 2ull * d.size : execSliced(d.size, s);
    const uint64_t off = packets ? 0 : s.offset;
    const uint64_t dstOff = d.offset + execHalfOf(c, d) + off;
    const uint64_t srcOff = sr.offset + execHalfOf(c, sr) + off;
    const uint64_t type = op.code == kOpPutWithSignal           ? TriggerData | TriggerFlag
                          : op.code == kOpPutWithSignalAndFlush ? TriggerData | TriggerFlag | TriggerSync
                                                                : TriggerData;
    if (!execPortPost(h, type, dstOff, srcOff, bytes)) return false;
  }
  return true;
}

// ---- validation ---------------------------------------------------------------------------

MSCCLPP_DEVICE_INLINE bool execIsPacketOp(uint32_t code) {
  return code == kOpPutPackets || code == kOpReadPutPackets || code == kOpCopyPackets || code == kOpUnpackPackets ||
         (code >= kOpReducePackets && code <= kOpReduceCopySendPackets && code != kOpReduceSend);
}

// re, repkt, recpkt, res, respkt, recspkt, rre, rres: the codes 14 to 21.
MSCCLPP_DEVICE_INLINE bool execIsReduceOp(uint32_t code) { return code >= kOpReduce && code <= kOpReadReduceSend; }

// A reference an op may address: a known buffer; a local one, a peer's mapped here (memory
// channels) or one the proxy knows (port channels); packets 16-byte aligned, their data in whole
// 8-byte words, 8-byte aligned.
MSCCLPP_DEVICE_INLINE bool execRefValid(const ExecCtx& c, const FlatRef& r, bool packetOp) {
  if (r.buffer > kExecBufferScratch) return false;
  if (r.kind == kExecRefRemotePort) return r.id < c.plan->n_remote && execRemoteId(c, r.id) != 0xffffffffu;
  if (r.kind == kExecRefRemoteMemory) {
    // 0: declared for port access only, so not mapped here.
    if (r.id >= c.plan->n_remote || execRemoteAddr(c, r.id) == 0) return false;
  } else if (r.kind != kExecRefLocal) {
    // Switch (multicast) references: the executor refuses NVLS plans at set-up.
    return false;
  }
  if (!packetOp) return true;
  const uintptr_t a = (uintptr_t)execAddr(c, r, 0);
  return (r.size & 7) == 0 && (a & (r.packets ? 15 : 7)) == 0;
}

// Whether `op` can run (see the header comment): what the host interpreter reports as errors.
MSCCLPP_DEVICE_INLINE bool execValid(const ExecCtx& c, const FlatOp& op) {
  const uint32_t code = op.code;
  if (op.n_src > kExecMaxRefs || op.n_dst > kExecMaxRefs || op.n_ids > kExecMaxIds) return false;
  if (code > kOpMultiStorePackets || code == kOpPipeline || code == kOpMultiLoadReduceStore ||
      code == kOpMultiStore || code == kOpMultiStorePackets) {
    // NVLS ops are refused at set-up; a pipeline inside a pipeline or an unknown code cannot
    // come from the flattener.
    return false;
  }
  switch (code) {
    case kOpNop:
      return true;
    case kOpBarrier:
      return op.a < kExecMaxBarriers;
    case kOpSemRelease:
    case kOpSemAcquire:
      for (uint32_t k = 0; k < op.n_ids; ++k)
        if (op.ids[k] >= c.args->n_semaphores) return false;
      return true;
    default:
      break;
  }
  const bool port = op.channel_type == kExecChannelPort;
  if (code == kOpSignal || code == kOpWait || code == kOpRelaxedSignal || code == kOpRelaxedWait ||
      code == kOpFlush) {
    if (!port && (op.channel_type != kExecChannelMemory || code == kOpFlush)) return false;
    for (uint32_t k = 0; k < op.n_ids; ++k)
      if (op.ids[k] >= (port ? c.plan->n_port : c.plan->n_memory)) return false;
    return true;
  }
  // Data ops: a source, and a destination where one is written.
  if (op.n_src == 0) return false;
  if (op.n_dst == 0 && code != kOpPut && code != kOpPutWithSignal && code != kOpPutWithSignalAndFlush &&
      code != kOpPutPackets && code != kOpReadPutPackets && code != kOpGet)
    return false;
  const bool portPut = port && (code == kOpPut || code == kOpPutWithSignal || code == kOpPutWithSignalAndFlush ||
                                code == kOpPutPackets || code == kOpReadPutPackets);
  if (portPut) {
    // Destination k goes over channel ids[k].
    if (op.n_ids < op.n_dst) return false;
    for (uint32_t k = 0; k < op.n_dst; ++k)
      if (op.ids[k] >= c.plan->n_port || op.dst[k].kind != kExecRefRemotePort) return false;
  }
  if (execIsReduceOp(code)) {
    if (c.args->dtype > kDataTypeU32 || execReduceCode(c, op) > kReduceAvg) return false;
  }
  const bool packetOp = execIsPacketOp(code);
  for (uint32_t k = 0; k < op.n_src; ++k)
    if (!execRefValid(c, op.src[k], packetOp && !portPut)) return false;
  for (uint32_t k = 0; k < op.n_dst; ++k)
    if (!execRefValid(c, op.dst[k], packetOp && !portPut)) return false;
  return true;
}

// ---- one op -------------------------------------------------------------------------------

// Runs `op` (checked by execValid) with the calling thread's share; false when one of its waits
// gave up.
MSCCLPP_DEVICE_INLINE bool execOp(const ExecCtx& c, const FlatOp& op, ExecSlice s) {
  const uint32_t code = op.code;
  switch (code) {
    case kOpNop:
      // The block meets between ops anyway.
      return true;
    case kOpBarrier: {
      // The barrier's pair of state words holds a DeviceSyncer (zeroed at set-up, never reset).
      return execBarrier((DeviceSyncer*)execStateWord(c, 2 + 2 * op.a), op.b);
    }
    case kOpSignal:
    case kOpRelaxedSignal:
      for (uint32_t k = c.tid; k < op.n_ids; k += c.nt) {
        if (op.channel_type == kExecChannelMemory) {
          BaseMemoryChannelDeviceHandle h = execMemoryChannel(c, op.ids[k]);
          if (code == kOpRelaxedSignal) {
            h.relaxedSignal();
          } else {
            h.signal();
          }
        } else {
          // The proxy signals after everything posted before: relaxed or not is the same.
          if (!execPortPost(execPortChannel(c, op.ids[k]), TriggerFlag, 0, 0, 0)) return false;
        }
      }
      return true;
    case kOpWait:
    case kOpRelaxedWait:
      for (uint32_t k = c.tid; k < op.n_ids; k += c.nt) {
        // poll() acquires: a relaxed wait gets the ordered one, stronger.
        bool got;
        if (op.channel_type == kExecChannelMemory) {
          BaseMemoryChannelDeviceHandle h = execMemoryChannel(c, op.ids[k]);
          got = execSpin([&] { return h.poll(); });
        } else {
          PortChannelDeviceHandle h = execPortChannel(c, op.ids[k]);
          got = execSpin([&] { return h.poll(); });
        }
        if (!got) return false;
      }
      return true;
    case kOpFlush:
      for (uint32_t k = c.tid; k < op.n_ids; k += c.nt) {
        if (!execPortPost(execPortChannel(c, op.ids[k]), TriggerSync, 0, 0, 0)) return false;
      }
      return true;
    default:
      break;
  }
  if (code == kOpSemRelease || code == kOpSemAcquire) {
    for (uint32_t k = c.tid; k < op.n_ids; k += c.nt) {
      uint64_t* sem = execSemaphore(c, op.ids[k]);
      if (code == kOpSemRelease) {
        // Release: what the block wrote before is visible to the block that acquires.
        (void)fetchAddAcqRelSystem(sem, 1);
      } else if (!execSpin([&] {
                   const uint64_t v = loadAcquireDevice(sem);
                   return v > 0 && execCasAcqRelDevice(sem, v, v - 1);
                 })) {
        return false;
      }
    }
    return true;
  }
  switch (code) {
    case kOpPut:
    case kOpPutWithSignal:
    case kOpPutWithSignalAndFlush:
      if (op.channel_type == kExecChannelPort) return execPortPut(c, op, s, false, false);
      {
        for (uint32_t k = 0; k < op.n_dst; ++k) {
          const FlatRef& sr = k < op.n_src ? op.src[k] : op.src[0];
          execCopy(c, execAddr(c, op.dst[k], s.offset), execAddr(c, sr, s.offset), execSliced(op.dst[k].size, s));
        }
      }
      return true;
    case kOpGet:
      for (uint32_t k = 0; k < op.n_src && k < op.n_dst; ++k) {
        execCopy(c, execAddr(c, op.dst[k], s.offset), execAddr(c, op.src[k], s.offset), execSliced(op.src[k].size, s));
      }
      return true;
    case kOpCopy:
      execCopy(c, execAddr(c, op.dst[0], s.offset), execAddr(c, op.src[0], s.offset), execSliced(op.src[0].size, s));
      return true;
    case kOpReduce:
    case kOpReduceSend:
    case kOpReadReduce:
    case kOpReadReduceSend: {
      ExecReduce r;
      r.ns = op.n_src;
      r.nd = op.n_dst;
      r.bytes = execSliced(op.src[0].size, s);
      r.packets = false;
      for (uint32_t k = 0; k < r.ns; ++k) r.s[k] = execAddr(c, op.src[k], s.offset);
      for (uint32_t k = 0; k < r.nd; ++k) r.d[k] = execAddr(c, op.dst[k], s.offset);
      return execReduce(c, op, r);
    }
    case kOpPutPackets:
      if (op.channel_type == kExecChannelPort) {
        // The packets were prepared in local scratch (cpkt); the proxy copies them.
        return execPortPut(c, op, s, true, false);
      }
      for (uint32_t k = 0; k < op.n_dst; ++k) {
        const FlatRef& sr = k < op.n_src ? op.src[k] : op.src[0];
        char* pk = execAddr(c, op.dst[k], 0);
        const char* data = execAddr(c, sr, 0);
        putPackets<LL16Packet>(pk, data, op.dst[k].size, c.tid, c.nt, c.flag);
      }
      return true;
    case kOpReadPutPackets: {
      const LL16Packet* in = (const LL16Packet*)execAddr(c, op.src[0], 0);
      const uint64_t bytes = op.src[0].size;
      if (op.channel_type == kExecChannelPort) {
        // The packets must have arrived before the proxy copies them: wait for each, meet,
        // then post.
        bool got = true;
        for (uint64_t i = c.tid; got && i < bytes / 8; i += c.nt) {
          uint64_t v = 0;
          got = execReadPacket(in[i], c.flag, v);
        }
        __syncthreads();
        return got && execPortPut(c, op, s, true, true);
      }
      LL16Packet* out[kExecMaxRefs];
      for (uint32_t k = 0; k < op.n_dst; ++k) {
        out[k] = (LL16Packet*)execAddr(c, op.dst[k], 0);
      }
      for (uint64_t i = c.tid; i < bytes / 8; i += c.nt) {
        uint64_t v = 0;
        if (!execReadPacket(in[i], c.flag, v)) return false;
        for (uint32_t k = 0; k < op.n_dst; ++k) out[k][i].write(v, c.flag);
      }
      return true;
    }
    case kOpCopyPackets: {
      char* pk = execAddr(c, op.dst[0], 0);
      const char* data = execAddr(c, op.src[0], 0);
      putPackets<LL16Packet>(pk, data, op.src[0].size, c.tid, c.nt, c.flag);
      return true;
    }
    case kOpUnpackPackets: {
      uint64_t* data = (uint64_t*)execAddr(c, op.dst[0], 0);
      const LL16Packet* pk = (const LL16Packet*)execAddr(c, op.src[0], 0);
      for (uint64_t i = c.tid; i < op.src[0].size / 8; i += c.nt) {
        // Into a register first: a poll stores what it saw, flag or not, and in-place plans
        // have other blocks read this data meanwhile (a put of the same chunk).
        uint64_t v = 0;
        if (!execReadPacket(pk[i], c.flag, v)) return false;
        data[i] = v;
      }
      return true;
    }
    case kOpReducePackets:
    case kOpReduceSendPackets:
    case kOpReduceCopyPackets:
    case kOpReduceCopySendPackets: {
      // src[0] is data, src[1..] packets; dst[0] data, dst[1..] packets (a local copy for
      // rec*, the peers' scratch).
      ExecReduce r;
      r.ns = op.n_src;
      r.nd = op.n_dst;
      r.bytes = op.src[0].size;
      r.packets = true;
      for (uint32_t k = 0; k < r.ns; ++k) r.s[k] = execAddr(c, op.src[k], 0);
      for (uint32_t k = 0; k < r.nd; ++k) r.d[k] = execAddr(c, op.dst[k], 0);
      return execReduce(c, op, r);
    }
    default:  // checked by execValid
      return false;
  }
}

// Stages op `i` of the plan in shared memory; the block meets after (everyone sees the new one).
// The caller's meeting before it (execMain) has everyone done with the previous op.
MSCCLPP_DEVICE_INLINE void execLoadOp(FlatOp* staged, const DevicePlan& plan, uint32_t i) {
  const uint64_t* src = (const uint64_t*)(plan.ops + (uint64_t)i * sizeof(FlatOp));
  uint64_t* dst = (uint64_t*)staged;
  for (uint32_t k = threadIdx.x; k < sizeof(FlatOp) / 8; k += blockDim.x) dst[k] = src[k];
  __syncthreads();
}

static_assert(sizeof(FlatOp) % 8 == 0, "FlatOp is staged in 8-byte words");

// The kernel's body (in the namespace, so that its integer types are ours).
MSCCLPP_DEVICE_INLINE void execMain(const ExecutorArgs& args) {
  __shared__ DevicePlan plan;
  __shared__ FlatOp staged;
  __shared__ uint64_t launchCount;
  if (threadIdx.x == 0) {
    // One thread, before the barrier below and so before every wait: no later store of another
    // thread can clear what a wait records (shared memory is not zeroed at launch).
    abortWordInit(args.abort);
    plan = *(const DevicePlan*)args.plan;
    // One flag per launch, never reset: packets of earlier launches never match a later one.
    launchCount = loadAcquireDevice((const uint64_t*)args.state) + 1;
  }
  __syncthreads();
  const uint32_t launchFlag = (uint32_t)launchCount;
  // Blocks past the plan's (the planner launches exactly as many) have nothing to do.
  if (blockIdx.x >= plan.n_blocks) return;
  ExecCtx c;
  c.plan = &plan;
  c.args = &args;
  c.flag = launchFlag;
  c.half = (args.double_scratch != 0 && launchFlag % 2 == 0) ? args.scratch_bytes / 2 : 0;
  c.tid = threadIdx.x;
  c.nt = blockDim.x;
  const FlatBlock block = ((const FlatBlock*)plan.blocks)[blockIdx.x];
  const uint32_t end = block.first_op + block.n_ops;
  // Where the block is: op `i` next; inside a pipeline, body op `k` of `body` (which start at
  // `bodyStart`) in iteration `it` of `iterations`. All of it, and `valid`, comes from the plan
  // and the staged op, the same in every thread, so the block takes every branch (and barrier)
  // together; only `ran` is a thread's own.
  bool valid = end >= block.first_op && end <= plan.n_ops;
  uint32_t i = block.first_op;
  uint32_t body = 0, k = 0, bodyStart = 0, it = 0, iterations = 0;
  uint64_t unit = 0;
  while (true) {
    // The block meets between ops (everyone is done with the previous one) and stops together
    // once a wait of it gave up on the abort word: a wait records that in the block's state before
    // this barrier, and no thread is in a wait between the barrier and the read, so every thread
    // reads the same. Later ops would only give up too, and write garbage meanwhile.
    __syncthreads();
    if (abortRequested(false)) break;
    ExecSlice s = {0, ~0ull};
    bool run = false;
    if (valid && k < body) {
      execLoadOp(&staged, plan, bodyStart + k);
      s.offset = (uint64_t)it * unit;
      s.unit = unit;
      if (++k == body && ++it < iterations) k = 0;
      run = true;
    } else if (valid) {
      if (i >= end) break;
      execLoadOp(&staged, plan, i);
      if (staged.code == kOpPipeline) {
        valid = staged.c <= end - i - 1;
        body = staged.b == 0 ? 0 : staged.c;
        iterations = staged.b;
        unit = staged.a;
        bodyStart = i + 1;
        k = 0;
        it = 0;
        i += 1 + staged.c;
      } else {
        i += 1;
        run = true;
      }
    }
    // One call site: execOp is inlined whole.
    bool ran = true;
    if (run) {
      valid = execValid(c, staged);
      ran = valid && execOp(c, staged, s);
    }
    // The one trap site of the interpreter (see the header comment): a block range or op the
    // host interpreter refuses (the same in every thread), or a wait of this thread that reached
    // the spin limit with the abort word clear. A wait that gave up on the word set the block's
    // state, so its thread goes on to the meeting above, where the block stops.
    if (!valid || (!ran && !abortRequested(false))) deviceTrap();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    // The last block to finish advances the flag (every block has read it: each reads it first).
    // Blocks that stopped on the abort word finish too, so the count stays whole.
    fenceDevice();
    uint64_t* state = (uint64_t*)args.state;
    if (fetchAddRelaxedDevice(state + 1, 1) + 1 == plan.n_blocks) {
      storeRelaxedDevice(state + 1, 0);
      storeRelaxedDevice(state, launchCount);
    }
  }
}

}  // namespace mscclpp

// Declared with its launch bounds (the compiler keeps registers within what 1024 threads may
// have), then defined.
extern "C" __global__ void __launch_bounds__(mscclpp::kExecMaxThreads) mscclpp_executor(mscclpp::ExecutorArgs args);

extern "C" __global__ void mscclpp_executor(mscclpp::ExecutorArgs args) { mscclpp::execMain(args); }
