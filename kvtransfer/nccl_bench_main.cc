// NcclAgent vs raw NCCL send/recv between two processes on two GPUs (issue 5: target >= 90%).
//
//   bazel-bin/kvtransfer/nccl_bench [--quick]
//
// The source agent runs in a re-executed copy of this binary on device 1 (nccl_agent_peer.h),
// the reader here on device 0. For each batch of B blocks of 2 MiB (random, mostly
// non-contiguous block ids on both sides): the agent's rate posts `iters` PostReads and waits
// for all; the raw rate is `iters` ncclRecv/ncclSend of the same B * 2 MiB as one buffer on a
// separate communicator. Both after one warm-up round.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kvtransfer/copy_ops.h"
#include "kvtransfer/nccl_agent.h"
#include "kvtransfer/nccl_agent_peer.h"

namespace tandem::kvtransfer {
namespace {

constexpr uint64_t kBlockBytes = uint64_t{2} << 20;
constexpr uint32_t kPoolBlocks = 1024;
constexpr uint64_t kPoolBytes = kBlockBytes * kPoolBlocks;

#define CHECK_OK(expr)                                                                   \
  do {                                                                                   \
    auto _s = (expr);                                                                    \
    if (!_s.ok()) {                                                                      \
      std::fprintf(stderr, "%s failed: %s\n", #expr, std::string(_s.message()).c_str()); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (false)
#define CHECK_TRUE(cond)                                 \
  do {                                                   \
    if (!(cond)) {                                       \
      std::fprintf(stderr, "check failed: %s\n", #cond); \
      std::exit(1);                                      \
    }                                                    \
  } while (false)

double AgentSeconds(NcclAgent& agent, const std::vector<CopyOp>& ops, int iters) {
  const absl::Time start = absl::Now();
  std::vector<TransferId> ids;
  for (int i = 0; i < iters; ++i) {
    auto id = agent.PostRead("src", ops);
    CHECK_OK(id.status());
    ids.push_back(*id);
  }
  for (TransferId id : ids) {
    for (;;) {
      auto r = agent.CheckTransfer(id);
      CHECK_OK(r.status());
      if (*r) break;
    }
  }
  return absl::ToDoubleSeconds(absl::Now() - start);
}

double RawSeconds(nccl_peer::PeerProcess& peer, ncclComm_t comm, cudaStream_t stream, char* buf,
                  uint64_t bytes, int iters) {
  const absl::Time start = absl::Now();
  CHECK_OK(peer.RawSend(bytes, static_cast<uint32_t>(iters)));
  for (int i = 0; i < iters; ++i)
    CHECK_TRUE(ncclRecv(buf, bytes, ncclInt8, 1, comm, stream) == ncclSuccess);
  CHECK_TRUE(cudaStreamSynchronize(stream) == cudaSuccess);
  CHECK_OK(peer.WaitRawDone());
  return absl::ToDoubleSeconds(absl::Now() - start);
}

int Run(bool quick) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < 2) {
    std::printf("nccl_bench: needs 2 GPUs, found %d; skipped\n", count);
    return 0;
  }
  auto peer = nccl_peer::PeerProcess::Spawn(1, kPoolBytes, 1);
  CHECK_OK(peer.status());
  CHECK_TRUE(cudaSetDevice(0) == cudaSuccess);
  char* local = nullptr;
  CHECK_TRUE(cudaMalloc(reinterpret_cast<void**>(&local), kPoolBytes) == cudaSuccess);
  auto agent = NcclAgent::Create({.device = 0});
  CHECK_OK(agent.status());
  CHECK_OK((*agent)->RegisterMemory(local, kPoolBytes, tandem::v1::MEMORY_KIND_CUDA).status());
  CHECK_OK((*agent)->AddPeer("src", peer->descriptor()));

  ncclUniqueId id;
  CHECK_TRUE(ncclGetUniqueId(&id) == ncclSuccess);
  CHECK_OK(peer->RawInit(std::string(reinterpret_cast<const char*>(&id), sizeof(id))));
  ncclComm_t raw = nullptr;
  CHECK_TRUE(ncclCommInitRank(&raw, 2, id, 0) == ncclSuccess);
  cudaStream_t stream = nullptr;
  CHECK_TRUE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);

  std::mt19937_64 rng(7);
  std::printf("%8s %10s %6s %12s %12s %8s\n", "blocks", "MiB/batch", "iters", "agent GB/s",
              "raw GB/s", "agent%");
  for (uint32_t blocks : {1u, 16u, 64u, 256u, 1024u}) {
    std::vector<uint32_t> src(kPoolBlocks), dst(kPoolBlocks);
    std::iota(src.begin(), src.end(), 0);
    std::iota(dst.begin(), dst.end(), 0);
    std::shuffle(src.begin(), src.end(), rng);
    std::shuffle(dst.begin(), dst.end(), rng);
    src.resize(blocks);
    dst.resize(blocks);
    const std::vector<CopyOp> ops = BlockCopyOps(0, 0, kBlockBytes, dst, src);
    const uint64_t bytes = blocks * kBlockBytes;
    const int iters = std::max(quick ? 2 : 5, static_cast<int>((quick ? 256 : 4096) / blocks));
    AgentSeconds(**agent, ops, 1);
    RawSeconds(*peer, raw, stream, local, bytes, 1);
    const double agent_s = AgentSeconds(**agent, ops, iters);
    const double raw_s = RawSeconds(*peer, raw, stream, local, bytes, iters);
    const double total = static_cast<double>(bytes) * iters;
    const double agent_gbs = total / agent_s / 1e9, raw_gbs = total / raw_s / 1e9;
    std::printf("%8u %10llu %6d %12.1f %12.1f %7.1f%%\n", blocks,
                static_cast<unsigned long long>(bytes >> 20), iters, agent_gbs, raw_gbs,
                100.0 * agent_gbs / raw_gbs);
    std::fflush(stdout);
  }
  agent->reset();
  // Abort, not destroy: ncclCommDestroy waits for the peer, which only leaves its command loop
  // once our pipe closes (after this returns).
  ncclCommAbort(raw);
  cudaStreamDestroy(stream);
  cudaFree(local);
  return 0;
}

}  // namespace
}  // namespace tandem::kvtransfer

int main(int argc, char** argv) {
  const int peer_rc = tandem::kvtransfer::nccl_peer::MaybeRunPeer();
  if (peer_rc >= 0) return peer_rc;
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  return tandem::kvtransfer::Run(quick);
}
