// mscclpp device API — CUDA primitives: integer types, atomics with explicit order and scope,
// fences, volatile packet stores, multicast.
// The bounded spin built on them is the vendor-neutral mscclpp/spin.cuh.
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

// The largest `v` of the calling warp, in every lane; every lane of the warp makes the call.
MSCCLPP_DEVICE_INLINE float warpMax(float v) {
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
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

// A clock in nanoseconds, the same on every SM (the global timer), for waits bounded in time.
MSCCLPP_DEVICE_INLINE uint64_t deviceClockNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Between polls. Nothing on NVIDIA: a sleep would add its granularity to every signal's latency.
MSCCLPP_DEVICE_INLINE void spinPause() {}

}  // namespace mscclpp
