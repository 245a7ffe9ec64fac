// Plumbing every daemon (tandem_router, tandem_worker, the fake worker) shares: shutdown signals
// taken synchronously, and the port file a launcher polls for.
//
//   TerminationSignals signals;        // first thing in main, before any thread starts
//   ... start servers; WritePortFile(path, address) ...
//   int sig = signals.Wait();          // SIGTERM or SIGINT
//
// Thread safety: TerminationSignals is used by the thread that made it; WritePortFile is
// thread-safe for distinct paths.
#ifndef TANDEM_COMMON_DAEMON_H_
#define TANDEM_COMMON_DAEMON_H_

#include <csignal>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace tandem {

// Blocks SIGTERM and SIGINT in this thread and every thread started after it (gRPC's too), so
// Wait() receives them here instead of a handler running anywhere.
class TerminationSignals {
 public:
  TerminationSignals();
  // Returns the signal that arrived.
  int Wait();
  // Like Wait, for at most `timeout`: 0 when none arrived by then.
  int WaitFor(absl::Duration timeout);

 private:
  sigset_t set_;
};

// Makes every allocation of 1 MiB or more a mapping of its own, unmapped when freed. glibc's
// default raises that threshold to the largest block ever freed (up to 32 MiB), after which freed
// request bodies stay in the heap: a router that buffered 40 uploads kept their 300 MB after the
// clients left. Process-wide (malloc's settings are); call once, early in main.
void ReturnLargeFreedBlocksToTheSystem();

// Raises this process's soft limit on open file descriptors to its hard limit (what Go's runtime
// does at start) and returns the soft limit now in force. Every client connection is a
// descriptor: at the common default of 1,024 a flood of ~1,000 connections makes accept() fail
// with EMFILE, and the gRPC library (1.51) stops accepting on that port for good after one such
// failure. Process-wide; call once, early in main.
uint64_t RaiseOpenFileLimit();

// `configured` (at least 1), but at most a quarter of this process's soft limit on open file
// descriptors: one server's connections then cannot take every descriptor, which would fail
// every accept() and open() in the process. HttpServer and GrpcListener clamp their connection
// caps with it.
int WithinAQuarterOfTheOpenFileLimit(int configured);

// Ignores SIGPIPE process-wide (inherited by the processes it starts), so a write to a socket
// whose peer is gone fails with EPIPE instead of ending the process without a word. gRPC and
// asio send with MSG_NOSIGNAL, but Gloo's TCP pairs do not: a TP rank 0 resumed after SIGSTOP
// wrote to its dead rank 1 and died of SIGPIPE (the H5 fault probe) where it should restart its
// group. Call once, early in main.
void IgnoreBrokenPipes();

// Writes "address\n" to `path` via a temporary file and a rename, so a launcher polling for the
// file never reads half of it. UNAVAILABLE naming the file when it cannot.
absl::Status WritePortFile(const std::string& path, const std::string& address);

}  // namespace tandem

#endif  // TANDEM_COMMON_DAEMON_H_
