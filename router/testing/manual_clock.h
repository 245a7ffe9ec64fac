// ManualClock: a clock tests advance by hand (WorkerRegistry takes a Clock). Test-only.
//
// Thread safety: thread-safe.
#ifndef TANDEM_ROUTER_TESTING_MANUAL_CLOCK_H_
#define TANDEM_ROUTER_TESTING_MANUAL_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tandem::router {

class ManualClock {
 public:
  absl::Time Now() const {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::FromUnixSeconds(1700000000);
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_TESTING_MANUAL_CLOCK_H_
