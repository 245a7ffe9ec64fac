#include "tokenizer/stop_matcher.h"

#include <algorithm>
#include <utility>

namespace tandem::tokenizer {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (std::string& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

StopMatcher::Result StopMatcher::Add(absl::string_view text) {
  Result r;
  if (stopped_) return r;
  held_.append(text.data(), text.size());
  // The stop string that completes first (as a token-by-token check would see it, whatever the
  // chunking); among those completing at the same byte, the one starting first.
  size_t best = std::string::npos, best_end = std::string::npos;
  const std::string* which = nullptr;
  for (const std::string& s : stops_) {
    const size_t at = held_.find(s);
    if (at == std::string::npos) continue;
    const size_t end = at + s.size();
    if (end < best_end || (end == best_end && at < best)) {
      best = at;
      best_end = end;
      which = &s;
    }
  }
  if (which != nullptr) {
    r.emit = held_.substr(0, best);
    r.stopped = stopped_ = true;
    r.matched = *which;
    held_.clear();
    return r;
  }
  // Hold back the longest tail that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const std::string& s : stops_) {
    for (size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n) {
      if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
    }
  }
  r.emit = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return r;
}

std::string StopMatcher::Flush() {
  std::string out = std::move(held_);
  held_.clear();
  return stopped_ ? std::string() : out;
}

}  // namespace tandem::tokenizer
