// mscclpp device API — HIP primitives: integer types, atomics with explicit order and scope,
// fences, volatile packet stores, (no) multicast.
// The bounded spin built on them is the vendor-neutral mscclpp/spin.cuh.
//
// The only vendor-specific header (with its CUDA twin, kernels/cuda/include/mscclpp/core.cuh):
// every other header of the device API, in kernels/include/mscclpp, is shared by both vendors (a
// test in backends/gpu checks that nothing else is per vendor) and builds on the names below. hipRTC provides the HIP runtime declarations implicitly; hipcc gets them from
// <hip/hip_runtime.h>. AMD CDNA GPUs run wavefronts of 64 lanes.
#pragma once

#if !defined(__HIPCC_RTC__)
#include <hip/hip_runtime.h>
#endif

#define MSCCLPP_DEVICE_HIP 1
#define MSCCLPP_DEVICE_INLINE inline __attribute__((always_inline)) __device__
#define MSCCLPP_HOST_DEVICE_INLINE inline __attribute__((always_inline)) __host__ __device__

// Spins give up (trap) after this many polls unless a caller passes its own bound; -1 means
// never. Each poll sleeps briefly (s_sleep), so 10^8 polls is minutes: far past any legitimate
// wait, and a missing peer still ends as a kernel error instead of a hung GPU.
#ifndef MSCCLPP_DEFAULT_MAX_SPIN
#define MSCCLPP_DEFAULT_MAX_SPIN 100000000LL
#endif

namespace mscclpp {

// Fixed-width integers (in our namespace, so that they never clash with <cstdint>'s; qualify them
// as mscclpp::uint64_t where both are visible).
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

// Lanes per wavefront: 64 on CDNA (gfx9), 32 on RDNA in wave32 mode.
#if defined(__AMDGCN_WAVEFRONT_SIZE)
constexpr uint32_t kWarpSize = __AMDGCN_WAVEFRONT_SIZE;
#else
constexpr uint32_t kWarpSize = 64;
#endif

// ---- fences -------------------------------------------------------------------------------

// Orders this thread's earlier accesses before its later ones for every observer in the system.
MSCCLPP_DEVICE_INLINE void fenceSystem() { __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, ""); }
// The same for observers on this GPU.
MSCCLPP_DEVICE_INLINE void fenceDevice() { __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, "agent"); }

// ---- atomic loads and stores --------------------------------------------------------------

MSCCLPP_DEVICE_INLINE uint64_t loadAcquireSystem(const uint64_t* p) {
  return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM);
}
MSCCLPP_DEVICE_INLINE uint64_t loadAcquireDevice(const uint64_t* p) {
  return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_AGENT);
}
MSCCLPP_DEVICE_INLINE uint64_t loadRelaxedSystem(const uint64_t* p) {
  return __hip_atomic_load(p, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
}
MSCCLPP_DEVICE_INLINE uint64_t loadRelaxedDevice(const uint64_t* p) {
  return __hip_atomic_load(p, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
MSCCLPP_DEVICE_INLINE void storeReleaseSystem(uint64_t* p, uint64_t v) {
  __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
}
MSCCLPP_DEVICE_INLINE void storeRelaxedSystem(uint64_t* p, uint64_t v) {
  __hip_atomic_store(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
}
MSCCLPP_DEVICE_INLINE void storeRelaxedDevice(uint64_t* p, uint64_t v) {
  __hip_atomic_store(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
MSCCLPP_DEVICE_INLINE uint32_t loadAcquireDevice(const uint32_t* p) {
  return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_AGENT);
}
MSCCLPP_DEVICE_INLINE uint32_t loadRelaxedDevice(const uint32_t* p) {
  return __hip_atomic_load(p, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
MSCCLPP_DEVICE_INLINE void storeReleaseDevice(uint32_t* p, uint32_t v) {
  __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_AGENT);
}
MSCCLPP_DEVICE_INLINE void storeRelaxedDevice(uint32_t* p, uint32_t v) {
  __hip_atomic_store(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}

// ---- read-modify-write --------------------------------------------------------------------

// Returns the old value. Relaxed, device scope (the counter is in this GPU's memory).
MSCCLPP_DEVICE_INLINE uint64_t fetchAddRelaxedDevice(uint64_t* p, uint64_t v) {
  return __hip_atomic_fetch_add(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
// Returns the old value. Acquire-release, system scope.
MSCCLPP_DEVICE_INLINE uint64_t fetchAddAcqRelSystem(uint64_t* p, uint64_t v) {
  return __hip_atomic_fetch_add(p, v, __ATOMIC_ACQ_REL, __HIP_MEMORY_SCOPE_SYSTEM);
}
// Adds without using the result. Relaxed, device scope.
MSCCLPP_DEVICE_INLINE void addRelaxedDevice(uint32_t* p, uint32_t v) {
  (void)__hip_atomic_fetch_add(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
// `old >= limit ? 0 : old + 1`, returning `old`; acquire-release, device scope.
MSCCLPP_DEVICE_INLINE uint32_t fetchIncWrapAcqRelDevice(uint32_t* p, uint32_t limit) {
  return __builtin_amdgcn_atomic_inc32(p, limit, __ATOMIC_ACQ_REL, "agent");
}

// ---- volatile vector accesses (LL packets: one store or load of the whole packet) ---------

typedef unsigned int mscclppU32x4 __attribute__((ext_vector_type(4)));
typedef unsigned int mscclppU32x2 __attribute__((ext_vector_type(2)));

MSCCLPP_DEVICE_INLINE void storeVolatile16(void* p, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  mscclppU32x4 v = {a, b, c, d};
  *(volatile mscclppU32x4*)p = v;
}
MSCCLPP_DEVICE_INLINE void loadVolatile16(const void* p, uint32_t& a, uint32_t& b, uint32_t& c, uint32_t& d) {
  mscclppU32x4 v = *(const volatile mscclppU32x4*)p;
  a = v.x;
  b = v.y;
  c = v.z;
  d = v.w;
}
MSCCLPP_DEVICE_INLINE void storeVolatile8(void* p, uint32_t a, uint32_t b) {
  mscclppU32x2 v = {a, b};
  *(volatile mscclppU32x2*)p = v;
}
MSCCLPP_DEVICE_INLINE void loadVolatile8(const void* p, uint32_t& a, uint32_t& b) {
  mscclppU32x2 v = *(const volatile mscclppU32x2*)p;
  a = v.x;
  b = v.y;
}

// ---- shuffles ------------------------------------------------------------------------------

// `v` of thread `src` (0..8) of the calling thread's aligned group of eight lanes; every thread of
// the group must make the call together.
MSCCLPP_DEVICE_INLINE uint32_t shuffleInGroupOf8(uint32_t v, uint32_t src) { return __shfl(v, (int)src, 8); }

// The largest `v` of the calling wavefront, in every lane; every lane makes the call.
MSCCLPP_DEVICE_INLINE float warpMax(float v) {
  for (int off = (int)kWarpSize / 2; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor(v, off));
  return v;
}

// LL128 lines are not established on AMD fabrics (Capabilities::ll128 is false there), and
// hipRTC 5.2's structurizer aborts ("failed to annotate CFG") on their polling loop: the LL128
// kernel traps on HIP.
#define MSCCLPP_HAS_LL128 0

// ---- spinning -----------------------------------------------------------------------------

// Aborts the kernel.
MSCCLPP_DEVICE_INLINE void deviceTrap() { __builtin_trap(); }

// A clock in nanoseconds for waits bounded in time: the constant-rate real-time counter, counted
// at 100 MHz on CDNA 2 and 3 (hipDeviceAttributeWallClockRate); another rate only scales the
// bound.
MSCCLPP_DEVICE_INLINE uint64_t deviceClockNs() { return __builtin_amdgcn_s_memrealtime() * 10ull; }

// Between polls: a short sleep frees the issue slot for the other wavefronts of the CU.
MSCCLPP_DEVICE_INLINE void spinPause() { __builtin_amdgcn_s_sleep(1); }

// ---- multicast ----------------------------------------------------------------------------

// AMD GPUs have no multicast memory: switch channels work only in their member-list form, and
// these trap if reached (a handle with mc_ptr set is never made for a HIP device).
#define MSCCLPP_HAS_MULTIMEM 0

MSCCLPP_DEVICE_INLINE float multimemLoadReduceAddF32(const float*) {
  deviceTrap();
  return 0.0f;
}
MSCCLPP_DEVICE_INLINE void multimemLoadReduceAddF32x4(const float*, float& a, float& b, float& c, float& d) {
  a = b = c = d = 0.0f;
  deviceTrap();
}
MSCCLPP_DEVICE_INLINE void multimemStoreF32(float*, float) { deviceTrap(); }
MSCCLPP_DEVICE_INLINE void multimemStoreF32x4(float*, float, float, float, float) { deviceTrap(); }

}  // namespace mscclpp
