// NoCollectivesGroup: a ProcessGroup that knows its rank and size and refuses every collective
// (UNIMPLEMENTED), for tests of code that reads a group's shape without communicating (a factory
// built for a rank, a command line that needs the group only for large commands).
//
// Thread safety: immutable; every method is thread-safe.
#ifndef TANDEM_COMM_NO_COLLECTIVES_GROUP_H_
#define TANDEM_COMM_NO_COLLECTIVES_GROUP_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "comm/process_group.h"

namespace tandem::comm {

class NoCollectivesGroup final : public ProcessGroup {
 public:
  NoCollectivesGroup(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status status() const override { return absl::OkStatus(); }
  absl::Status AllReduceSum(absl::Span<float>) override { return Refuse(); }
  absl::Status AllGather(absl::Span<const float>, absl::Span<float>) override { return Refuse(); }
  absl::Status ReduceScatterSum(absl::Span<const float>, absl::Span<float>) override {
    return Refuse();
  }
  absl::Status Broadcast(absl::Span<char>, int) override { return Refuse(); }
  absl::Status AllToAll(absl::Span<const float>, absl::Span<const int64_t>, absl::Span<float>,
                        absl::Span<const int64_t>) override {
    return Refuse();
  }
  absl::Status Barrier() override { return Refuse(); }
  absl::Status Send(absl::Span<const float>, int) override { return Refuse(); }
  absl::Status Recv(absl::Span<float>, int) override { return Refuse(); }

 private:
  static absl::Status Refuse() { return absl::UnimplementedError("no collectives here"); }
  const int rank_;
  const int size_;
};

}  // namespace tandem::comm

#endif  // TANDEM_COMM_NO_COLLECTIVES_GROUP_H_
