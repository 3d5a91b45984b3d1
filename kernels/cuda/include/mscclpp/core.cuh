// mscclpp device API — CUDA primitives: integer types, atomics with explicit order and scope,
// fences, volatile packet stores, multicast, and a bounded spin.
//
// Self-contained: NVRTC has no toolkit headers, so nothing here includes one. Every other
// header of the device API is vendor-neutral and builds on the functions below; the HIP copy of
// this file (kernels/hip/include/mscclpp/core.cuh) offers the same names.
#pragma once

#define MSCCLPP_DEVICE_CUDA 1
#define MSCCLPP_DEVICE_INLINE __forceinline__ __device__
#define MSCCLPP_HOST_DEVICE_INLINE __forceinline__ __host__ __device__

// Spins give up (trap) after this many polls unless a caller passes its own bound; -1 means
// never. About 10^8 polls of a mapped word takes tens of seconds: far past any legitimate wait,
// short enough that a missing peer becomes a kernel error instead of a hung GPU.
#ifndef MSCCLPP_DEFAULT_MAX_SPIN
#define MSCCLPP_DEFAULT_MAX_SPIN 100000000LL
#endif

namespace mscclpp {

// Fixed-width integers (in our namespace, so that they never clash with <cstdint>'s).
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned long long uintptr_t;

static_assert(sizeof(uint32_t) == 4 && sizeof(uint64_t) == 8 && sizeof(void*) == 8,
              "mscclpp needs 32/64-bit integers and 64-bit device pointers");

// Lanes per warp on this vendor (32 on NVIDIA).
constexpr uint32_t kWarpSize = 32;

// ---- fences -------------------------------------------------------------------------------

// Orders this thread's earlier accesses before its later ones for every observer in the system
// (other GPUs, the host).
MSCCLPP_DEVICE_INLINE void fenceSystem() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }
// The same for observers on this GPU.
MSCCLPP_DEVICE_INLINE void fenceDevice() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

// ---- atomic loads and stores (generic addresses) ------------------------------------------

MSCCLPP_DEVICE_INLINE uint64_t loadAcquireSystem(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
MSCCLPP_DEVICE_INLINE uint64_t loadAcquireDevice(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.gpu.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
MSCCLPP_DEVICE_INLINE uint64_t loadRelaxedSystem(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
MSCCLPP_DEVICE_INLINE uint64_t loadRelaxedDevice(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.gpu.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
MSCCLPP_DEVICE_INLINE void storeReleaseSystem(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
MSCCLPP_DEVICE_INLINE void storeRelaxedSystem(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
MSCCLPP_DEVICE_INLINE void storeRelaxedDevice(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.gpu.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
MSCCLPP_DEVICE_INLINE uint32_t loadAcquireDevice(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
MSCCLPP_DEVICE_INLINE uint32_t loadRelaxedDevice(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
MSCCLPP_DEVICE_INLINE void storeReleaseDevice(uint32_t* p, uint32_t v) {
  asm volatile("st.release.gpu.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
MSCCLPP_DEVICE_INLINE void storeRelaxedDevice(uint32_t* p, uint32_t v) {
  asm volatile("st.relaxed.gpu.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// ---- read-modify-write --------------------------------------------------------------------

// Returns the old value. Relaxed, device scope (the counter is in this GPU's memory).
MSCCLPP_DEVICE_INLINE uint64_t fetchAddRelaxedDevice(uint64_t* p, uint64_t v) {
  uint64_t old;
  asm volatile("atom.relaxed.gpu.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
  return old;
}
// Returns the old value. Acquire-release, system scope (the word may be another GPU's or the
// host's memory).
MSCCLPP_DEVICE_INLINE uint64_t fetchAddAcqRelSystem(uint64_t* p, uint64_t v) {
  uint64_t old;
  asm volatile("atom.acq_rel.sys.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
  return old;
}
// Adds without waiting for the result (a reduction: the thread goes on at once). Relaxed, device
// scope.
MSCCLPP_DEVICE_INLINE void addRelaxedDevice(uint32_t* p, uint32_t v) {
  asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// `old >= limit ? 0 : old + 1`, returning `old`; acquire-release, device scope.
MSCCLPP_DEVICE_INLINE uint32_t fetchIncWrapAcqRelDevice(uint32_t* p, uint32_t limit) {
  uint32_t old;
  asm volatile("atom.acq_rel.gpu.inc.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(limit) : "memory");
  return old;
}

// ---- shuffles ------------------------------------------------------------------------------

// `v` of thread `src` (0..8) of the calling thread's aligned group of eight lanes; every thread of
// the group must make the call together (LL128 lines).
MSCCLPP_DEVICE_INLINE uint32_t shuffleInGroupOf8(uint32_t v, uint32_t src) {
  const uint32_t lane = threadIdx.x & 31;
  return __shfl_sync(0xffu << (lane & ~7u), v, (int)src, 8);
}

// LL128 lines (NVIDIA: 128-byte lines of one warp instruction arrive whole over NVLink).
#define MSCCLPP_HAS_LL128 1

// ---- volatile vector accesses (LL packets: one store or load of the whole packet) ---------

MSCCLPP_DEVICE_INLINE void storeVolatile16(void* p, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(a), "r"(b), "r"(c), "r"(d)
               : "memory");
}
MSCCLPP_DEVICE_INLINE void loadVolatile16(const void* p, uint32_t& a, uint32_t& b, uint32_t& c, uint32_t& d) {
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
               : "l"(p)
               : "memory");
}
MSCCLPP_DEVICE_INLINE void storeVolatile8(void* p, uint32_t a, uint32_t b) {
  asm volatile("st.volatile.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(a), "r"(b) : "memory");
}
MSCCLPP_DEVICE_INLINE void loadVolatile8(const void* p, uint32_t& a, uint32_t& b) {
  asm volatile("ld.volatile.global.v2.u32 {%0, %1}, [%2];" : "=r"(a), "=r"(b) : "l"(p) : "memory");
}

// ---- multicast (NVLink SHARP) -------------------------------------------------------------

// Whether this compilation can address multicast memory (sm_90 and later).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define MSCCLPP_HAS_MULTIMEM 1
#else
#define MSCCLPP_HAS_MULTIMEM 0
#endif

// Sum of the f32 at `mc` over every member of the multicast object.
MSCCLPP_DEVICE_INLINE float multimemLoadReduceAddF32(const float* mc) {
#if MSCCLPP_HAS_MULTIMEM
  float v;
  asm volatile("multimem.ld_reduce.relaxed.sys.global.add.f32 %0, [%1];" : "=f"(v) : "l"(mc) : "memory");
  return v;
#else
  (void)mc;
  asm volatile("trap;");
  return 0.0f;
#endif
}
// The same for four consecutive f32 (16-byte aligned).
MSCCLPP_DEVICE_INLINE void multimemLoadReduceAddF32x4(const float* mc, float& a, float& b, float& c, float& d) {
#if MSCCLPP_HAS_MULTIMEM
  asm volatile("multimem.ld_reduce.relaxed.sys.global.add.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(a), "=f"(b), "=f"(c), "=f"(d)
               : "l"(mc)
               : "memory");
#else
  (void)mc;
  a = b = c = d = 0.0f;
  asm volatile("trap;");
#endif
}
// Stores `v` at `mc` in every member.
MSCCLPP_DEVICE_INLINE void multimemStoreF32(float* mc, float v) {
#if MSCCLPP_HAS_MULTIMEM
  asm volatile("multimem.st.relaxed.sys.global.f32 [%0], %1;" ::"l"(mc), "f"(v) : "memory");
#else
  (void)mc;
  (void)v;
  asm volatile("trap;");
#endif
}
// Stores four consecutive f32 (16-byte aligned) in every member.
MSCCLPP_DEVICE_INLINE void multimemStoreF32x4(float* mc, float a, float b, float c, float d) {
#if MSCCLPP_HAS_MULTIMEM
  asm volatile("multimem.st.relaxed.sys.global.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(mc), "f"(a), "f"(b), "f"(c),
               "f"(d)
               : "memory");
#else
  (void)mc;
  (void)a;
  (void)b;
  (void)c;
  (void)d;
  asm volatile("trap;");
#endif
}

// ---- spinning -----------------------------------------------------------------------------

// Aborts the kernel (the launch fails with an illegal-instruction error).
MSCCLPP_DEVICE_INLINE void deviceTrap() { asm volatile("trap;"); }

// Between polls. Nothing on NVIDIA: a sleep would add its granularity to every signal's latency.
MSCCLPP_DEVICE_INLINE void spinPause() {}

// ---- the abort word -----------------------------------------------------------------------
//
// A communicator's abort word (comm/src/communicator.rs: 8 bytes of host-mapped memory, 0 while
// live, r + 1 once rank r died, ~0 once aborted; never cleared) lets a kernel whose peer died give
// up its waits instead of spinning to the limit and trapping: a trap ends the whole context, the
// process's other work (a PyTorch job) with it. Opt-in per module, since the state lives in a
// block-shared word that every entry point must set before its first wait: a module defines
// MSCCLPP_DEVICE_ABORT 1 before its first include, and each of its kernels calls
// abortWordInit(address or 0) in every thread at its start. A wait then reads the block's state
// after its first failed poll (a shared load: a wait that succeeds at once never does), and the
// word itself every kAbortPollSpins polls; once any wait of the block saw it set, every later
// wait of the block gives up after one failed poll. A wait that gives up returns false: the
// kernel runs on to its end (its results are garbage; the host reports the failure), so code
// whose control flow depends on a waited value must check. Modules without the macro wait as
// before.
#ifndef MSCCLPP_DEVICE_ABORT
#define MSCCLPP_DEVICE_ABORT 0
#endif

// Polls between two reads of the abort word (a read of host memory: about a microsecond).
constexpr int64_t kAbortPollSpins = 1024;

#if MSCCLPP_DEVICE_ABORT
// The block's abort state: the word's device address (0: none), bit 0 set once a wait of the
// block saw the word set (addresses are 8-byte aligned). Shared memory is not zeroed at launch:
// abortWordInit must come first. Every thread stores it (the same value), so that no barrier sits
// on the kernel's path; a late thread's store may clear the bit, which only costs its next wait
// a read of the word.
__shared__ uint64_t abortState;

MSCCLPP_DEVICE_INLINE void abortWordInit(uint64_t addr) { *(volatile uint64_t*)&abortState = addr & ~1ull; }

// Whether a wait of this block saw the abort word set; with `readWord`, also reads the word and
// records what it holds. Out of line: inlined into every wait, it cost the LL kernels up to 13
// registers more (NVRTC 13, sm_90); a call costs them 1-8 and only runs after a failed poll.
__device__ __noinline__ bool abortRequested(bool readWord) {
  const uint64_t s = *(volatile uint64_t*)&abortState;
  if (s & 1) return true;
  if (!readWord || s == 0 || loadRelaxedSystem((const uint64_t*)s) == 0) return false;
  *(volatile uint64_t*)&abortState = s | 1;
  return true;
}
#else
MSCCLPP_DEVICE_INLINE bool abortRequested(bool) { return false; }
#endif

// The default agreement of spinUntil: each thread decides alone.
struct SpinAlone {
  MSCCLPP_DEVICE_INLINE bool operator()(bool giveUp) const { return giveUp; }
};

// Polls `done()` until it returns true; traps after `maxSpinCount` polls (never when negative).
// Returns false when it gave up on the kernel's abort word (MSCCLPP_DEVICE_ABORT modules only).
// Threads whose polls must stay together (a shuffle in `done`) pass an `agree` that makes the
// decision to give up the same in each of them (it is called at the same poll in every one).
template <typename Done, typename Agree = SpinAlone>
MSCCLPP_DEVICE_INLINE bool spinUntil(Done done, int64_t maxSpinCount = MSCCLPP_DEFAULT_MAX_SPIN,
                                     Agree agree = Agree()) {
  int64_t spins = 0;
  while (!done()) {
#if MSCCLPP_DEVICE_ABORT
    if ((spins & (kAbortPollSpins - 1)) == 0 && agree(abortRequested(spins != 0))) return false;
    if (++spins > maxSpinCount && maxSpinCount >= 0) deviceTrap();
#else
    (void)agree;
    if (maxSpinCount >= 0 && ++spins > maxSpinCount) deviceTrap();
#endif
    spinPause();
  }
  return true;
}

}  // namespace mscclpp
