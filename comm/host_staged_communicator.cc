#include "comm/host_staged_communicator.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"

namespace tandem::comm {
namespace {

float HalfBitsToFloat(uint16_t bits, CommDtype dtype) {
  if (dtype == CommDtype::kBf16) {
    __nv_bfloat16_raw raw;
    raw.x = bits;
    return __bfloat162float(__nv_bfloat16(raw));
  }
  __half_raw raw;
  raw.x = bits;
  return __half2float(__half(raw));
}

uint16_t FloatToHalfBits(float v, CommDtype dtype) {
  if (dtype == CommDtype::kBf16) {
    return static_cast<__nv_bfloat16_raw>(__float2bfloat16_rn(v)).x;
  }
  return static_cast<__half_raw>(__float2half_rn(v)).x;
}

}  // namespace

absl::Status HostStagedCommunicator::Download(const void* device, int64_t count, CommDtype dtype,
                                              DeviceStream stream, std::vector<float>* host) {
  if (count < 0) return absl::InvalidArgumentError("negative element count");
  host->resize(count);
  if (dtype == CommDtype::kF32) {
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(host->data(), device, count * 4, cudaMemcpyDeviceToHost, stream));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    return absl::OkStatus();
  }
  half_.resize(count);
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(half_.data(), device, count * 2, cudaMemcpyDeviceToHost, stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  for (int64_t i = 0; i < count; ++i) (*host)[i] = HalfBitsToFloat(half_[i], dtype);
  return absl::OkStatus();
}

absl::Status HostStagedCommunicator::Upload(const std::vector<float>& host, CommDtype dtype,
                                            DeviceStream stream, void* device) {
  const int64_t count = static_cast<int64_t>(host.size());
  if (dtype == CommDtype::kF32) {
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(device, host.data(), count * 4, cudaMemcpyHostToDevice, stream));
  } else {
    half_.resize(count);
    for (int64_t i = 0; i < count; ++i) half_[i] = FloatToHalfBits(host[i], dtype);
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(device, half_.data(), count * 2, cudaMemcpyHostToDevice, stream));
  }
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

absl::Status HostStagedCommunicator::AllReduceSum(void* data, int64_t count, CommDtype dtype,
                                                  DeviceStream stream) {
  RETURN_IF_ERROR(Download(data, count, dtype, stream, &in_));
  RETURN_IF_ERROR(group_->AllReduceSum(absl::MakeSpan(in_)));
  return Upload(in_, dtype, stream, data);
}

absl::Status HostStagedCommunicator::AllGather(const void* in, void* out, int64_t count,
                                               CommDtype dtype, DeviceStream stream) {
  RETURN_IF_ERROR(Download(in, count, dtype, stream, &in_));
  out_.resize(count * size());
  RETURN_IF_ERROR(group_->AllGather(in_, absl::MakeSpan(out_)));
  return Upload(out_, dtype, stream, out);
}

absl::Status HostStagedCommunicator::ReduceScatterSum(const void* in, void* out, int64_t count,
                                                      CommDtype dtype, DeviceStream stream) {
  RETURN_IF_ERROR(Download(in, count * size(), dtype, stream, &in_));
  out_.resize(count);
  RETURN_IF_ERROR(group_->ReduceScatterSum(in_, absl::MakeSpan(out_)));
  return Upload(out_, dtype, stream, out);
}

absl::Status HostStagedCommunicator::AllToAll(const void* in, absl::Span<const int64_t> send_counts,
                                              void* out, absl::Span<const int64_t> recv_counts,
                                              CommDtype dtype, DeviceStream stream) {
  int64_t sent = 0, received = 0;
  for (int64_t c : send_counts) sent += c;
  for (int64_t c : recv_counts) received += c;
  RETURN_IF_ERROR(Download(in, sent, dtype, stream, &in_));
  out_.resize(received);
  RETURN_IF_ERROR(group_->AllToAll(in_, send_counts, absl::MakeSpan(out_), recv_counts));
  return Upload(out_, dtype, stream, out);
}

absl::Status HostStagedCommunicator::Send(const void* data, int64_t count, CommDtype dtype,
                                          int peer, DeviceStream stream) {
  RETURN_IF_ERROR(Download(data, count, dtype, stream, &in_));
  return group_->Send(in_, peer);
}

absl::Status HostStagedCommunicator::Recv(void* data, int64_t count, CommDtype dtype, int peer,
                                          DeviceStream stream) {
  if (count < 0) return absl::InvalidArgumentError("negative element count");
  out_.resize(count);
  RETURN_IF_ERROR(group_->Recv(absl::MakeSpan(out_), peer));
  return Upload(out_, dtype, stream, data);
}

absl::Status HostStagedCommunicator::Synchronize(DeviceStream stream) {
  RETURN_IF_ERROR(status());
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

}  // namespace tandem::comm
