// PeerProcess: runs the agent_peer harness (agent_peer_main.cc) as a child process for
// two-process tests and the benchmark, and reads the TransferHandshake it prints.
//
// Wire format on the child's stdout: le64(byte length) || TransferHandshake (protobuf), once,
// after the child registered its memory; Send() uses the same framing towards the child. The
// child lives until its stdin reaches EOF (Stop()) or it is killed (Kill(): SIGKILL, the
// "kill -9" of a crashed worker).
//
// Thread safety: none (one owner).
#ifndef TANDEM_KVTRANSFER_PEER_PROCESS_H_
#define TANDEM_KVTRANSFER_PEER_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tandem/v1/kv.pb.h"

namespace tandem::kvtransfer {

class PeerProcess {
 public:
  // fork+exec of `binary` with `args`; waits up to `timeout` for the descriptor.
  static absl::StatusOr<std::unique_ptr<PeerProcess>> Start(
      const std::string& binary, const std::vector<std::string>& args,
      absl::Duration timeout = absl::Seconds(20));
  ~PeerProcess();  // Stop()
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;

  const tandem::v1::TransferHandshake& descriptor() const { return descriptor_; }
  pid_t pid() const { return pid_; }

  // Writes le64(size) || bytes to the child's stdin (agent_peer --mode=reader reads the
  // source's TransferHandshake this way).
  absl::Status Send(const std::string& bytes);

  // Whether the child has not exited yet (reaps it if it has).
  bool Running();

  // SIGKILL and reap. Idempotent.
  void Kill();
  // Closes the child's stdin and waits up to 5 s for it to exit (then SIGKILL). Returns its
  // exit status as from waitpid, or -1 when it had to be killed / was already reaped.
  int Stop();

 private:
  PeerProcess() = default;
  pid_t pid_ = -1;
  int stdin_fd_ = -1;   // write end of the child's stdin
  int stdout_fd_ = -1;  // read end of the child's stdout
  tandem::v1::TransferHandshake descriptor_;
};

// Path of a binary built in this package next to the running one: $TEST_SRCDIR runfiles in
// tests, else the directory of /proc/self/exe.
std::string SiblingBinary(const std::string& name);

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_PEER_PROCESS_H_
