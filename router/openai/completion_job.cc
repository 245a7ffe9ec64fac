#include "router/openai/completion_job.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "router/openai/http_api.h"
#include "tokenizer/stop_matcher.h"

namespace tandem::router::openai {
namespace {

using Json = nlohmann::json;

std::string NewId(const char* prefix) {
  std::random_device rd;
  return absl::StrFormat("%s-%08x%08x", prefix, rd(), rd());
}

std::string JsonText(const Json& body) {
  return body.dump(-1, ' ', false, Json::error_handler_t::replace);
}

http::Response StatusResponse(const absl::Status& s) {
  return http::ErrorResponse(HttpStatusFor(s), std::string(s.message()));
}

std::string Sse(const Json& body) { return absl::StrCat("data: ", JsonText(body), "\n\n"); }

std::string FinishReasonText(v1::FinishReason r) {
  switch (r) {
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_EOS:
    case v1::FINISH_REASON_STOP_TOKEN:
      return "stop";
    case v1::FINISH_REASON_ABORTED:
      return "abort";
    default:
      return "";
  }
}

v1::GenerateRequest ChoiceRequest(const CompletionParams& params, const ServedModel& model,
                                  const std::vector<uint32_t>& prompt, int k) {
  v1::GenerateRequest request;
  for (uint32_t t : prompt) request.add_prompt_token_ids(t);
  v1::SamplingParams* s = request.mutable_sampling();
  s->set_max_tokens(params.max_tokens);
  s->set_temperature(params.temperature);
  s->set_top_p(params.top_p);
  s->set_top_k(params.top_k);
  if (params.seed.has_value()) s->set_seed(*params.seed + k);
  for (uint32_t t : params.stop_token_ids) s->add_stop_token_ids(t);
  s->set_ignore_eos(params.ignore_eos);
  // Only ids the tokenizer can decode are sampled: the model's embedding may be padded past it
  // (Qwen2.5: 151,936 rows, 151,665 tokens) and the workers mask those logits.
  s->set_vocab_limit(static_cast<uint32_t>(model.tokenizer->vocab_size()));
  request.set_cache_salt(params.user);
  return request;
}

// One choice: the orchestrator's chunks -> text (complete UTF-8, stop strings applied), streamed
// as SSE chunks or kept for the whole response. Also the orchestrator's view of the client.
// Called where the Orchestrator runs the choice's steps, one call at a time.
class ChoiceRun final : public ResponseSink, public CallerContext {
 public:
  using Ended = absl::AnyInvocable<void(ChoiceResult) &&>;
  ChoiceRun(const ServedModel& model, std::shared_ptr<const CompletionParams> params, int index,
            std::shared_ptr<http::ResponseStream> stream, std::string id, int64_t created,
            Ended ended)
      : params_(std::move(params)),
        stream_(std::move(stream)),
        id_(std::move(id)),
        created_(created),
        decoder_(*model.tokenizer, params_->skip_special_tokens),
        matcher_(params_->stop),
        ended_(std::move(ended)) {
    choice_.index = index;
  }

  bool Send(const v1::GenerateResponse& chunk) override {
    std::string delta;
    for (uint32_t token : chunk.token_ids()) {
      ++completion_tokens_;
      absl::StatusOr<std::string> text = decoder_.Add(static_cast<int32_t>(token));
      if (!text.ok()) {
        // The worker produced it, not the client: a server fault (500 server_error), never the
        // client's 400. Workers sample below the request's vocab_limit, so this is a worker that
        // ignored it (or an id in a gap of the tokenizer's ids).
        error_ = absl::InternalError(
            absl::StrCat("the model generated token id ", token,
                         ", which the tokenizer cannot decode: ", text.status().message()));
        return false;
      }
      tokenizer::StopMatcher::Result r = matcher_.Add(*text);
      delta += r.emit;
      if (r.stopped) {
        stopped_by_string_ = true;
        choice_.finish_reason = "stop";
        break;
      }
    }
    if (chunk.has_usage()) cached_tokens_ = chunk.usage().cached_prompt_tokens();
    if (!stopped_by_string_ && chunk.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      delta += matcher_.Add(decoder_.Flush()).emit;
      if (!matcher_.stopped()) delta += matcher_.Flush();
      choice_.finish_reason = matcher_.stopped() ? "stop" : FinishReasonText(chunk.finish_reason());
    }
    Emit(delta);
    if (stopped_by_string_) return false;  // ends the request on the workers
    return !Cancelled();
  }

  void Finish(const absl::Status& status) override {
    ChoiceResult result;
    // The run's own outcome folded into the orchestrator's status.
    result.status = !error_.ok() ? error_ : stopped_by_string_ ? absl::OkStatus() : status;
    if (!Cancelled()) {
      // Ends the choice in a stream (its finish chunk).
      if (stream_ != nullptr && !choice_.finish_reason.empty()) {
        Choice done{choice_.index, "", choice_.finish_reason};
        stream_->Write(Sse(ChunkBody(params_->chat, id_, created_, params_->model, done, !sent_)));
      }
      result.choice = choice_;
      result.completion_tokens = completion_tokens_;
      result.cached_tokens = cached_tokens_;
    }
    Ended ended = std::move(ended_);
    std::move(ended)(std::move(result));
  }

  bool Cancelled() const override { return stream_ != nullptr && stream_->cancelled(); }
  absl::Time deadline() const override { return absl::InfiniteFuture(); }

 private:
  void Emit(const std::string& delta) {
    if (stream_ == nullptr) {
      choice_.text += delta;
      return;
    }
    if (delta.empty() && sent_) return;
    Choice part{choice_.index, delta, ""};
    stream_->Write(Sse(ChunkBody(params_->chat, id_, created_, params_->model, part, !sent_)));
    sent_ = true;
  }

  const std::shared_ptr<const CompletionParams> params_;
  const std::shared_ptr<http::ResponseStream> stream_;
  const std::string id_;
  const int64_t created_;
  tokenizer::IncrementalDecoder decoder_;
  tokenizer::StopMatcher matcher_;
  Ended ended_;
  Choice choice_;
  bool sent_ = false, stopped_by_string_ = false;
  uint64_t completion_tokens_ = 0, cached_tokens_ = 0;
  absl::Status error_;
};

}  // namespace

CompletionJob::CompletionJob(Services services, CompletionParams params,
                             std::shared_ptr<http::Responder> responder,
                             absl::AnyInvocable<void() &&> on_end)
    : services_(services),
      params_(std::make_shared<const CompletionParams>(std::move(params))),
      responder_(std::move(responder)),
      on_end_(std::move(on_end)) {}

void CompletionJob::Refuse(const absl::Status& status) {
  responder_->Reply(StatusResponse(status));
}

void CompletionJob::Start() {
  id_ = NewId(params_->chat ? "chatcmpl" : "cmpl");
  created_ = absl::ToUnixSeconds(absl::Now());
  // A client that leaves, streamed or not, cancels its choices on P and D.
  auto cancel = [weak = weak_from_this()] {
    if (std::shared_ptr<CompletionJob> self = weak.lock()) self->CancelAll();
  };
  if (params_->stream) {
    stream_ = responder_->StartStream(200, "text/event-stream");
    stream_->OnCancel(std::move(cancel));
  } else {
    responder_->OnCancel(std::move(cancel));
  }
  // Every choice (prompts x n, bounded by ParseCompletion) runs at once.
  for (const std::vector<uint32_t>& prompt : params_->prompts) {
    for (int k = 0; k < params_->n; ++k) work_.emplace_back(&prompt, k);
  }
  {
    absl::MutexLock lock(&mu_);
    results_.resize(work_.size());
    remaining_ = work_.size();
  }
  for (size_t i = 0; i < work_.size(); ++i) StartChoice(i);
}

void CompletionJob::StartChoice(size_t i) {
  v1::GenerateRequest request =
      ChoiceRequest(*params_, *services_.model, *work_[i].first, work_[i].second);
  absl::StatusOr<Admission> admission = services_.requests->Admit("");
  if (!admission.ok()) {
    ChoiceResult refused;
    refused.status = admission.status();
    ChoiceEnded(i, std::move(refused));
    return;
  }
  request.set_request_id(admission->request().id());
  {
    absl::MutexLock lock(&mu_);
    requests_.push_back(admission->shared_request());
    if (client_gone_) admission->request().Cancel(absl::CancelledError("the client went away"));
  }
  auto run =
      std::make_shared<ChoiceRun>(*services_.model, params_, static_cast<int>(i), stream_, id_,
                                  created_, [self = shared_from_this(), i](ChoiceResult result) {
                                    self->ChoiceEnded(i, std::move(result));
                                  });
  ChoiceRun* client = run.get();
  services_.orchestrator->Start(std::move(request), *std::move(admission), client, std::move(run));
}

void CompletionJob::ChoiceEnded(size_t i, ChoiceResult result) {
  {
    absl::MutexLock lock(&mu_);
    results_[i] = std::move(result);
    if (--remaining_ > 0) return;
  }
  Complete();
}

void CompletionJob::CancelAll() {
  std::vector<std::shared_ptr<InFlightRequest>> requests;
  {
    absl::MutexLock lock(&mu_);
    client_gone_ = true;
    requests = requests_;
  }
  for (const auto& request : requests) {
    request->Cancel(absl::CancelledError("the client went away"));
  }
}

void CompletionJob::Complete() {
  std::vector<ChoiceResult> results;
  {
    absl::MutexLock lock(&mu_);
    results = std::move(results_);
  }
  absl::AnyInvocable<void()&&> on_end = std::move(on_end_);
  if (stream_ != nullptr && stream_->cancelled()) {  // the client left; nothing to say
    std::move(on_end)();
    return;
  }
  std::vector<Choice> choices;
  UsageCounts usage;
  absl::Status failure;
  for (size_t i = 0; i < work_.size(); ++i) {
    if (failure.ok()) failure = results[i].status;
    usage.prompt_tokens += work_[i].first->size();
    usage.completion_tokens += results[i].completion_tokens;
    usage.cached_tokens += results[i].cached_tokens;
    choices.push_back(results[i].choice);
  }
  if (stream_ == nullptr) {
    http::Response response;
    if (failure.ok()) {
      response.body =
          JsonText(CompletionBody(params_->chat, id_, created_, params_->model, choices, usage));
    } else {
      response = StatusResponse(failure);
    }
    responder_->Reply(std::move(response));
  } else {
    if (!failure.ok()) {
      stream_->Write(Sse(Json::parse(StatusResponse(failure).body)));
    } else if (params_->include_usage) {
      stream_->Write(Sse(UsageChunkBody(params_->chat, id_, created_, params_->model, usage)));
    }
    stream_->Write("data: [DONE]\n\n");
    stream_->Close();
  }
  std::move(on_end)();
}

}  // namespace tandem::router::openai
