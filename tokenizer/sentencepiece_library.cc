#include "tokenizer/sentencepiece_library.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"

namespace tandem::tokenizer {
namespace {

constexpr char kLibraryName[] = "libtandem_spm.so";
constexpr char kRunfilesPath[] = "/tandem/tokenizer/libtandem_spm.so";  // workspace "tandem"
constexpr char kPathVariable[] = "TANDEM_SPM_LIBRARY";

std::string SelfExe() {
  std::error_code error;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", error);
  return error ? std::string() : exe.string();
}

template <typename F>
absl::Status Resolve(void* handle, const std::string& path, const char* name, F* out) {
  void* symbol = dlsym(handle, name);
  if (symbol == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " does not export ", name, " (not a libtandem_spm.so?)"));
  }
  *out = reinterpret_cast<F>(symbol);
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> SentencePieceLibrary::CandidatePaths() {
  if (const char* set = std::getenv(kPathVariable); set != nullptr && *set != '\0') return {set};
  std::vector<std::string> paths;
  for (const char* variable : {"RUNFILES_DIR", "TEST_SRCDIR"}) {
    const char* dir = std::getenv(variable);
    if (dir != nullptr && *dir != '\0') paths.push_back(absl::StrCat(dir, kRunfilesPath));
  }
  const std::string exe = SelfExe();
  if (!exe.empty()) {
    paths.push_back(absl::StrCat(exe, ".runfiles", kRunfilesPath));
    const std::filesystem::path dir = std::filesystem::path(exe).parent_path();
    paths.push_back((dir / kLibraryName).string());
    paths.push_back((dir.parent_path() / "lib" / kLibraryName).string());
  }
  if (const char* dirs = std::getenv("LD_LIBRARY_PATH"); dirs != nullptr) {
    for (absl::string_view dir : absl::StrSplit(dirs, ':', absl::SkipEmpty())) {
      paths.push_back(absl::StrCat(dir, "/", kLibraryName));
    }
  }
  return paths;
}

absl::StatusOr<const SentencePieceLibrary*> SentencePieceLibrary::Load(const std::string& path) {
  // RTLD_LOCAL in a new namespace: nothing it loads (libsentencepiece, its protobuf-lite, a
  // second libstdc++) can interpose on this process's symbols, nor ours on its.
  void* handle = dlmopen(LM_ID_NEWLM, path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot load ", path, " (SentencePiece): ", why != nullptr ? why : "dlmopen failed"));
  }
  auto lib = std::make_unique<SentencePieceLibrary>();
  lib->path = path;
  decltype(&tandem_spm_abi_version) abi_version = nullptr;
  for (absl::Status s : {
           Resolve(handle, path, "tandem_spm_abi_version", &abi_version),
           Resolve(handle, path, "tandem_spm_load", &lib->load),
           Resolve(handle, path, "tandem_spm_unload", &lib->unload),
           Resolve(handle, path, "tandem_spm_piece_size", &lib->piece_size),
           Resolve(handle, path, "tandem_spm_bos_id", &lib->bos_id),
           Resolve(handle, path, "tandem_spm_unk_id", &lib->unk_id),
           Resolve(handle, path, "tandem_spm_id_to_piece", &lib->id_to_piece),
           Resolve(handle, path, "tandem_spm_piece_type", &lib->piece_type),
           Resolve(handle, path, "tandem_spm_encode", &lib->encode),
           Resolve(handle, path, "tandem_spm_decode", &lib->decode),
           Resolve(handle, path, "tandem_spm_free", &lib->free),
       }) {
    if (!s.ok()) {
      dlclose(handle);
      return s;
    }
  }
  if (abi_version() != TANDEM_SPM_ABI_VERSION) {
    dlclose(handle);
    return absl::FailedPreconditionError(absl::StrCat(
        path, " has ABI version ", abi_version(), ", this binary needs ", TANDEM_SPM_ABI_VERSION));
  }
  // Never unloaded: models hold pointers into it for the life of the process.
  return lib.release();
}

absl::StatusOr<const SentencePieceLibrary*> SentencePieceLibrary::Default() {
  static absl::Mutex mu(absl::kConstInit);
  static const SentencePieceLibrary* loaded ABSL_GUARDED_BY(mu) = nullptr;
  absl::MutexLock lock(&mu);
  if (loaded != nullptr) return loaded;
  const std::vector<std::string> paths = CandidatePaths();
  for (const std::string& path : paths) {
    if (access(path.c_str(), R_OK) != 0) continue;
    absl::StatusOr<const SentencePieceLibrary*> lib = Load(path);
    if (lib.ok()) loaded = *lib;
    return lib;
  }
  return absl::NotFoundError(absl::StrCat(
      "SentencePiece tokenizer.model files need ", kLibraryName,
      " (//tokenizer:libtandem_spm.so, a wrapper of libsentencepiece loaded in its own link "
      "namespace); not found at ",
      paths.empty() ? std::string("(no path to try)") : absl::StrJoin(paths, ", "), "; set ",
      kPathVariable, " to its path"));
}

std::string SentencePieceLibrary::TakeError(char* error) const {
  if (error == nullptr) return "unknown error";
  std::string out(error);
  this->free(error);  // the library's own free: its namespace has its own malloc
  return out;
}

}  // namespace tandem::tokenizer
