// The gather / scatter copies of NcclAgent's staging path on one GPU (nccl_agent_copy.h): the
// rate at which a message's pieces move between a KV pool and a packed staging buffer, for whole
// KV blocks (equal TP: contiguous pieces) and for the head slices of a re-shard between TP
// splits (rows of `row` bytes every `stride` bytes: StridedHeadOps), with each copy mode.
//
//   bazel-bin/kvtransfer/nccl/nccl_copy_bench [--mib=64] [--rows=256,512,1024,2048]
//                                             [--ratios=2,4] [--iters=20]
//
// Per line: a pool of 2 MiB blocks (random order), --mib MiB of kept bytes per message (the
// staging chunk), tiles as NcclLink builds them (128 KiB for the kernels; one per piece / run of
// rows for the engines), gather then scatter; GB/s of kept bytes, median of --iters after a
// warm-up. The kernels run with 32 CTAs (NcclAgentOptions::copy_ctas).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "kvtransfer/nccl/nccl_agent_copy.h"
#include "kvtransfer/nccl/nccl_agent_plan.h"

ABSL_FLAG(int, mib, 64, "kept MiB per message (staging chunk)");
ABSL_FLAG(std::string, rows, "256,512,1024,2048", "row bytes of the strided cases");
ABSL_FLAG(std::string, ratios, "2,4", "stride / row (source heads / kept heads)");
ABSL_FLAG(int, iters, 20, "timed repetitions per case");

namespace tandem::kvtransfer::nccl_copy {
namespace {

constexpr uint64_t kBlock = uint64_t{2} << 20;
constexpr uint64_t kKernelTile = uint64_t{128} << 10;  // NcclLink's
constexpr int kCtas = 32;

#define CHECK_CUDA(x)                                                                \
  do {                                                                               \
    cudaError_t e = (x);                                                             \
    if (e != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

std::vector<uint64_t> ParseList(const std::string& s) {
  std::vector<uint64_t> out;
  for (absl::string_view p : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    uint64_t v = 0;
    if (absl::SimpleAtoi(p, &v) && v > 0) out.push_back(v);
  }
  return out;
}

// Median seconds of one gather + one scatter of `plan`'s single message.
double TimeCase(const nccl_plan::Plan& plan, const std::vector<nccl_plan::OpPlace>& pool_place,
                char* staging, CopyMode mode, nccl_plan::CopyTile* d_tiles, cudaStream_t stream,
                int iters) {
  const bool engines = mode == CopyMode::kCopyEngine;
  std::vector<nccl_plan::CopyTile> tiles[2];
  const nccl_plan::Direction dirs[2] = {nccl_plan::Direction::kGather,
                                        nccl_plan::Direction::kScatter};
  for (int d = 0; d < 2; ++d) {
    for (const nccl_plan::Message& m : plan.messages) {
      nccl_plan::AppendTiles(plan, m, pool_place, reinterpret_cast<uint64_t>(staging), dirs[d],
                             engines ? UINT64_MAX : kKernelTile, &tiles[d]);
    }
  }
  const size_t n0 = tiles[0].size();
  if (!engines) {
    CHECK_CUDA(cudaMemcpy(d_tiles, tiles[0].data(), n0 * sizeof(nccl_plan::CopyTile),
                          cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_tiles + n0, tiles[1].data(),
                          tiles[1].size() * sizeof(nccl_plan::CopyTile), cudaMemcpyHostToDevice));
  }
  auto run = [&] {
    for (int d = 0; d < 2; ++d) {
      const uint32_t n = static_cast<uint32_t>(tiles[d].size());
      if (engines) {
        CHECK_CUDA(CopyTilesWithEngines(tiles[d].data(), n, stream));
      } else {
        CHECK_CUDA(LaunchCopyTiles(d_tiles + (d == 0 ? 0 : n0), n, kCtas,
                                   mode == CopyMode::kStreamingKernel, stream));
      }
    }
  };
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  run();
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<double> secs;
  for (int i = 0; i < iters; ++i) {
    CHECK_CUDA(cudaEventRecord(start, stream));
    run();
    CHECK_CUDA(cudaEventRecord(stop, stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    secs.push_back(ms / 1e3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(secs.begin(), secs.end());
  return secs[secs.size() / 2];
}

int Main() {
  const uint64_t kept = uint64_t(absl::GetFlag(FLAGS_mib)) << 20;
  const int iters = std::max(1, absl::GetFlag(FLAGS_iters));
  const std::vector<uint64_t> rows = ParseList(absl::GetFlag(FLAGS_rows));
  const std::vector<uint64_t> ratios = ParseList(absl::GetFlag(FLAGS_ratios));
  uint64_t max_ratio = 1;
  for (uint64_t r : ratios) max_ratio = std::max(max_ratio, r);
  const uint64_t pool_bytes = kept * max_ratio;
  const uint64_t blocks = pool_bytes / kBlock;
  char* pool = nullptr;
  char* staging = nullptr;
  nccl_plan::CopyTile* d_tiles = nullptr;
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&pool), pool_bytes));
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&staging), kept));
  CHECK_CUDA(cudaMemset(pool, 1, pool_bytes));
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&d_tiles),
                        2 * (kept / 32 + 1024) * sizeof(nccl_plan::CopyTile)));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("# %s; %llu MiB kept per message, blocks of 2 MiB in random order\n", prop.name,
              static_cast<unsigned long long>(kept >> 20));
  std::printf("%-28s %12s %12s %12s\n", "case", "kernel GB/s", "stream GB/s", "engines GB/s");
  std::mt19937_64 rng(7);
  // A case: ops of `row` bytes every `stride` bytes, one op per block (a block's rows).
  auto run_case = [&](const std::string& name, uint64_t row, uint64_t stride) {
    const uint64_t rows_per_block = kBlock / stride;
    const uint64_t op_bytes = rows_per_block * row;
    const uint64_t ops = kept / op_bytes;
    std::vector<uint64_t> order(blocks);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<nccl_plan::OpShape> shapes;
    std::vector<nccl_plan::OpPlace> places;
    for (uint64_t i = 0; i < ops; ++i) {
      const uint64_t base = reinterpret_cast<uint64_t>(pool) + order[i] * kBlock;
      if (row == stride) {
        shapes.push_back({kBlock, 1});
        places.push_back({base, 0});
      } else {
        shapes.push_back({row, rows_per_block});
        places.push_back({base, stride});
      }
    }
    absl::StatusOr<nccl_plan::Plan> plan = nccl_plan::MakePlan(shapes, {kept, UINT64_MAX >> 1});
    if (!plan.ok()) {
      std::fprintf(stderr, "%s\n", std::string(plan.status().message()).c_str());
      std::exit(1);
    }
    const uint64_t bytes = ops * op_bytes;
    std::printf("%-28s", name.c_str());
    for (CopyMode mode : {CopyMode::kKernel, CopyMode::kStreamingKernel, CopyMode::kCopyEngine}) {
      const double s = TimeCase(*plan, places, staging, mode, d_tiles, stream, iters);
      std::printf(" %12.1f", 2.0 * bytes / s / 1e9);  // gathered + scattered
    }
    std::printf("\n");
  };
  run_case("blocks (equal TP)", kBlock, kBlock);
  for (uint64_t ratio : ratios) {
    for (uint64_t row : rows) {
      run_case("rows " + std::to_string(row) + " B, 1/" + std::to_string(ratio) + " kept", row,
               row * ratio);
    }
  }
  cudaFree(pool);
  cudaFree(staging);
  cudaFree(d_tiles);
  return 0;
}

}  // namespace
}  // namespace tandem::kvtransfer::nccl_copy

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tandem::kvtransfer::nccl_copy::Main();
}
