// Shared by dcp_bench's layers (dcp_bench_layer.cc: GQA, dcp_bench_mla.cc: MLA): fixed-seed
// device data (the same bytes on every rank, which the checks rely on), host <-> device copies
// and the timer of one config's steps (CUDA-graph replays or eager calls).
//
// Thread safety: a Timer drives one stream from one thread.
#ifndef TANDEM_RUNTIME_PARALLEL_DCP_BENCH_DCP_BENCH_UTIL_H_
#define TANDEM_RUNTIME_PARALLEL_DCP_BENCH_DCP_BENCH_UTIL_H_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/device_communicator.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/attention/cuda/dcp_exchange_cuda.h"
#include "runtime/parallel/dcp_bench/dcp_bench_layer.h"

namespace tandem::runtime::dcp_bench {

// One call's KV rotates over copies of the tables until it reads at least this much, so the
// 50-60 MB L2 does not hold it between calls.
inline constexpr int64_t kRotateBytes = int64_t{1} << 30;
inline constexpr int64_t kMaxSets = 16;
inline constexpr int64_t kMarginBytes = int64_t{512} << 20;  // plan workspaces, NCCL's buffers

// Host numbers of one config.
struct Geometry {
  int64_t local_max = 0;       // rank 0's tokens of a request: the most any rank holds
  int64_t local = 0;           // this rank's tokens of a request
  int64_t blocks_per_seq = 0;  // block-table row length (rank 0's blocks)
  int64_t block_bytes = 0;     // K + V (or the latent) of one block of the one-layer pool
  int64_t sets = 1;            // rotating copies of the batch's block tables
  int64_t pool_blocks = 0;
};
Geometry GeometryOf(const LayerConfig& c);

// Largest |got - want| over max |want| of this rank's heads: `want` is the whole attention
// [batch][num_heads][dim], `got` the rank's merged slice [batch][heads_per_rank][dim] (heads
// rank * heads_per_rank onward); a NaN in `got` gives infinity.
double RankSliceRelError(const std::vector<float>& want, const std::vector<float>& got,
                         int64_t batch, int64_t num_heads, int64_t rank, int64_t heads_per_rank,
                         int64_t dim);

// Layers per measurement: about 20 ms of attention at ~3 TB/s, 20..500 (c.iters if set).
int ItersFor(const LayerConfig& c);

// RunLayer for an MLA shape (dcp_bench_mla.cc), and the device memory it needs beyond the pool.
absl::StatusOr<LayerTimes> RunMlaLayer(const LayerConfig& c, comm::DeviceCommunicator* comm,
                                       int num_sms);
int64_t MlaDeviceBytes(const LayerConfig& c);

// Fills `bytes` of device memory with bf16 N(0, 1) values times `scale` (rounded), never zero (a
// zero KV row would make every score equal and hide indexing mistakes), from a fixed seed: the
// same on every rank.
absl::Status FillRandomBf16(void* data, int64_t bytes, float scale = 1.0f);

template <typename T>
absl::Status Upload(const std::vector<T>& host, T* device) {
  CUDA_RETURN_IF_ERROR(
      cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return absl::OkStatus();
}

// `count` bf16 values from the device, as floats.
absl::StatusOr<std::vector<float>> Download(const __nv_bfloat16* device, int64_t count);

using Step = std::function<absl::Status(int)>;  // enqueues layer call i on the stream

// The DCP exchange after a rank's attention, the same for the GQA and the MLA layer: pack the
// partial + LSE, one all-to-all, the LSE merge; and `layer` = attention then those three. The
// buffer mixes bf16 and fp32: moved as fp32 words (RegionBytes is a multiple of 16), so the
// host-staged path copies bits instead of rounding them as bf16. `s` (out, lse, layout, send,
// recv, merged, merged_lse) must outlive the steps; `st.attention` must be set.
template <typename State, typename Steps>
void SetExchangeSteps(State& s, comm::DeviceCommunicator* comm, cudaStream_t stream, Steps& st) {
  namespace kc = ::tandem::kernels::cuda;
  st.pack = [&s, stream](int) {
    return kc::DcpPackForExchange<__nv_bfloat16>(s.out, s.lse, s.layout, s.send, stream);
  };
  st.all_to_all = [&s, comm, stream](int) {
    const std::vector<int64_t> counts(s.layout.dcp_size, s.layout.RegionBytes() / 4);
    return comm->AllToAll(s.send, counts, s.recv, counts, comm::CommDtype::kF32, stream);
  };
  st.merge = [&s, stream](int) {
    return kc::DcpMergeReceived<__nv_bfloat16>(s.recv, s.layout, s.merged, s.merged_lse, stream);
  };
  st.layer = [st](int i) -> absl::Status {
    RETURN_IF_ERROR(st.attention(i));
    RETURN_IF_ERROR(st.pack(i));
    RETURN_IF_ERROR(st.all_to_all(i));
    return st.merge(i);
  };
}

// Times steps on one stream: CUDA events around many calls. Waits go through the communicator
// when there is one, so a dead or wedged peer fails the wait at its deadline instead of hanging.
class Timer {
 public:
  Timer(cudaStream_t stream, comm::DeviceCommunicator* comm, bool graphs, int iters)
      : stream_(stream), comm_(comm), graphs_(graphs), iters_(iters) {}

  // Microseconds per call of `step`, after warm-up.
  absl::StatusOr<double> Us(const Step& step) { return graphs_ ? GraphUs(step) : EagerUs(step); }
  absl::Status Wait() {
    if (comm_ != nullptr) return comm_->Synchronize(stream_);
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }

 private:
  // Microseconds between events around what `enqueue` puts on the stream.
  absl::StatusOr<double> Elapsed(const std::function<absl::Status()>& enqueue) {
    cudaEvent_t start, stop;
    CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
    CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));
    absl::Status status =
        CudaStatus(cudaEventRecord(start, stream_), {"record", __FILE__, __LINE__});
    if (status.ok()) status = enqueue();
    if (status.ok())
      status = CudaStatus(cudaEventRecord(stop, stream_), {"record", __FILE__, __LINE__});
    if (status.ok()) status = Wait();
    float ms = 0;
    if (status.ok()) {
      status = CudaStatus(cudaEventElapsedTime(&ms, start, stop), {"elapsed", __FILE__, __LINE__});
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    RETURN_IF_ERROR(status);
    return 1e3 * ms;
  }

  // Call by call, after 3 warm-up calls; includes the host's launch cost where it exceeds the
  // device's time (and, host-staged, the staging copies).
  absl::StatusOr<double> EagerUs(const Step& step) {
    for (int i = 0; i < 3; ++i) RETURN_IF_ERROR(step(i));
    RETURN_IF_ERROR(Wait());
    ASSIGN_OR_RETURN(const double us, Elapsed([&]() -> absl::Status {
                       for (int i = 0; i < iters_; ++i) RETURN_IF_ERROR(step(i));
                       return absl::OkStatus();
                     }));
    return us / iters_;
  }

  // iters_ calls captured in one CUDA graph, as the engine runs a decode step: device time. The
  // warm-up replay and the timed ones are enqueued back to back, so the ranks' timed replays
  // start together (the warm-up's last collective lines them up).
  absl::StatusOr<double> GraphUs(const Step& step) {
    RETURN_IF_ERROR(step(0));  // eager first: NCCL connects its peers outside the capture
    RETURN_IF_ERROR(Wait());
    cudaGraph_t graph;
    CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    absl::Status captured = absl::OkStatus();
    for (int i = 0; i < iters_ && captured.ok(); ++i) captured = step(i);
    CUDA_RETURN_IF_ERROR(cudaStreamEndCapture(stream_, &graph));
    RETURN_IF_ERROR(captured);
    cudaGraphExec_t exec;
    const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    CUDA_RETURN_IF_ERROR(instantiated);
    const cudaError_t warm = cudaGraphLaunch(exec, stream_);  // not waited for: see above
    if (warm != cudaSuccess) cudaGraphExecDestroy(exec);
    CUDA_RETURN_IF_ERROR(warm);
    constexpr int kReplays = 3;
    absl::StatusOr<double> us = Elapsed([&]() -> absl::Status {
      for (int r = 0; r < kReplays; ++r) CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, stream_));
      return absl::OkStatus();
    });
    cudaGraphExecDestroy(exec);
    if (!us.ok()) return us.status();
    return *us / (kReplays * iters_);
  }

  cudaStream_t stream_;
  comm::DeviceCommunicator* comm_;
  bool graphs_;
  int iters_;
};

}  // namespace tandem::runtime::dcp_bench

#endif  // TANDEM_RUNTIME_PARALLEL_DCP_BENCH_DCP_BENCH_UTIL_H_
