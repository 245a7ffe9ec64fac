#include "runtime/worker/step_trace.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tandem::runtime {

absl::StatusOr<std::unique_ptr<StepTraceWriter>> StepTraceWriter::Open(const std::string& path,
                                                                       int64_t max_lines) {
  if (max_lines < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("step trace: max_lines must be at least 1, got ", max_lines));
  }
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("step trace: cannot create '", path, "': ", std::strerror(errno)));
  }
  return std::unique_ptr<StepTraceWriter>(new StepTraceWriter(file, max_lines));
}

StepTraceWriter::~StepTraceWriter() { std::fclose(file_); }

void StepTraceWriter::Write(const StepRecord& r) {
  if (lines_ > max_lines_) return;
  ++lines_;
  if (lines_ > max_lines_) {
    std::fprintf(file_, "{\"truncated_after\":%lld}\n", static_cast<long long>(max_lines_));
    std::fflush(file_);
    return;
  }
  const StepShape& s = r.shape;
  std::fprintf(file_,
               "{\"step\":%lld,\"t_us\":%lld,\"step_us\":%lld,\"gap_us\":%lld,\"seqs\":%lld,"
               "\"decode\":%lld,\"prefill_tokens\":%lld,\"draft_tokens\":%lld,\"tokens\":%lld,"
               "\"running\":%lld,\"waiting\":%lld}\n",
               static_cast<long long>(r.step),
               static_cast<long long>(absl::ToInt64Microseconds(r.start - origin_)),
               static_cast<long long>(absl::ToInt64Microseconds(r.wall)),
               static_cast<long long>(absl::ToInt64Microseconds(r.gap)),
               static_cast<long long>(s.seqs), static_cast<long long>(s.decode_seqs),
               static_cast<long long>(s.prefill_tokens), static_cast<long long>(s.draft_tokens),
               static_cast<long long>(s.tokens), static_cast<long long>(r.running),
               static_cast<long long>(r.waiting));
  // Flushed every 256 lines (and at close): a reader of a live worker sees recent steps without
  // a write per step.
  if (lines_ % 256 == 0) std::fflush(file_);
}

std::vector<double> StepSecondsBuckets() {
  return {0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015,
          0.02,   0.03,  0.05,  0.075, 0.1,   0.25,  0.5,    1.0,  2.5};
}

std::vector<double> StepTokenBuckets() {
  return {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384};
}

void StepMetrics::Observe(const StepRecord& r) {
  const double seconds = absl::ToDoubleSeconds(r.wall);
  (r.shape.has_prefill() ? prefill_seconds_ : decode_seconds_).Observe(seconds);
  tokens_.Observe(static_cast<double>(r.shape.tokens));
}

StepMetrics::Snapshot StepMetrics::Take() const {
  return {decode_seconds_.Snapshot(), prefill_seconds_.Snapshot(), tokens_.Snapshot()};
}

}  // namespace tandem::runtime
