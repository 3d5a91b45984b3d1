// A kernel written against NCCL's public device API (nccl_device.h), run on this library:
// every rank puts its block into slot `rank` of every LSA peer's symmetric window through
// ncclGetLsaPointer, between two LSA barriers, for several launches with new values (the
// barriers' epochs persist across launches); then each rank checks that every slot holds the
// block its owner put. A second kernel does the same through ncclGetPeerPointer and world
// ranks. Built by nccl/tests/devapi_kernel.rs with nvcc; usage: lsa_put RANK NRANKS DIR.
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
  ncclDevComm dc;
  NK(ncclDevCommCreate(comm, &reqs, &dc));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<int> host(nranks * kPer);
  int rounds = 0;
  for (int kind = 0; kind < 2; kind++) {
    for (int round = 0; round < 5; round++, rounds++) {
      if (kind == 0) lsaPut<<<kBlocks, 256, 0, s>>>(dc, win, round);
      else peerPut<<<kBlocks, 256, 0, s>>>(dc, win, round);
      CK(cudaGetLastError());
      CK(cudaStreamSynchronize(s));
      CK(cudaMemcpy(host.data(), buf, bytes, cudaMemcpyDeviceToHost));
      size_t bad = 0;
      for (int o = 0; o < nranks; o++)
        for (size_t i = 0; i < kPer; i++)
          if (host[o * kPer + i] != o * 1000003 + (int)i * 7 + round * 31) bad++;
      if (bad) { fprintf(stderr, "rank %d: %s round %d: %zu of %zu ints wrong\n", rank, kind ? "peerPut" : "lsaPut", round, bad, nranks * kPer); return 1; }
    }
  }
  NK(ncclDevCommDestroy(comm, &dc));
  NK(ncclCommWindowDeregister(comm, win));
  NK(ncclMemFree(buf));
  NK(ncclCommDestroy(comm));
  printf("rank %d: %d launches of two kernels over NCCL's device API, every slot right\n", rank, rounds);
  return 0;
}
