// libtandem_spm.so: the C ABI of sentencepiece_capi.h over Debian's libsentencepiece. The only
// translation unit that includes <sentencepiece_processor.h> (its header declares its own
// `absl::string_view`, which collides with Abseil's: nothing of Abseil is included here).
// Exceptions never cross the C boundary (a caller in another link namespace could not catch
// them): every entry point catches and reports them as an error string.
#include "tokenizer/sentencepiece_capi.h"

#include <sentencepiece_processor.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#define TANDEM_SPM_EXPORT __attribute__((visibility("default")))

struct tandem_spm_model {
  sentencepiece::SentencePieceProcessor sp;
};

namespace {

// A malloc'd NUL-terminated copy (released by the caller with tandem_spm_free).
char* CopyOut(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out != nullptr) {
    std::memcpy(out, s.data(), s.size());
    out[s.size()] = '\0';
  }
  return out;
}

int Fail(const std::string& message, char** error) {
  if (error != nullptr) *error = CopyOut(message);
  return -1;
}

bool ValidId(const tandem_spm_model* model, int32_t id) {
  return model != nullptr && id >= 0 && id < model->sp.GetPieceSize();
}

}  // namespace

extern "C" {

TANDEM_SPM_EXPORT uint32_t tandem_spm_abi_version(void) { return TANDEM_SPM_ABI_VERSION; }

TANDEM_SPM_EXPORT tandem_spm_model* tandem_spm_load(const char* path, char** error) {
  try {
    auto model = std::make_unique<tandem_spm_model>();
    const sentencepiece::util::Status s = model->sp.Load(path);
    if (!s.ok()) {
      Fail(s.ToString(), error);
      return nullptr;
    }
    return model.release();
  } catch (const std::exception& e) {
    Fail(std::string("sentencepiece load: ") + e.what(), error);
    return nullptr;
  }
}

TANDEM_SPM_EXPORT void tandem_spm_unload(tandem_spm_model* model) { delete model; }

TANDEM_SPM_EXPORT int32_t tandem_spm_piece_size(const tandem_spm_model* model) {
  return model->sp.GetPieceSize();
}

TANDEM_SPM_EXPORT int32_t tandem_spm_bos_id(const tandem_spm_model* model) {
  return model->sp.bos_id();
}

TANDEM_SPM_EXPORT int32_t tandem_spm_unk_id(const tandem_spm_model* model) {
  return model->sp.unk_id();
}

TANDEM_SPM_EXPORT const char* tandem_spm_id_to_piece(const tandem_spm_model* model, int32_t id,
                                                     size_t* len) {
  if (!ValidId(model, id)) return nullptr;
  const std::string& piece = model->sp.IdToPiece(id);  // a reference into the model
  *len = piece.size();
  return piece.data();
}

TANDEM_SPM_EXPORT uint32_t tandem_spm_piece_type(const tandem_spm_model* model, int32_t id) {
  if (!ValidId(model, id)) return 0;
  uint32_t type = 0;
  if (model->sp.IsControl(id)) type |= TANDEM_SPM_PIECE_CONTROL;
  if (model->sp.IsByte(id)) type |= TANDEM_SPM_PIECE_BYTE;
  if (model->sp.IsUnknown(id)) type |= TANDEM_SPM_PIECE_UNKNOWN;
  return type;
}

TANDEM_SPM_EXPORT int tandem_spm_encode(const tandem_spm_model* model, const char* text, size_t len,
                                        int32_t* ids, size_t capacity, size_t* count,
                                        char** error) {
  try {
    std::vector<int> out;
    const sentencepiece::util::Status s = model->sp.Encode(std::string(text, len), &out);
    if (!s.ok()) return Fail(s.ToString(), error);
    *count = out.size();
    for (size_t i = 0; i < out.size() && i < capacity; ++i) ids[i] = out[i];
    return 0;
  } catch (const std::exception& e) {
    return Fail(std::string("sentencepiece encode: ") + e.what(), error);
  }
}

TANDEM_SPM_EXPORT int tandem_spm_decode(const tandem_spm_model* model, const int32_t* ids,
                                        size_t count, char** text, size_t* len, char** error) {
  try {
    std::vector<int> in(ids, ids + count);
    for (int id : in) {
      if (!ValidId(model, id)) return Fail("sentencepiece decode: id out of range", error);
    }
    std::string out;
    const sentencepiece::util::Status s = model->sp.Decode(in, &out);
    if (!s.ok()) return Fail(s.ToString(), error);
    *text = CopyOut(out);
    if (*text == nullptr) return Fail("sentencepiece decode: out of memory", error);
    *len = out.size();
    return 0;
  } catch (const std::exception& e) {
    return Fail(std::string("sentencepiece decode: ") + e.what(), error);
  }
}

TANDEM_SPM_EXPORT void tandem_spm_free(void* p) { std::free(p); }

}  // extern "C"
