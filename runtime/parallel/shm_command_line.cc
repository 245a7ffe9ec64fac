#include "runtime/parallel/shm_command_line.h"

#include <linux/futex.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "runtime/parallel/plan_codec.h"

namespace tandem::runtime {
namespace {

// A follower spins this long on the sequence before it sleeps: a step's plan usually arrives
// while the previous step's collectives are still settling. Short, because ranks share cores.
constexpr absl::Duration kSpin = absl::Microseconds(20);
// Longest futex sleep: how often a sleeping follower checks its deadline and rank 0.
constexpr absl::Duration kMaxSleep = absl::Milliseconds(10);

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Not FUTEX_PRIVATE: the word is shared between processes.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout) {
  const timespec ts = absl::ToTimespec(timeout);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

bool ProcessGone(int32_t pid) { return pid > 0 && kill(pid, 0) != 0 && errno == ESRCH; }

// A follower that exited: rank 0 started it, so an exited one stays a zombie until reaped (its
// pid still answers kill(0)); waitid with WNOWAIT sees the exit without reaping it.
bool FollowerGone(int32_t pid) {
  if (pid <= 0) return false;
  siginfo_t info{};
  if (waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
      info.si_pid == pid) {
    return true;
  }
  return ProcessGone(pid);
}

}  // namespace

ShmCommandLine::ShmCommandLine(PlanSegment* segment, comm::ProcessGroup* group,
                               absl::Duration timeout)
    : slot_(segment->layout()), group_(group), timeout_(timeout) {
  if (group_->rank() > 0) {
    slot_->acks[group_->rank()].pid.store(getpid(), std::memory_order_relaxed);
    // A follower joining late starts after whatever rank 0 already published and acked.
    last_seq_ = slot_->acks[group_->rank()].seq.load(std::memory_order_acquire);
  } else {
    last_seq_ = slot_->seq.load(std::memory_order_acquire);
  }
}

absl::Status ShmCommandLine::status() const {
  {
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) return broken_;
  }
  return group_->status();
}

absl::Status ShmCommandLine::Fail(absl::Status s) {
  if (s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (broken_.ok()) broken_ = s;
  return broken_;
}

absl::Status ShmCommandLine::WaitForAcks(uint64_t seq) {
  const absl::Time deadline = absl::Now() + timeout_;
  for (int r = 1; r < group_->size(); ++r) {
    absl::Duration nap = absl::Microseconds(1);
    for (int spins = 0; slot_->acks[r].seq.load(std::memory_order_acquire) < seq; ++spins) {
      if (spins < 1000) {
        CpuRelax();
        continue;
      }
      RETURN_IF_ERROR(group_->status());
      if (const int32_t pid = slot_->acks[r].pid.load(std::memory_order_relaxed);
          FollowerGone(pid)) {
        return absl::UnavailableError(absl::StrCat("worker group: rank ", r, " (pid ", pid,
                                                   ") exited (shared-memory plan line)"));
      }
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("worker group: rank ", r, " did not take command ", seq, " within ",
                         absl::FormatDuration(timeout_), " (shared-memory plan line)"));
      }
      absl::SleepFor(nap);
      nap = std::min(nap * 2, absl::Milliseconds(1));
    }
  }
  return absl::OkStatus();
}

absl::Status ShmCommandLine::Send(const tandem::v1::RankCommand& command) {
  RETURN_IF_ERROR(status());
  std::string bytes;
  if (!command.SerializeToString(&bytes)) {
    return absl::InternalError("cannot serialize a rank command");
  }
  RETURN_IF_ERROR(Fail(WaitForAcks(last_seq_)));
  const bool via_group = bytes.size() > kPlanSlotBytes;
  slot_->via_group = via_group ? 1 : 0;
  slot_->length = via_group ? 0 : bytes.size();
  if (!via_group) std::memcpy(slot_->bytes, bytes.data(), bytes.size());
  ++last_seq_;
  slot_->seq.store(last_seq_, std::memory_order_seq_cst);
  slot_->wake.fetch_add(1, std::memory_order_seq_cst);
  // Seq-cst against the follower's waiters increment + seq re-check: either it sees the new
  // seq or we see it waiting.
  if (slot_->waiters.load(std::memory_order_seq_cst) > 0) FutexWakeAll(&slot_->wake);
  if (via_group) return Fail(BroadcastBytes(group_, &bytes));
  return absl::OkStatus();
}

absl::Status ShmCommandLine::WaitForSeq(uint64_t seq) {
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + timeout_;
  const absl::Time spin_until = start + kSpin;
  for (int spins = 0; slot_->seq.load(std::memory_order_acquire) < seq; ++spins) {
    if ((spins & 63) != 0 || absl::Now() < spin_until) {
      CpuRelax();
      continue;
    }
    const uint32_t wake = slot_->wake.load(std::memory_order_seq_cst);
    slot_->waiters.fetch_add(1, std::memory_order_seq_cst);
    if (slot_->seq.load(std::memory_order_seq_cst) < seq) {
      const absl::Duration left = deadline - absl::Now();
      if (left > absl::ZeroDuration()) FutexWait(&slot_->wake, wake, std::min(left, kMaxSleep));
    }
    slot_->waiters.fetch_sub(1, std::memory_order_seq_cst);
    if (slot_->seq.load(std::memory_order_acquire) >= seq) break;
    if (ProcessGone(slot_->leader_pid)) {
      return absl::UnavailableError("worker group: rank 0 exited (shared-memory plan line)");
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("worker group: no command from rank 0 within ",
                       absl::FormatDuration(timeout_), " (shared-memory plan line)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<tandem::v1::RankCommand> ShmCommandLine::Receive() {
  RETURN_IF_ERROR(status());
  const uint64_t seq = last_seq_ + 1;
  RETURN_IF_ERROR(Fail(WaitForSeq(seq)));
  const bool via_group = slot_->via_group != 0;
  const uint64_t length = slot_->length;
  if (length > kPlanSlotBytes) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("shared-memory plan line: command of ", length, " bytes in the slot")));
  }
  std::string bytes(slot_->bytes, via_group ? 0 : length);
  slot_->acks[group_->rank()].seq.store(seq, std::memory_order_release);
  last_seq_ = seq;
  if (via_group) RETURN_IF_ERROR(Fail(BroadcastBytes(group_, &bytes)));
  tandem::v1::RankCommand command;
  if (!command.ParseFromString(bytes)) {
    return Fail(absl::InvalidArgumentError("rank command does not parse"));
  }
  return command;
}

}  // namespace tandem::runtime
