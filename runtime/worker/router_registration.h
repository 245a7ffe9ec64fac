// RouterRegistration: keeps a worker registered with the router (proto WorkerRegistry).
//
// A background thread registers (retrying every retry_interval until the router answers), then
// heartbeats every interval the router asked for, with the serving status, the load, and the
// prefix-cache hashes added / evicted since the last heartbeat (so the router's approximate
// prefix index follows the worker's cache). `known=false` (the router restarted or dropped us)
// triggers a new registration, which starts the index over with the full current set.
//
// Thread safety: Start/Stop from one thread; callbacks are called from the background thread.
#ifndef TANDEM_RUNTIME_WORKER_ROUTER_REGISTRATION_H_
#define TANDEM_RUNTIME_WORKER_ROUTER_REGISTRATION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/security/security_config.h"
#include "tandem/v1/router.grpc.pb.h"

namespace tandem::runtime {

struct RegistrationCallbacks {
  std::function<tandem::v1::WorkerInfo()> info;
  std::function<tandem::v1::ServingStatus()> status;
  std::function<tandem::v1::WorkerLoad()> load;
  // Prefix-cache events since the last call (short hashes).
  std::function<void(std::vector<uint64_t>* added, std::vector<uint64_t>* removed)> cache_events;
  // Every hash currently cached: sent after each (re-)registration.
  std::function<std::vector<uint64_t>()> all_cached_hashes;
};

class RouterRegistration {
 public:
  // `security`: the worker's TLS identity for the channel to the router.
  RouterRegistration(std::string router_address, const security::SecurityConfig& security,
                     RegistrationCallbacks callbacks,
                     absl::Duration retry_interval = absl::Milliseconds(500));
  ~RouterRegistration();  // Stop()
  void Start();
  // Heartbeats now instead of at the next interval (e.g. to announce DRAINING); no-op before
  // the first registration.
  void HeartbeatNow();
  // Sends a last heartbeat with the current status (e.g. DRAINING) and stops the thread.
  void Stop();
  bool registered() const;

 private:
  void Run();
  bool Register();
  bool Heartbeat(bool* known);
  // Waits up to `timeout` for HeartbeatNow / Stop.
  void WaitForNextBeat(absl::Duration timeout);

  const std::string router_address_;
  const RegistrationCallbacks callbacks_;
  const absl::Duration retry_interval_;
  std::unique_ptr<tandem::v1::WorkerRegistry::Stub> stub_;
  absl::Notification stop_;
  std::thread thread_;
  mutable absl::Mutex mu_;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;                // HeartbeatNow or Stop was called
  absl::Duration heartbeat_interval_ = absl::Seconds(1);  // background thread only
  std::string last_refusal_;  // background thread only: the last refusal logged
  // Hashes not yet acknowledged by a heartbeat (kept across failed heartbeats).
  std::vector<uint64_t> pending_added_, pending_removed_;  // background thread only
};

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_WORKER_ROUTER_REGISTRATION_H_
