// GlooProcessGroup: ProcessGroup (process_group.h) over Gloo with its TCP transport, on host
// memory. The ranks meet through the TcpStore on --dist_init=HOST:PORT (rank 0 serves it); each
// rank's Gloo device binds `bind_host` only (the configured fabric interface). Gloo reports
// failures by exception; they become absl::Status here (UNAVAILABLE for a closed or failed
// connection, DEADLINE_EXCEEDED for a timeout), and the group stays broken after the first one.
//
// Thread safety: as ProcessGroup.
#ifndef TANDEM_COMM_GLOO_PROCESS_GROUP_H_
#define TANDEM_COMM_GLOO_PROCESS_GROUP_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "comm/process_group.h"
#include "comm/tcp_store.h"

namespace gloo::rendezvous {
class Context;
}

namespace tandem::comm {

struct GlooGroupOptions {
  int rank = 0;
  int world_size = 1;
  // The rendezvous: rank 0 serves the store on store_host:store_port (0: any free port, for
  // tests that hand the port to the other ranks themselves).
  std::string store_host = "127.0.0.1";
  int store_port = 0;
  // Whether rank 0 serves the store itself (a launcher or a test may run it instead).
  bool serve_store = true;
  // Address the rank's Gloo transport binds to (the fabric interface).
  std::string bind_host = "127.0.0.1";
  // Deadline of the rendezvous and of every collective.
  absl::Duration timeout = absl::Seconds(30);
  // Separates groups that share one store.
  std::string name = "tp";
};

class GlooProcessGroup final : public ProcessGroup {
 public:
  // Rank 0 starts the store server (unless `server` is given) and every rank connects to it;
  // then the full mesh of Gloo pairs is built. INVALID_ARGUMENT for a bad rank/size,
  // UNAVAILABLE / DEADLINE_EXCEEDED when the ranks do not all arrive in time.
  static absl::StatusOr<std::unique_ptr<GlooProcessGroup>> Create(const GlooGroupOptions& options);
  ~GlooProcessGroup() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status status() const override;
  // The store port rank 0 serves (its own, or the one it was told).
  int store_port() const { return store_port_; }

  absl::Status AllReduceSum(absl::Span<float> data) override;
  absl::Status AllGather(absl::Span<const float> in, absl::Span<float> out) override;
  absl::Status Broadcast(absl::Span<char> data, int root) override;
  absl::Status AllToAll(absl::Span<const float> in, absl::Span<const int64_t> send_counts,
                        absl::Span<float> out, absl::Span<const int64_t> recv_counts) override;
  absl::Status Barrier() override;
  absl::Status ReduceScatterSum(absl::Span<const float> in, absl::Span<float> out) override;
  absl::Status Send(absl::Span<const float> data, int peer) override;
  absl::Status Recv(absl::Span<float> data, int peer) override;
  // Over the rendezvous store: "<name>/meet/<phase>/<rank>" keys (the Gloo context is not used,
  // so a timeout here does not break the group).
  absl::Status MeetWithProgress(const std::string& phase, absl::Duration limit,
                                absl::Duration every, const ArrivalProgress& progress) override;

 private:
  GlooProcessGroup(int rank, int size, absl::Duration timeout)
      : rank_(rank), size_(size), timeout_(timeout), send_seq_(size), recv_seq_(size) {}
  // Runs `op` (which may throw gloo exceptions) unless the group is broken; records a failure.
  // A collective gets the next tag (equal on every rank); point-to-point calls do not take one.
  template <typename Op>
  absl::Status Run(const char* what, Op op, bool collective = true);

  const int rank_;
  const int size_;
  const absl::Duration timeout_;
  int store_port_ = 0;
  std::string name_;                        // GlooGroupOptions::name
  std::unique_ptr<TcpStoreServer> server_;  // rank 0
  std::unique_ptr<TcpStoreClient> client_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  uint32_t next_tag_ = 1;  // collectives are matched by order; tags keep them apart
  // Point-to-point sequence numbers per peer (their own slots: they do not advance next_tag_,
  // which must stay equal on every rank).
  std::vector<uint32_t> send_seq_, recv_seq_;
  mutable absl::Mutex mu_;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::comm

#endif  // TANDEM_COMM_GLOO_PROCESS_GROUP_H_
