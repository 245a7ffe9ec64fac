#include "tokenizer/sentencepiece_shim.h"

#include <sentencepiece_processor.h>

namespace tandem::tokenizer::spm {

struct Model::Impl {
  sentencepiece::SentencePieceProcessor sp;
};

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::~Model() = default;

std::unique_ptr<Model> Model::Load(const std::string& path, std::string* error) {
  auto impl = std::make_unique<Impl>();
  const sentencepiece::util::Status s = impl->sp.Load(path);
  if (!s.ok()) {
    *error = s.ToString();
    return nullptr;
  }
  return std::unique_ptr<Model>(new Model(std::move(impl)));
}

bool Model::Encode(const std::string& text, std::vector<int>* ids, std::string* error) const {
  const sentencepiece::util::Status s = impl_->sp.Encode(text, ids);
  if (!s.ok()) *error = s.ToString();
  return s.ok();
}

int Model::size() const { return impl_->sp.GetPieceSize(); }
int Model::bos_id() const { return impl_->sp.bos_id(); }
int Model::unk_id() const { return impl_->sp.unk_id(); }
const std::string& Model::Piece(int id) const { return impl_->sp.IdToPiece(id); }
int Model::PieceToId(const std::string& piece) const { return impl_->sp.PieceToId(piece); }
bool Model::IsControl(int id) const { return impl_->sp.IsControl(id); }
bool Model::IsByte(int id) const { return impl_->sp.IsByte(id); }
bool Model::IsUnknown(int id) const { return impl_->sp.IsUnknown(id); }

}  // namespace tandem::tokenizer::spm
