// HostStagedCommunicator: DeviceCommunicator (device_communicator.h) that copies device tensors
// to host memory, runs the collective on a host ProcessGroup (Gloo) in fp32, and copies the
// result back. The correctness path for CUDA ranks sharing one GPU (NCCL refuses two ranks on
// one device) and for machines without a usable NCCL transport; slow (two synchronizing copies
// per call) and not capturable in CUDA graphs. Every call returns with its result on the device
// (it synchronizes the stream), so Synchronize() only waits for the rest of the stream.
//
// Failures are the host group's (its deadline; UNAVAILABLE for a dead peer).
// Thread safety: as DeviceCommunicator.
#ifndef TANDEM_COMM_HOST_STAGED_COMMUNICATOR_H_
#define TANDEM_COMM_HOST_STAGED_COMMUNICATOR_H_

#include <cstdint>
#include <vector>

#include "comm/device_communicator.h"
#include "comm/process_group.h"

namespace tandem::comm {

class HostStagedCommunicator final : public DeviceCommunicator {
 public:
  // `group` outlives this communicator.
  explicit HostStagedCommunicator(ProcessGroup* group) : group_(group) {}

  int rank() const override { return group_->rank(); }
  int size() const override { return group_->size(); }
  absl::Status status() const override { return group_->status(); }
  std::string_view backend() const override { return "gloo-host-staged"; }
  bool graph_capturable() const override { return false; }

  absl::Status AllReduceSum(void* data, int64_t count, CommDtype dtype,
                            DeviceStream stream) override;
  absl::Status AllGather(const void* in, void* out, int64_t count, CommDtype dtype,
                         DeviceStream stream) override;
  absl::Status ReduceScatterSum(const void* in, void* out, int64_t count, CommDtype dtype,
                                DeviceStream stream) override;
  absl::Status AllToAll(const void* in, absl::Span<const int64_t> send_counts, void* out,
                        absl::Span<const int64_t> recv_counts, CommDtype dtype,
                        DeviceStream stream) override;
  absl::Status Send(const void* data, int64_t count, CommDtype dtype, int peer,
                    DeviceStream stream) override;
  absl::Status Recv(void* data, int64_t count, CommDtype dtype, int peer,
                    DeviceStream stream) override;
  absl::Status Synchronize(DeviceStream stream) override;

 private:
  // Device [count] in `dtype` -> `*host` fp32 (synchronizes the stream).
  absl::Status Download(const void* device, int64_t count, CommDtype dtype, DeviceStream stream,
                        std::vector<float>* host);
  // host fp32 -> device [host.size()] in `dtype` (synchronizes: the staging buffer is reused).
  absl::Status Upload(const std::vector<float>& host, CommDtype dtype, DeviceStream stream,
                      void* device);

  ProcessGroup* const group_;
  std::vector<uint16_t> half_;  // 16-bit staging
  std::vector<float> in_, out_;
};

}  // namespace tandem::comm

#endif  // TANDEM_COMM_HOST_STAGED_COMMUNICATOR_H_
