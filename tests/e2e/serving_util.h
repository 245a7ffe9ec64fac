// Helpers shared by the serving end-to-end tests: prompts, a streaming Generate through the
// router, the in-process engine reference, and clusters of the golden fixture or of the slow
// 100M-parameter dummy model.
#ifndef TANDEM_TESTS_E2E_SERVING_UTIL_H_
#define TANDEM_TESTS_E2E_SERVING_UTIL_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "tests/e2e/cluster.h"

namespace tandem::e2e {

// The golden fixture the serving tests run (transformers-checked).
inline constexpr char kModel[] = "tests/golden/fixtures/llama_f32_gqa";

struct Prompt {
  std::vector<uint32_t> ids;
  int max_tokens = 8;
};

struct Result {
  std::vector<uint32_t> tokens;
  tandem::v1::FinishReason finish = tandem::v1::FINISH_REASON_UNSPECIFIED;
  tandem::v1::Usage usage;
  grpc::Status status;
};

tandem::v1::GenerateRequest ToRequest(const Prompt& p);  // greedy, ignore_eos
// A 30-token prompt asking for `max_tokens` (a stream that runs long enough to be interrupted).
Prompt LongPrompt(int max_tokens = 1000);

Result Generate(tandem::v1::Router::Stub& router, const tandem::v1::GenerateRequest& request,
                absl::Duration timeout = absl::Seconds(60));

// Each prompt through `cluster`'s router, one after another: the stream ends OK (else a fatal
// failure with the cluster's logs, and no further prompt) with the tokens expected[i]. Callers
// wrap it in ASSERT_NO_FATAL_FAILURE to stop where the original assertion would have.
void ExpectServedTokens(Cluster& cluster, const std::vector<Prompt>& prompts,
                        const std::vector<std::vector<uint32_t>>& expected);

// Greedy reference: the engine in this process on kModel.
std::vector<std::vector<uint32_t>> Reference(const std::vector<Prompt>& prompts);

// One cluster of an FP8 KV run (--kv_cache_dtype=fp8 on every worker): its roles and flags.
struct Fp8KvRun {
  const char* name;
  int prefill, decode, mixed;
  std::vector<std::string> prefill_flags, decode_flags;
  std::string log_line{};  // the cluster's logs must hold it (empty: nothing asked)
  // K / V models: the ways decode-0's group splits the KV heads (its tensor-parallel size), so
  // its blocks hold 1 / kv_split of them. Ignored for MLA latents (every rank holds the whole).
  int kv_split = 1;
};

// Serves prompts 0, 1, 2, 3 and 5 of `model_dir`'s fixture (the golden prompts of 1, 3, 7, 16 and
// 33 tokens: 33 moves three blocks), 12 greedy tokens each, with FP8 KV on every worker, one
// cluster per run. The first run is the mixed worker: its tokens are the reference (FP8 is not
// transformers'). Every P -> D run's tokens must equal them, its D having received whole FP8
// blocks with no load failed or recomputed: layers x 16 tokens x (an MLA latent's codes + a
// 4-byte row scale, or K and V codes of decode-0's kv heads; the scales per tensor travel in the
// handshake).
void ExpectFp8KvRunsEqualTheMixedWorker(const std::string& model_dir,
                                        const std::vector<Fp8KvRun>& runs);

// The processes whose parent is `parent` (from /proc/PID/stat): a worker group's rank processes.
std::vector<pid_t> Children(pid_t parent);
bool Alive(pid_t pid);

// A decode group (prefill-0 -> decode-0 started with `decode_flags`, e.g. {"--tp=2"}) whose
// rank 1 is SIGKILLed mid-stream: the client gets UNAVAILABLE within 5 s, the prefill worker's
// leases go back to none (the group had released them after its load), and the group comes
// back (rank 0 restarts it in place: a new epoch, SERVING). Reports failures through gtest.
void KillDecodeRankMidStream(std::vector<std::string> decode_flags);

std::vector<Prompt> RandomPrompts(uint32_t seed, int n, int max_len = 80);

// kModel workers; null (and a test failure) when the cluster does not start.
std::unique_ptr<Cluster> StartCluster(int prefill, int decode, int mixed,
                                      std::vector<std::string> router_flags = {},
                                      std::vector<std::string> worker_flags = {});

// A cluster of the 100M-parameter random model (decodes at tens of tokens/s on these CPUs, so a
// long stream is surely still running while a test acts on it).
std::unique_ptr<Cluster> StartSlowCluster(int prefill, int decode, int mixed,
                                          std::vector<std::string> extra_flags = {});

}  // namespace tandem::e2e

#endif  // TANDEM_TESTS_E2E_SERVING_UTIL_H_
