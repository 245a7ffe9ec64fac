#include "runtime/parallel/group_channel.h"

#include <utility>

#include "common/status_macros.h"
#include "glog/logging.h"
#include "runtime/parallel/plan_codec.h"

namespace tandem::runtime {

GroupChannel::GroupChannel(comm::ProcessGroup* group, absl::Duration keepalive,
                           std::unique_ptr<CommandLine> line)
    : group_(group),
      line_(line != nullptr ? std::move(line) : GlooCommandLine(group)),
      keepalive_(keepalive) {
  {
    absl::MutexLock lock(&mu_);
    last_command_ = absl::Now();
  }
  keepalive_thread_ = std::thread([this] { KeepaliveLoop(); });
}

GroupChannel::~GroupChannel() {
  Shutdown();
  keepalive_thread_.join();
}

void GroupChannel::Shutdown() {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  shut_down_ = true;
  if (line_->status().ok()) {
    tandem::v1::RankCommand shutdown;
    shutdown.set_shutdown(true);
    absl::Status s = line_->Send(shutdown);
    if (!s.ok()) LOG(WARNING) << "worker group: shutdown not delivered: " << s;
  }
}

absl::Status GroupChannel::CheckOpenLocked() const {
  if (shut_down_) return absl::UnavailableError("worker group: shut down");
  return absl::OkStatus();
}

void GroupChannel::KeepaliveLoop() {
  absl::MutexLock lock(&mu_);
  while (!shut_down_) {
    const absl::Time due = last_command_ + keepalive_;
    auto stopped = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return shut_down_; };
    if (mu_.AwaitWithDeadline(absl::Condition(&stopped), due)) break;
    if (absl::Now() < last_command_ + keepalive_) continue;  // a command went out meanwhile
    if (!line_->status().ok()) break;                        // broken: nothing more to prove
    tandem::v1::RankCommand keepalive;
    keepalive.set_keepalive(true);
    absl::Status s = line_->Send(keepalive);
    last_command_ = absl::Now();
    if (!s.ok()) {
      LOG(ERROR) << "worker group: keepalive failed, the group is unusable: " << s;
      break;
    }
  }
}

absl::Status GroupChannel::Run(const tandem::v1::RankCommand& command,
                               const std::function<absl::Status()>& local) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckOpenLocked());
  last_command_ = absl::Now();
  RETURN_IF_ERROR(line_->Send(command));
  absl::Status s = local();
  last_command_ = absl::Now();
  return s;
}

absl::StatusOr<std::vector<std::string>> GroupChannel::Call(
    const tandem::v1::RankCommand& command, const std::function<std::string()>& local) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckOpenLocked());
  last_command_ = absl::Now();
  RETURN_IF_ERROR(line_->Send(command));
  absl::StatusOr<std::vector<std::string>> replies = GatherBytes(group_, local());
  last_command_ = absl::Now();
  return replies;
}

absl::Status GroupChannel::RunWithGroup(
    const tandem::v1::RankCommand& command,
    const std::function<absl::Status(comm::ProcessGroup*)>& fn) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckOpenLocked());
  last_command_ = absl::Now();
  RETURN_IF_ERROR(line_->Send(command));
  absl::Status s = fn(group_);
  last_command_ = absl::Now();
  return s;
}

absl::Status GroupChannel::WithGroup(const std::function<absl::Status(comm::ProcessGroup*)>& fn) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckOpenLocked());
  last_command_ = absl::Now();
  absl::Status s = fn(group_);
  last_command_ = absl::Now();
  return s;
}

}  // namespace tandem::runtime
