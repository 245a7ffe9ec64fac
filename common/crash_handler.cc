#include "common/crash_handler.h"

#include <signal.h>
#include <sys/mman.h>

#include <cstddef>

#include "absl/debugging/failure_signal_handler.h"
#include "absl/debugging/symbolize.h"

namespace tandem {
namespace {

// Room for absl's handler to symbolize and print a trace (it needs more than MINSIGSTKSZ).
constexpr size_t kAltStackBytes = 256 * 1024;

// A thread's alternate signal stack, unmapped when the thread exits.
class AltStack {
 public:
  AltStack() {
    stack_t current{};
    if (sigaltstack(nullptr, &current) == 0 && (current.ss_flags & SS_DISABLE) == 0) return;
    void* mem =
        mmap(nullptr, kAltStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) return;  // no alternate stack: a handler still runs on the thread's
    stack_t ss{};
    ss.ss_sp = mem;
    ss.ss_size = kAltStackBytes;
    if (sigaltstack(&ss, nullptr) != 0) {
      munmap(mem, kAltStackBytes);
      return;
    }
    mem_ = mem;
  }
  ~AltStack() {
    if (mem_ == nullptr) return;
    stack_t off{};
    off.ss_flags = SS_DISABLE;
    sigaltstack(&off, nullptr);
    munmap(mem_, kAltStackBytes);
  }
  AltStack(const AltStack&) = delete;
  AltStack& operator=(const AltStack&) = delete;

 private:
  void* mem_ = nullptr;
};

}  // namespace

void InstallCrashHandler(const char* argv0) {
  absl::InitializeSymbolizer(argv0 != nullptr ? argv0 : "");
  absl::FailureSignalHandlerOptions options;
  options.symbolize_stacktrace = true;
  options.use_alternate_stack =
      true;  // the calling thread's; other threads: UseAlternateSignalStack
  absl::InstallFailureSignalHandler(options);
}

void UseAlternateSignalStack() { static thread_local AltStack stack; }

}  // namespace tandem
