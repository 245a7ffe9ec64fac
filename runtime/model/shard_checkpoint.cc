// Splits a Hugging Face checkpoint into per-rank files for one tensor-parallel topology (see
// WritePreShardedCheckpoint), so each rank of a `--tp=N` group reads only its own ~1/N:
//
//   shard_checkpoint --model=/models/llama3-8b --tp=4 --out=/models/llama3-8b-tp4
//   tandem_worker --model=/models/llama3-8b-tp4 --tp=4 ...
//
// The output directory loads only with the same --tp and --dcp. Exits 1 with a message on
// stderr for bad input.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"

ABSL_FLAG(std::string, model, "", "Hugging Face model directory (safetensors)");
ABSL_FLAG(int32_t, tp, 0, "tensor-parallel group size the output is for");
ABSL_FLAG(int32_t, dcp, 1, "KV shards (DCP) of that group; divides --tp");
ABSL_FLAG(std::string, out, "", "output directory (created if missing; not --model)");

namespace tandem::runtime {
namespace {

absl::Status Run() {
  const std::string model = absl::GetFlag(FLAGS_model);
  const std::string out = absl::GetFlag(FLAGS_out);
  const int tp = absl::GetFlag(FLAGS_tp);
  const int dcp = absl::GetFlag(FLAGS_dcp);
  if (model.empty() || out.empty()) return absl::InvalidArgumentError("--model and --out needed");
  if (tp < 1 || dcp < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--tp ", tp, " / --dcp ", dcp, ": need >= 1"));
  }
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(model));
  std::fprintf(stderr, "shard_checkpoint: %s, tp=%d dcp=%d -> %s\n", model.c_str(), tp, dcp,
               out.c_str());
  return WritePreShardedCheckpoint(model, config, tp, dcp, out);
}

}  // namespace
}  // namespace tandem::runtime

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Splits a checkpoint per tensor-parallel rank.\n"
      "  shard_checkpoint --model=DIR --tp=N [--dcp=K] --out=DIR");
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() > 1) {
    std::fprintf(stderr, "shard_checkpoint: unexpected argument '%s'\n", positional[1]);
    return 1;
  }
  const absl::Status status = tandem::runtime::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "shard_checkpoint: %s\n", status.ToString().c_str());
    return 1;
  }
  std::fprintf(stderr, "shard_checkpoint: done\n");
  return 0;
}
