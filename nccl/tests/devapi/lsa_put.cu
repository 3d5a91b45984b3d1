// A kernel written against NCCL's public device API (nccl_device.h), run on this library:
// every rank puts its block into slot `rank` of every LSA peer's symmetric window through
// ncclGetLsaPointer, between two LSA barriers, for several launches with new values (the
// barriers' epochs persist across launches); then each rank checks that every slot holds the
// block its owner put. A second kernel does the same through ncclGetPeerPointer and world
// ranks; a third (headers of 2.30.3 or newer) through GIN: puts with a signal increment, a wait
// for every peer's signal, a flush. Built by nccl/tests/devapi_kernel.rs with nvcc; usage:
// lsa_put RANK NRANKS DIR.
#include <nccl.h>
#include <nccl_device.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <chrono>
#include <vector>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { fprintf(stderr, "rank %d: %s: %s\n", rank, #x, cudaGetErrorString(e)); return 1; } } while (0)
#define NK(x) do { ncclResult_t r = (x); if (r != ncclSuccess) { fprintf(stderr, "rank %d: %s: %d %s\n", rank, #x, (int)r, ncclGetLastError(NULL)); return 1; } } while (0)

static const int kBlocks = 8;
static const size_t kPer = 1 << 16;  // ints per rank's block

__device__ int value(int owner, size_t i, int round) { return owner * 1000003 + (int)i * 7 + round * 31; }

__global__ void lsaPut(ncclDevComm dc, ncclWindow_t win, int round) {
  ncclLsaBarrierSession<ncclCoopCta> bar{ncclCoopCta(), dc, ncclTeamLsa(dc), dc.lsaBarrier, blockIdx.x};
  bar.sync(ncclCoopCta(), cuda::memory_order_acquire);
  int me = dc.lsaRank;
  for (int peer = 0; peer < dc.lsaSize; peer++) {
    int* dst = (int*)ncclGetLsaPointer(win, (size_t)me * kPer * sizeof(int), peer);
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < kPer; i += (size_t)gridDim.x * blockDim.x)
      dst[i] = value(me, i, round);
  }
  bar.sync(ncclCoopCta(), cuda::memory_order_release);
}

__global__ void peerPut(ncclDevComm dc, ncclWindow_t win, int round) {
  ncclLsaBarrierSession<ncclCoopCta> bar{ncclCoopCta(), dc, ncclTeamLsa(dc), dc.lsaBarrier, blockIdx.x};
  bar.sync(ncclCoopCta(), cuda::memory_order_acquire);
  for (int peer = 0; peer < dc.nRanks; peer++) {
    int* dst = (int*)ncclGetPeerPointer(win, (size_t)dc.rank * kPer * sizeof(int), peer);
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < kPer; i += (size_t)gridDim.x * blockDim.x)
      dst[i] = value(dc.rank, i, round);
  }
  bar.sync(ncclCoopCta(), cuda::memory_order_release);
}

#if NCCL_VERSION_CODE >= 23003
#define HAVE_GIN 1
// Writes this rank's block into its own slot, then puts it into the same slot of every other
// rank over GIN with a signal increment, and waits until every other rank's put has signalled.
__global__ void ginPut(ncclDevComm dc, ncclWindow_t win, int round) {
  ncclGin gin{dc, 0};
  uint64_t before = gin.readSignal(0);
  ncclLsaBarrierSession<ncclCoopCta> bar{ncclCoopCta(), dc, ncclTeamLsa(dc), dc.lsaBarrier, blockIdx.x};
  bar.sync(ncclCoopCta(), cuda::memory_order_acquire);
  size_t bytes = kPer * sizeof(int);
  int* mine = (int*)ncclGetLsaPointer(win, (size_t)dc.rank * bytes, dc.lsaRank);
  for (size_t i = threadIdx.x; i < kPer; i += blockDim.x) mine[i] = value(dc.rank, i, round);
  __syncthreads();
  for (int peer = threadIdx.x; peer < dc.nRanks; peer += blockDim.x)
    if (peer != dc.rank)
      gin.put(ncclTeamWorld(dc), peer, win, (size_t)dc.rank * bytes, win, (size_t)dc.rank * bytes, bytes,
              ncclGin_SignalInc{0});
  gin.waitSignal(ncclCoopCta(), 0, before + dc.nRanks - 1);
  gin.flush(ncclCoopCta());
  bar.sync(ncclCoopCta(), cuda::memory_order_release);
}
#else
#define HAVE_GIN 0
#endif

int main(int argc, char** argv) {
  int rank = argc > 1 ? atoi(argv[1]) : -1;
  if (argc != 4) { fprintf(stderr, "usage: lsa_put RANK NRANKS DIR\n"); return 2; }
  int nranks = atoi(argv[2]);
  std::string dir = argv[3];
  CK(cudaSetDevice(0));
  ncclUniqueId id;
  std::string idf = dir + "/id";
  if (rank == 0) {
    NK(ncclGetUniqueId(&id));
    std::string tmp = idf + ".tmp";
    FILE* f = fopen(tmp.c_str(), "wb"); fwrite(&id, sizeof id, 1, f); fclose(f);
    rename(tmp.c_str(), idf.c_str());
  } else {
    for (int i = 0;; i++) {
      FILE* f = fopen(idf.c_str(), "rb");
      if (f) { size_t n = fread(&id, sizeof id, 1, f); fclose(f); if (n == 1) break; }
      if (i > 3000) { fprintf(stderr, "rank %d: no id\n", rank); return 1; }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ncclComm_t comm;
  NK(ncclCommInitRank(&comm, nranks, id, rank));
  ncclTeam_t lsa = ncclTeamLsa(comm);
  if (lsa.nRanks != nranks) { fprintf(stderr, "rank %d: LSA team of %d, not %d\n", rank, lsa.nRanks, nranks); return 1; }
  size_t bytes = (size_t)nranks * kPer * sizeof(int);
  void* buf;
  NK(ncclMemAlloc(&buf, bytes));
  CK(cudaMemset(buf, 0xff, bytes));
  ncclWindow_t win;
  NK(ncclCommWindowRegister(comm, buf, bytes, &win, NCCL_WIN_COLL_SYMMETRIC));
  ncclDevCommRequirements reqs = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
  reqs.lsaBarrierCount = kBlocks;
  int kinds = 2;
#if HAVE_GIN
  ncclCommProperties_t props = NCCL_COMM_PROPERTIES_INITIALIZER;
  NK(ncclCommQueryProperties(comm, &props));
  if (props.ginType == NCCL_GIN_TYPE_NONE) { fprintf(stderr, "rank %d: ginType NONE on one host\n", rank); return 1; }
  reqs.ginSignalCount = 1;
  reqs.ginConnectionType = NCCL_GIN_CONNECTION_FULL;
  kinds = 3;
#endif
  ncclDevComm dc;
  NK(ncclDevCommCreate(comm, &reqs, &dc));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<int> host(nranks * kPer);
  int rounds = 0;
  const char* names[3] = {"lsaPut", "peerPut", "ginPut"};
  for (int kind = 0; kind < kinds; kind++) {
    for (int round = 0; round < 5; round++, rounds++) {
      if (kind == 0) lsaPut<<<kBlocks, 256, 0, s>>>(dc, win, round);
      else if (kind == 1) peerPut<<<kBlocks, 256, 0, s>>>(dc, win, round);
#if HAVE_GIN
      else ginPut<<<1, 256, 0, s>>>(dc, win, round + 10);
#endif
      CK(cudaGetLastError());
      CK(cudaStreamSynchronize(s));
      CK(cudaMemcpy(host.data(), buf, bytes, cudaMemcpyDeviceToHost));
      size_t bad = 0;
      for (int o = 0; o < nranks; o++)
        for (size_t i = 0; i < kPer; i++)
          if (host[o * kPer + i] != o * 1000003 + (int)i * 7 + (round + (kind == 2 ? 10 : 0)) * 31) bad++;
      if (bad) { fprintf(stderr, "rank %d: %s round %d: %zu of %zu ints wrong\n", rank, names[kind], round, bad, nranks * kPer); return 1; }
    }
  }
  NK(ncclDevCommDestroy(comm, &dc));
  NK(ncclCommWindowDeregister(comm, win));
  NK(ncclMemFree(buf));
  NK(ncclCommDestroy(comm));
  printf("rank %d: %d launches of %d kernels over NCCL's device API%s, every slot right\n", rank, rounds, kinds,
         kinds == 3 ? " (LSA, peer pointers, GIN)" : " (LSA, peer pointers)");
  return 0;
}
