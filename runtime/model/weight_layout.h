// Private to //runtime/model: how checkpoint tensors map onto ModelWeights, and the random
// streams dummy weights come from. Shared by loading, RandomModelWeights and WriteDummyModel so
// the three can never disagree.
#ifndef TANDEM_RUNTIME_MODEL_WEIGHT_LAYOUT_H_
#define TANDEM_RUNTIME_MODEL_WEIGHT_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "runtime/model/dummy_draw.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"
#include "runtime/model/tensor_parallel.h"

namespace tandem::runtime::internal {

struct HfTensor {
  std::string name;            // transformers' state_dict name
  std::vector<int64_t> shape;  // as stored in the checkpoint
  WeightSlot slot = WeightSlot::kEmbedTokens;
  int64_t layer = -1;    // decoder layer, -1 for model-level tensors
  int64_t offset = 0;    // element offset inside the (possibly fused) slot vector
  bool is_norm = false;  // RMSNorm weight: random values centred on 1
  // The part one tensor-parallel rank keeps: slice_dim -1 = all of it; 0 = rows
  // [slice_begin, slice_begin + slice_count); 1 = those columns of every row. `keep` false:
  // checked but not stored (row-parallel biases on ranks that do not add them).
  int slice_dim = -1;
  int64_t slice_begin = 0;
  int64_t slice_count = 0;
  bool keep = true;
  int64_t numel() const;        // of the checkpoint tensor
  int64_t local_numel() const;  // of the rank's part (0 when !keep)
  DummySlice slice() const;     // the rank's part as a 2-D slice (local_numel() elements)
};

// Every tensor of the checkpoint for `config` (lm_head.weight only when not tied): embeddings,
// then layer by layer, then the final norm and lm_head; offsets and slices for rank `dims`
// (default: the whole model).
std::vector<HfTensor> HfTensorLayout(const ModelConfig& config);
std::vector<HfTensor> HfTensorLayout(const ModelConfig& config, const TpDims& dims);

// Sizes every vector of `weights` for rank `dims` of `config`, zero-filled (biases only where
// configured and kept; embedding / lm_head with dims.vocab_rows rows).
void AllocateModelWeights(const ModelConfig& config, ModelWeights* weights);
void AllocateModelWeights(const ModelConfig& config, const TpDims& dims, ModelWeights* weights);

// weight_layout_moe.cc: the tensors of layer `layer` beyond the dense Llama ones, appended to
// `out` for rank `dims`: Qwen3's q/k norms and, on a mixture-of-experts layer (which then has
// no mlp.*_proj), the router, every expert and the shared expert.
void AppendFamilyLayerTensors(const ModelConfig& config, const TpDims& dims, int64_t layer,
                              std::vector<HfTensor>* out);
// Sizes those vectors (q/k norms; on MoE layers the expert slots, clearing the dense MLP's).
void AllocateFamilyWeights(const ModelConfig& config, const TpDims& dims, ModelWeights* weights);
// The LayerWeights vector of one of those slots.
std::vector<float>* FamilySlotVector(LayerWeights* layer, WeightSlot slot);

// mtp_weights.cc: the tensors of MTP layer `index` (model.layers.{num_hidden_layers + index}.*;
// mtp_weights.h) without its optional embed_tokens / shared_head.head copies, in the order
// LoadMtpWeights reads them: name, shape and is_norm only (they are written and drawn whole,
// never sliced). The dummy writer appends them after the model's tensors.
std::vector<HfTensor> MtpLayerLayout(const ModelConfig& config, int64_t index);

// The whole model as "rank 0 of 1".
TpDims FullTpDims(const ModelConfig& config);

// Where `tensor`'s first element lives inside `weights` (allocated by AllocateModelWeights).
float* SlotData(ModelWeights* weights, const HfTensor& tensor);

// The dummy-weight values of one whole tensor (dummy_draw.h), produced in order, in chunks of
// any size, from any element on (Seek: each value depends on its index alone).
class TensorRandomStream {
 public:
  TensorRandomStream(uint64_t seed, const HfTensor& tensor);
  void Seek(int64_t position) { position_ = position; }
  // `threads` > 1: FillDummySliceParallel's threads, the same values.
  void Fill(float* out, int64_t count, int threads = 1);

 private:
  uint64_t seed_;
  uint64_t stream_id_;
  float mean_;
  int64_t position_ = 0;
};

// Writes the dummy values of `slice` of the tensor drawn from (seed, stream_id) to out[0,
// slice.numel()): each pair is drawn once.
void FillDummySlice(uint64_t seed, uint64_t stream_id, float mean, const DummySlice& slice,
                    float* out);
// The same values on up to `threads` threads (chunks of >= 1M values: of rows, or of a one-row
// slice's columns); a large model's host dummy draw (a DeepSeek MTP layer: ~1G values) is
// otherwise ~40M values per second.
void FillDummySliceParallel(uint64_t seed, uint64_t stream_id, float mean, const DummySlice& slice,
                            float* out, int threads);
// The host's threads for dummy draws (hardware_concurrency, 1 to 32).
int DummyDrawThreads();

}  // namespace tandem::runtime::internal

#endif  // TANDEM_RUNTIME_MODEL_WEIGHT_LAYOUT_H_
