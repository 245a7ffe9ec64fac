// TcpStore: the key-value rendezvous of a process group, ours because Debian's Gloo ships only
// file, hash, prefix and redis stores. Rank 0 runs a TcpStoreServer on --dist_init=HOST:PORT
// (bound to that host only: the configured interface); every rank, rank 0 included, talks to
// it through a TcpStoreClient. Messages are tandem.v1.StoreRequest / StoreResponse protobufs,
// each framed by a 4-byte little-endian length and refused over kMaxStoreMessageBytes.
//
// Every call has a deadline: a server that is gone or silent gives UNAVAILABLE or
// DEADLINE_EXCEEDED, never a hang. GlooStore adapts a client to gloo::rendezvous::Store (Gloo
// reports failures by exception; the adapter throws gloo::IoException).
//
// Thread safety: TcpStoreServer is thread-safe (one thread per connection, one lock for the
// map); a TcpStoreClient serializes its calls (one connection).
#ifndef TANDEM_COMM_TCP_STORE_H_
#define TANDEM_COMM_TCP_STORE_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gloo/rendezvous/store.h"
#include "tandem/v1/comm.pb.h"

namespace tandem::comm {

class TcpStoreServer {
 public:
  // Listens on host:port (port 0: any free port). UNAVAILABLE when it cannot bind.
  static absl::StatusOr<std::unique_ptr<TcpStoreServer>> Start(const std::string& host, int port);
  ~TcpStoreServer();  // closes the listener and every connection, joins the threads
  int port() const { return port_; }

 private:
  TcpStoreServer() = default;
  void AcceptLoop();
  void Serve(int fd);
  tandem::v1::StoreResponse Handle(const tandem::v1::StoreRequest& request);

  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread acceptor_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
  std::vector<int> fds_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

class TcpStoreClient {
 public:
  // Connects to host:port, retrying until `timeout` (rank 0's server may start later).
  static absl::StatusOr<std::unique_ptr<TcpStoreClient>> Connect(const std::string& host, int port,
                                                                 absl::Duration timeout);
  ~TcpStoreClient();

  absl::Status Set(const std::string& key, const std::string& value, absl::Duration timeout);
  // Waits up to `timeout` for `key` to be set.
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout);
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout);

 private:
  explicit TcpStoreClient(int fd) : fd_(fd) {}
  absl::StatusOr<tandem::v1::StoreResponse> Call(const tandem::v1::StoreRequest& request,
                                                 absl::Duration timeout);
  absl::Mutex mu_;
  const int fd_;
};

// gloo::rendezvous::Store over a TcpStoreClient (not owned); every call bounded by `timeout`.
class GlooStore final : public gloo::rendezvous::Store {
 public:
  GlooStore(TcpStoreClient* client, std::string prefix, absl::Duration timeout)
      : client_(client), prefix_(std::move(prefix)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  TcpStoreClient* const client_;
  const std::string prefix_;
  const absl::Duration timeout_;
};

}  // namespace tandem::comm

#endif  // TANDEM_COMM_TCP_STORE_H_
