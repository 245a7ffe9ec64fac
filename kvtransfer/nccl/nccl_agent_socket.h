// Blocking TCP helpers for NcclAgent's control sockets (kvtransfer/nccl/nccl_agent.h). Pure POSIX,
// no CUDA. Errors: UNAVAILABLE for a closed/reset connection or a failed connect,
// DEADLINE_EXCEEDED for a timeout, CANCELLED when `stop` was raised while waiting.
//
// Thread safety: functions are stateless; one fd must not be read by two threads at once.
#ifndef TANDEM_KVTRANSFER_NCCL_AGENT_SOCKET_H_
#define TANDEM_KVTRANSFER_NCCL_AGENT_SOCKET_H_

#include <atomic>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "kvtransfer/nccl/nccl_agent_wire.h"

namespace tandem::kvtransfer::nccl_socket {

// Binds and listens on host:port (port 0: any); *bound_port gets the port. Returns the fd.
absl::StatusOr<int> Listen(const std::string& host, int port, int* bound_port);
// Connects with a timeout; returns the fd (TCP_NODELAY set).
absl::StatusOr<int> Connect(const std::string& host, int port, absl::Duration timeout);

absl::Status SendFrame(int fd, nccl_wire::MessageType type, absl::string_view payload);
// Waits (checking `stop` every few ms) up to `timeout` for a whole frame and reads it. A frame
// announcing more than `max_payload` bytes is refused (UNAVAILABLE) before its payload is read.
absl::Status RecvFrame(int fd, const std::atomic<bool>& stop, absl::Duration timeout,
                       nccl_wire::MessageType* type, std::string* payload,
                       uint32_t max_payload = nccl_wire::kMaxPayloadBytes);
// Non-blocking: UNAVAILABLE when the peer closed/reset the connection, INTERNAL when it sent
// unexpected bytes, OK otherwise.
absl::Status CheckAlive(int fd);
// Non-blocking: UNAVAILABLE when the peer closed/reset the connection and nothing is left to
// read, OK otherwise (unread bytes stay for RecvFrame).
absl::Status CheckOpen(int fd);
// Waits until `fd` is readable: OK, CANCELLED (stop) or DEADLINE_EXCEEDED. A zero timeout
// polls once without sleeping.
absl::Status WaitReadable(int fd, const std::atomic<bool>& stop, absl::Duration timeout);

}  // namespace tandem::kvtransfer::nccl_socket

#endif  // TANDEM_KVTRANSFER_NCCL_AGENT_SOCKET_H_
