// Bytes on the wire without the generated stubs: a request of any method as raw bytes
// (grpc::GenericStub), malformed protobuf payloads that the local parser refuses, and raw TCP to
// every port a daemon listens on.
#ifndef TANDEM_TESTS_RELIABILITY_RAW_WIRE_H_
#define TANDEM_TESTS_RELIABILITY_RAW_WIRE_H_

#include <sys/types.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "google/protobuf/message.h"
#include "grpcpp/grpcpp.h"

namespace tandem::reliability {

// A gRPC method of a daemon and a prototype of its request message.
// The worker id RouterMethods' registry calls speak for, with a certificate naming it (a cluster
// for them needs ClusterOptions::extra_worker_certs = {kRawWorkerCert}).
inline constexpr char kRawWorkerId[] = "raw-worker";
inline constexpr char kRawWorkerCert[] = "raw-worker:prefill";

struct RawMethod {
  std::string path;  // "/tandem.v1.Router/Generate"
  std::shared_ptr<const google::protobuf::Message> request;
  // A valid request of this method (truncations are cut from it); may be empty.
  std::string sample;
  // The certificate (role) a caller presents on an internal port; "" for the router's public
  // port (Router: TLS + API key).
  std::string cert;
};
// The router's port: Router and WorkerRegistry.
std::vector<RawMethod> RouterMethods();
// A worker's port: WorkerService and KvTransferService.
std::vector<RawMethod> WorkerMethods();

// `bytes` as the single request message of `method` (unary framing, also for server-streaming
// methods: the server reads one message either way). The answer's status; bounded by `deadline`.
grpc::Status CallRaw(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                     const std::string& bytes, absl::Duration deadline = absl::Seconds(10));

struct Payload {
  std::string what;
  std::string bytes;
  bool malformed = false;  // the local protobuf parser refuses it as `method`'s request
};
// Random garbage, truncations of the sample, overlong varints, invalid wire types, field 0,
// lengths past the end, invalid UTF-8 in string field 1, unterminated groups nested 200 deep.
std::vector<Payload> MalformedPayloads(const RawMethod& method, std::mt19937& rng);

// A TCP socket a process listens on: the local address as text ("127.0.0.1", "0.0.0.0", "::",
// "10.1.2.3"; an IPv4-mapped IPv6 address as its IPv4 one) and the port.
struct TcpListener {
  std::string address;
  int port = 0;
};
// The TCP sockets `pid` listens on (IPv4 and IPv6), from /proc/PID/fd and /proc/PID/net/tcp{,6}.
std::vector<TcpListener> ListeningTcpSockets(pid_t pid);
// Their ports, each once.
std::vector<int> ListeningTcpPorts(pid_t pid);

// Connects to 127.0.0.1:`port`, writes `bytes`, and waits up to `wait` for the peer to close.
// Returns "closed", "open" (still open after `wait`; we close it) or "refused"/"error: ...".
std::string SendRawTcp(int port, const std::string& bytes, absl::Duration wait);

}  // namespace tandem::reliability

#endif  // TANDEM_TESTS_RELIABILITY_RAW_WIRE_H_
