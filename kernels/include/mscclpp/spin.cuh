// The bounded spin of every wait, and the abort word that lets a module's waits give up on a dead
// peer. Vendor-neutral: built on core.cuh's deviceTrap, spinPause and loadRelaxedSystem.
#pragma once

#include "mscclpp/core.cuh"

namespace mscclpp {

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

// How long a wait of a module with an abort word may last before it traps. Such a module has a
// way out that NCCL's callers use (ncclCommAbort, a dead peer reported by the host), so its bound
// is in time and long: a peer late by minutes (a checkpoint being written, a slow first step) is
// a legitimate wait that NCCL serves, and PyTorch's watchdog (10 min by default) aborts first.
// A count of polls would not do: 10^8 polls of mapped memory last tens of seconds.
#ifndef MSCCLPP_DEVICE_WAIT_SECONDS
#define MSCCLPP_DEVICE_WAIT_SECONDS 1800
#endif

#if MSCCLPP_DEVICE_ABORT
// The block's abort state: the word's device address (0: none), bit 0 set once a wait of the
// block saw the word set (addresses are 8-byte aligned). Shared memory is not zeroed at launch:
// abortWordInit must come first. Every thread stores it (the same value), so that no barrier sits
// on the kernel's path; a late thread's store may clear the bit, which only costs its next wait
// a read of the word.
__shared__ uint64_t abortState;

MSCCLPP_DEVICE_INLINE void abortWordInit(uint64_t addr) { *(volatile uint64_t*)&abortState = addr & ~1ull; }

// Whether a wait that began at `*since` (0: this is its first check, which records the clock)
// has run past MSCCLPP_DEVICE_WAIT_SECONDS; where the block has no abort word (none could be
// allocated: address 0), nothing can end the wait early, so the poll bound stays (`spins` past
// `maxSpinCount`). Out of line, called every kAbortPollSpins polls, so that the clock costs the
// waits no registers. A clock that has not moved past the start (or went back) is not expired.
__device__ __noinline__ bool waitExpired(uint64_t* since, int64_t spins, int64_t maxSpinCount) {
  if ((*(volatile uint64_t*)&abortState & ~1ull) == 0) return spins > maxSpinCount;
  const uint64_t now = deviceClockNs();
  if (*since == 0) {
    *since = now | 1;
    return false;
  }
  return now > *since && now - *since > (uint64_t)MSCCLPP_DEVICE_WAIT_SECONDS * 1000000000ull;
}

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

// Polls `done()` until it returns true; traps after `maxSpinCount` polls (never when negative),
// or, in MSCCLPP_DEVICE_ABORT modules, after MSCCLPP_DEVICE_WAIT_SECONDS (a non-negative
// `maxSpinCount` only says that the wait is bounded). Returns false when it gave up on the
// kernel's abort word (MSCCLPP_DEVICE_ABORT modules only).
// Threads whose polls must stay together (a shuffle in `done`) pass an `agree` that makes the
// decision to give up the same in each of them (it is called at the same poll in every one).
template <typename Done, typename Agree = SpinAlone>
MSCCLPP_DEVICE_INLINE bool spinUntil(Done done, int64_t maxSpinCount = MSCCLPP_DEFAULT_MAX_SPIN,
                                     Agree agree = Agree()) {
  int64_t spins = 0;
#if MSCCLPP_DEVICE_ABORT
  uint64_t since = 0;
#endif
  while (!done()) {
#if MSCCLPP_DEVICE_ABORT
    if ((spins & (kAbortPollSpins - 1)) == 0) {
      if (agree(abortRequested(spins != 0))) return false;
      if (maxSpinCount >= 0 && waitExpired(&since, spins, maxSpinCount)) deviceTrap();
    }
    ++spins;
#else
    (void)agree;
    if (maxSpinCount >= 0 && ++spins > maxSpinCount) deviceTrap();
#endif
    spinPause();
  }
  return true;
}

}  // namespace mscclpp
