// SentencePieceLibrary: libtandem_spm.so (sentencepiece_capi.h) loaded with
// dlmopen(LM_ID_NEWLM), in a link namespace of its own. Debian's libsentencepiece exports the
// protobuf-lite it bundles; loaded next to the system libprotobuf (any process with gRPC, such as
// tandem_router) the two interpose and crash. In its own namespace the library brings its own
// libstdc++, libc state and protobuf-lite, and this process reaches it only through the C
// function pointers below.
//
// Where the library is looked for, first found wins:
//   1. $TANDEM_SPM_LIBRARY (a path; nothing else is tried when it is set),
//   2. Bazel runfiles: $RUNFILES_DIR, $TEST_SRCDIR, or <binary>.runfiles, each
//      + /tandem/tokenizer/libtandem_spm.so (a target depending on //tokenizer gets it there),
//   3. next to the binary (/proc/self/exe's directory), then <that directory>/../lib (the
//      bin/ + lib/ layout of the container image), then each $LD_LIBRARY_PATH directory
//      (tests/gpu/bundle.sh puts it in the bundle's lib/ with libsentencepiece).
//
// Thread safety: Default() may be called from any thread; the functions are thread-safe as
// sentencepiece_capi.h says. The library stays loaded for the life of the process.
#ifndef TANDEM_TOKENIZER_SENTENCEPIECE_LIBRARY_H_
#define TANDEM_TOKENIZER_SENTENCEPIECE_LIBRARY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tokenizer/sentencepiece_capi.h"

namespace tandem::tokenizer {

struct SentencePieceLibrary {
  // The process-wide instance, loaded on first use from the first path that exists (above).
  // NOT_FOUND listing every path tried when none exists; FAILED_PRECONDITION naming the path
  // with the dynamic loader's message when it does not load (e.g. libsentencepiece.so.0 is
  // missing) or is of another ABI version. A failure is not remembered: the next call retries.
  static absl::StatusOr<const SentencePieceLibrary*> Default();
  // Loads `path` into a new link namespace (each call takes one of the few glibc has: use
  // Default() outside tests).
  static absl::StatusOr<const SentencePieceLibrary*> Load(const std::string& path);
  // The paths Default() tries, in order.
  static std::vector<std::string> CandidatePaths();

  std::string path;
  decltype(&tandem_spm_load) load = nullptr;
  decltype(&tandem_spm_unload) unload = nullptr;
  decltype(&tandem_spm_piece_size) piece_size = nullptr;
  decltype(&tandem_spm_bos_id) bos_id = nullptr;
  decltype(&tandem_spm_unk_id) unk_id = nullptr;
  decltype(&tandem_spm_id_to_piece) id_to_piece = nullptr;
  decltype(&tandem_spm_piece_type) piece_type = nullptr;
  decltype(&tandem_spm_encode) encode = nullptr;
  decltype(&tandem_spm_decode) decode = nullptr;
  decltype(&tandem_spm_free) free = nullptr;

  // Moves an error string the library allocated into a std::string (and releases it).
  std::string TakeError(char* error) const;
};

}  // namespace tandem::tokenizer

#endif  // TANDEM_TOKENIZER_SENTENCEPIECE_LIBRARY_H_
