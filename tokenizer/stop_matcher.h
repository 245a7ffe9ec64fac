// StopMatcher: OpenAI-style stop strings on a streamed text. Text arrives in chunks (the
// IncrementalDecoder's complete-UTF-8 pieces), a stop string may straddle chunks, and the output
// ends right before the stop string that completes first — the one a token-by-token check finds,
// so the result does not depend on the chunking (ties: the one starting first); it is not
// emitted. Add returns what is safe to send now: everything except a tail that could still begin
// a stop string.
//
// Thread safety: one stream's (not thread-safe).
#ifndef TANDEM_TOKENIZER_STOP_MATCHER_H_
#define TANDEM_TOKENIZER_STOP_MATCHER_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace tandem::tokenizer {

class StopMatcher {
 public:
  // Empty strings are ignored.
  explicit StopMatcher(std::vector<std::string> stops);

  struct Result {
    std::string emit;      // send this now
    bool stopped = false;  // a stop string was found: the stream ends after `emit`
    std::string matched;   // which one
  };
  // After a stop, further calls return nothing.
  Result Add(absl::string_view text);
  // The stream ended without a stop: what was held back.
  std::string Flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace tandem::tokenizer

#endif  // TANDEM_TOKENIZER_STOP_MATCHER_H_
