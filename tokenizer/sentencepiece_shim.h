// The only translation unit that includes <sentencepiece_processor.h>: Debian's libsentencepiece
// header declares its own `absl::string_view` alias, which collides with Abseil's, so the
// library is reached through this std-only shim (no Abseil header may be included here).
#ifndef TANDEM_TOKENIZER_SENTENCEPIECE_SHIM_H_
#define TANDEM_TOKENIZER_SENTENCEPIECE_SHIM_H_

#include <memory>
#include <string>
#include <vector>

namespace tandem::tokenizer::spm {

class Model {
 public:
  // Null and *error set when the file cannot be loaded.
  static std::unique_ptr<Model> Load(const std::string& path, std::string* error);
  ~Model();
  // False and *error set on failure.
  bool Encode(const std::string& text, std::vector<int>* ids, std::string* error) const;
  int size() const;
  int bos_id() const;
  int unk_id() const;
  const std::string& Piece(int id) const;
  int PieceToId(const std::string& piece) const;
  bool IsControl(int id) const;
  bool IsByte(int id) const;
  bool IsUnknown(int id) const;

 private:
  struct Impl;
  explicit Model(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::tokenizer::spm

#endif  // TANDEM_TOKENIZER_SENTENCEPIECE_SHIM_H_
