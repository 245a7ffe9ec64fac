#include "common/grpc_strict_parse.h"

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tandem {

grpc::Status ParseRequestBytes(grpc_byte_buffer* buffer, size_t max_bytes,
                               google::protobuf::Message* out) {
  if (buffer == nullptr) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("malformed request: no ", out->GetTypeName(), " message"));
  }
  const size_t bytes = grpc_byte_buffer_length(buffer);
  grpc::Status status;
  grpc_byte_buffer_reader reader;
  if (bytes > max_bytes) {
    status = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          absl::StrCat("request of ", bytes, " bytes > limit ", max_bytes));
  } else if (grpc_byte_buffer_reader_init(&reader, buffer) == 0) {
    status = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "malformed request: its compression does not decode");
  } else {
    // One contiguous copy (a no-op reference for the usual single-slice message).
    grpc_slice all = grpc_byte_buffer_reader_readall(&reader);
    grpc_byte_buffer_reader_destroy(&reader);
    const size_t length = GRPC_SLICE_LENGTH(all);
    if (length > max_bytes ||
        !out->ParseFromArray(GRPC_SLICE_START_PTR(all), static_cast<int>(length))) {
      status = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            absl::StrCat("malformed request: ", length, " bytes that are not a ",
                                         out->GetTypeName(), " message"));
    }
    grpc_slice_unref(all);
  }
  grpc_byte_buffer_destroy(buffer);
  return status;
}

StrictParsingService::StrictParsingService(absl::string_view service_full_name,
                                           size_t max_request_bytes)
    : service_name_(service_full_name),
      descriptor_(google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          std::string(service_full_name))),
      max_request_bytes_(max_request_bytes) {
  if (descriptor_ == nullptr) {
    status_ = absl::InvalidArgumentError(
        absl::StrCat("no protobuf service ", service_full_name, " is linked in"));
  }
}

void StrictParsingService::Add(absl::string_view method, grpc::internal::RpcMethod::RpcType type,
                               const google::protobuf::Descriptor& request,
                               const google::protobuf::Descriptor& response,
                               grpc::internal::MethodHandler* handler, bool callback) {
  paths_.push_back(absl::StrCat("/", service_name_, "/", method));
  auto* rpc = new grpc::internal::RpcServiceMethod(paths_.back().c_str(), type, handler);
  if (callback) rpc->SetServerApiType(grpc::internal::RpcServiceMethod::ApiType::CALL_BACK);
  AddMethod(rpc);
  registered_.emplace_back(method);
  if (!status_.ok() || descriptor_ == nullptr) return;
  const google::protobuf::MethodDescriptor* m = descriptor_->FindMethodByName(std::string(method));
  const bool streaming = type == grpc::internal::RpcMethod::SERVER_STREAMING;
  if (m == nullptr || m->client_streaming() || m->server_streaming() != streaming ||
      m->input_type() != &request || m->output_type() != &response) {
    status_ = absl::InvalidArgumentError(absl::StrCat(
        paths_.back(), " is registered with ", request.full_name(), " -> ", response.full_name(),
        streaming ? " (server streaming)" : "", ", which is not the proto's method"));
  }
}

absl::Status StrictParsingService::Complete() const {
  if (!status_.ok()) return status_;
  for (int i = 0; i < descriptor_->method_count(); ++i) {
    const std::string& name = descriptor_->method(i)->name();
    const auto n = std::count(registered_.begin(), registered_.end(), name);
    if (n != 1) {
      return absl::FailedPreconditionError(
          absl::StrCat("/", service_name_, "/", name, " is registered ", n, " times, not once"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem
