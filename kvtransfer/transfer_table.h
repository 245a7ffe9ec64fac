// TransferTable: the transfer bookkeeping every TransferAgent shares, so the contract
// (transfer_agent.h) is kept in one place: ids are unique and increasing, a transfer ENDS exactly
// once with one result (later End calls are no-ops), and CheckTransfer reports that result
// exactly once (then the id is unknown: NOT_FOUND).
//
// T is the agent's own per-transfer state; it must have `TransferId id`, `bool ended` and
// `absl::Status result` members (the table owns them; agents read `ended`).
//
// Thread safety: none; the owning agent's mutex guards the table.
#ifndef TANDEM_KVTRANSFER_TRANSFER_TABLE_H_
#define TANDEM_KVTRANSFER_TRANSFER_TABLE_H_

#include <cstdint>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kvtransfer/transfer_agent.h"

namespace tandem::kvtransfer {

template <typename T>
class TransferTable {
 public:
  // Takes `t`, gives it the next id and returns it.
  T* Add(std::unique_ptr<T> t) {
    t->id = next_id_++;
    T* raw = t.get();
    transfers_[raw->id] = std::move(t);
    return raw;
  }
  // The transfer `id` (running, or ended and not yet reported); null otherwise.
  T* Find(TransferId id) const {
    auto it = transfers_.find(id);
    return it == transfers_.end() ? nullptr : it->second.get();
  }
  // Ends `t` with `result` unless it ended already (then nothing changes and this returns
  // false). Counts it in `stats`: `bytes` read and a completion on OK, a failure otherwise.
  bool End(T& t, absl::Status result, uint64_t bytes, TransferAgentStats* stats) {
    if (t.ended) return false;
    t.ended = true;
    if (result.ok()) {
      stats->bytes_read += bytes;
      ++stats->transfers_completed;
    } else {
      ++stats->transfers_failed;
    }
    t.result = std::move(result);
    return true;
  }
  // TransferAgent::CheckTransfer: false while running; once ended, OK (true) or its error,
  // reported once; NOT_FOUND for an unknown or already reported id.
  absl::StatusOr<bool> Check(TransferId id) {
    auto it = transfers_.find(id);
    if (it == transfers_.end()) {
      return absl::NotFoundError(absl::StrCat("unknown or already ended transfer ", id));
    }
    if (!it->second->ended) return false;
    absl::Status result = std::move(it->second->result);
    transfers_.erase(it);
    if (!result.ok()) return result;
    return true;
  }
  // Calls fn(T&) for every transfer not yet reported.
  template <typename Fn>
  void ForEach(Fn fn) {
    for (auto& [id, t] : transfers_) fn(*t);
  }
  size_t size() const { return transfers_.size(); }

 private:
  TransferId next_id_ = 1;
  absl::flat_hash_map<TransferId, std::unique_ptr<T>> transfers_;
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_TRANSFER_TABLE_H_
