// tokenizer_bench: encode and decode throughput (MB of text per second, one thread) of a
// tokenizer.json (or a SentencePiece tokenizer.model) on a text file, the counterpart of
// bench_hf.py (Hugging Face `tokenizers` on the same file; compare_bench.sh runs both).
//
//   bazel run -c opt //tokenizer:tokenizer_bench -- --tokenizer=DIR/tokenizer.json --text=FILE
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "tokenizer/sentencepiece_tokenizer.h"
#include "tokenizer/tokenizer.h"

ABSL_FLAG(std::string, tokenizer, "", "tokenizer.json, or a SentencePiece *.model");
ABSL_FLAG(std::string, text, "", "UTF-8 text file; encoded line by line (batches of lines)");
ABSL_FLAG(int, repeat, 3, "passes over the file (the best is reported)");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string path = absl::GetFlag(FLAGS_tokenizer);
  absl::StatusOr<std::unique_ptr<tandem::tokenizer::TextTokenizer>> tok;
  if (absl::EndsWith(path, ".model")) {
    tok = tandem::tokenizer::SentencePieceTokenizer::FromFile(path);
  } else {
    tok = tandem::tokenizer::Tokenizer::FromFile(path);
  }
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", tok.status().ToString().c_str());
    return 1;
  }
  std::ifstream in(absl::GetFlag(FLAGS_text), std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  const std::vector<std::string> lines = absl::StrSplit(text, '\n');
  double best_encode = 0, best_decode = 0;
  size_t tokens = 0;
  for (int pass = 0; pass < absl::GetFlag(FLAGS_repeat); ++pass) {
    std::vector<std::vector<int32_t>> ids;
    ids.reserve(lines.size());
    absl::Time start = absl::Now();
    for (const std::string& line : lines) {
      auto encoded = (*tok)->Encode(line, false);
      if (!encoded.ok()) {
        std::fprintf(stderr, "%s\n", encoded.status().ToString().c_str());
        return 1;
      }
      ids.push_back(*std::move(encoded));
    }
    const double encode_s = absl::ToDoubleSeconds(absl::Now() - start);
    tokens = 0;
    for (const auto& v : ids) tokens += v.size();
    start = absl::Now();
    size_t decoded_bytes = 0;
    for (const auto& v : ids) decoded_bytes += (*tok)->Decode(v, false)->size();
    const double decode_s = absl::ToDoubleSeconds(absl::Now() - start);
    best_encode = std::max(best_encode, text.size() / encode_s / 1e6);
    best_decode = std::max(best_decode, decoded_bytes / decode_s / 1e6);
  }
  std::printf("tandem   %zu bytes, %zu lines, %zu tokens: encode %.2f MB/s, decode %.2f MB/s\n",
              text.size(), lines.size(), tokens, best_encode, best_decode);
  return 0;
}
