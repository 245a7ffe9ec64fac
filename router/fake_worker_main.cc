// //router:fake_worker_main — a FakeWorker (fake_worker.h) as its own process, for multi-process
// tests and the load generator's smoke test. Not a model: tokens follow (31 * prev + 7) % vocab.
//
//   fake_worker_main --router=HOST:PORT --role=prefill|decode|mixed [--worker_id=ID]
//                    [--listen=127.0.0.1:0] [--vocab_size=1000] [--max_model_len=4096]
//                    [--block_size=16] [--token_delay_ms=0] [--prefill_delay_ms=0]
//                    [--eos_token_ids=] [--model_id=fake-model] [--epoch=1]
//                    (--tls_cert --tls_key --tls_ca | --insecure)
//
// Prints "fake worker ID (ROLE) listening on ADDR"; runs until SIGTERM/SIGINT.
#include <signal.h>

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/daemon.h"
#include "common/logging.h"
#include "common/security/flags.h"
#include "router/testing/fake_worker.h"

ABSL_FLAG(std::string, router, "", "router address to register with");
ABSL_FLAG(std::string, role, "mixed", "prefill, decode or mixed");
ABSL_FLAG(std::string, worker_id, "", "default: ROLE-PID");
ABSL_FLAG(std::string, listen, "127.0.0.1:0", "WorkerService address");
ABSL_FLAG(std::string, model_id, "fake-model", "model id (P and D pair only when equal)");
ABSL_FLAG(uint32_t, vocab_size, 1000, "vocabulary size");
ABSL_FLAG(uint32_t, max_model_len, 4096, "max prompt + output tokens");
ABSL_FLAG(uint32_t, block_size, 16, "KV block size in tokens");
ABSL_FLAG(uint64_t, epoch, 1, "worker epoch");
ABSL_FLAG(int64_t, token_delay_ms, 0, "delay before each decode token");
ABSL_FLAG(int64_t, prefill_delay_ms, 0, "delay of each prefill");
ABSL_FLAG(std::string, eos_token_ids, "", "eos token ids, comma separated");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::Status s = tandem::InitLogging(argv[0]); !s.ok()) {
    std::fprintf(stderr, "fake_worker: %s\n", s.ToString().c_str());
    return 1;
  }
  tandem::router::FakeWorkerOptions o;
  absl::StatusOr<tandem::security::SecurityConfig> security =
      tandem::security::DaemonSecurityFromFlags("fake_worker");
  if (!security.ok()) {
    std::fprintf(stderr, "fake_worker: %s\n", security.status().ToString().c_str());
    return 1;
  }
  o.security = *std::move(security);
  const std::string role = absl::GetFlag(FLAGS_role);
  if (role == "prefill") {
    o.role = tandem::v1::WORKER_ROLE_PREFILL;
  } else if (role == "decode") {
    o.role = tandem::v1::WORKER_ROLE_DECODE;
  } else if (role == "mixed") {
    o.role = tandem::v1::WORKER_ROLE_MIXED;
  } else {
    std::fprintf(stderr, "fake_worker: --role must be prefill, decode or mixed\n");
    return 1;
  }
  o.worker_id = absl::GetFlag(FLAGS_worker_id);
  if (o.worker_id.empty()) o.worker_id = role + "-" + std::to_string(getpid());
  o.router_address = absl::GetFlag(FLAGS_router);
  o.listen = absl::GetFlag(FLAGS_listen);
  o.model_id = absl::GetFlag(FLAGS_model_id);
  o.vocab_size = absl::GetFlag(FLAGS_vocab_size);
  o.max_model_len = absl::GetFlag(FLAGS_max_model_len);
  o.block_size = absl::GetFlag(FLAGS_block_size);
  o.epoch = absl::GetFlag(FLAGS_epoch);
  o.token_delay = absl::Milliseconds(absl::GetFlag(FLAGS_token_delay_ms));
  o.prefill_delay = absl::Milliseconds(absl::GetFlag(FLAGS_prefill_delay_ms));
  for (absl::string_view part :
       absl::StrSplit(absl::GetFlag(FLAGS_eos_token_ids), ',', absl::SkipWhitespace())) {
    uint32_t id = 0;
    if (!absl::SimpleAtoi(part, &id)) {
      std::fprintf(stderr, "fake_worker: bad --eos_token_ids entry '%s'\n",
                   std::string(part).c_str());
      return 1;
    }
    o.eos_token_ids.push_back(id);
  }

  tandem::TerminationSignals signals;
  tandem::IgnoreBrokenPipes();

  auto worker = tandem::router::FakeWorker::Start(o);
  if (!worker.ok()) {
    std::fprintf(stderr, "fake_worker: %s\n", worker.status().ToString().c_str());
    return 1;
  }
  std::printf("fake worker %s (%s) listening on %s\n", o.worker_id.c_str(), role.c_str(),
              (*worker)->address().c_str());
  std::fflush(stdout);
  signals.Wait();
  (*worker)->Kill();
  return 0;
}
