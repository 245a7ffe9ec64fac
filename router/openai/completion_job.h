// CompletionJob: one `/v1/completions` or `/v1/chat/completions` request of the HTTP API
// (http_api.h) while it runs. Every choice (prompts x n) is its own router request, all started
// at once through the asynchronous Orchestrator; each choice's chunks come back on the threads
// that run its steps, go through an IncrementalDecoder (complete UTF-8 only) and a
// StopMatcher (stop strings across tokens: the text is cut before them and the choice ends,
// which aborts it on its workers), and are written as SSE chunks (interleaved, told apart by
// index) or kept for the whole response. When the last choice ended the job answers (usage and
// `[DONE]`, or the JSON body; an error after the stream started is an SSE error event) and runs
// its `on_end`. No thread waits for a choice.
//
// A streaming client that disconnects cancels every choice (its requests end on P and D).
//
// Thread safety: Start or Refuse once, from any thread; the rest runs where the Orchestrator runs
// the choices' steps, and on the HTTP server's threads (disconnects).
#ifndef TANDEM_ROUTER_OPENAI_COMPLETION_JOB_H_
#define TANDEM_ROUTER_OPENAI_COMPLETION_JOB_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/http/http_server.h"
#include "router/core/orchestrator.h"
#include "router/core/request_table.h"
#include "router/openai/protocol.h"

namespace tandem::router::openai {

// What one choice ended with.
struct ChoiceResult {
  absl::Status status;
  Choice choice;
  uint64_t completion_tokens = 0, cached_tokens = 0;
};

class CompletionJob final : public std::enable_shared_from_this<CompletionJob> {
 public:
  // What the job runs on; all outlive it.
  struct Services {
    const ServedModel* model = nullptr;
    RequestTable* requests = nullptr;
    Orchestrator* orchestrator = nullptr;
  };
  CompletionJob(Services services, CompletionParams params,
                std::shared_ptr<http::Responder> responder, absl::AnyInvocable<void() &&> on_end);

  // Starts every choice and returns at once; `on_end` runs once the response is complete.
  void Start();
  // Answers `status` without running anything (`on_end` does not run).
  void Refuse(const absl::Status& status);

 private:
  // Admits choice `i` as a router request and starts it on the orchestrator.
  void StartChoice(size_t i);
  void ChoiceEnded(size_t i, ChoiceResult result);
  // Every choice ended: the response's end.
  void Complete();
  // The streaming client left: every choice's request is cancelled.
  void CancelAll();

  const Services services_;
  const std::shared_ptr<const CompletionParams> params_;
  const std::shared_ptr<http::Responder> responder_;
  absl::AnyInvocable<void() &&> on_end_;
  std::string id_;
  int64_t created_ = 0;
  std::shared_ptr<http::ResponseStream> stream_;  // null: one JSON response
  // (prompt, k): choice i's prompt and its index among that prompt's n.
  std::vector<std::pair<const std::vector<uint32_t>*, int>> work_;
  absl::Mutex mu_;
  std::vector<ChoiceResult> results_ ABSL_GUARDED_BY(mu_);
  size_t remaining_ ABSL_GUARDED_BY(mu_) = 0;
  bool client_gone_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::shared_ptr<InFlightRequest>> requests_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::router::openai

#endif  // TANDEM_ROUTER_OPENAI_COMPLETION_JOB_H_
