#!/usr/bin/env bash
# Device dummy FP8 weights in 128 x 128 tiles and DeepSeek's FP8 format drawn on the device
# (issues 33 / 32 / 38) in one device call on nvidia-h200 (one GPU), ~40 s (timeouts: <= 60 s):
#   tests/gpu/mla_fp8_dummy_call.sh [BUNDLE_DIR]    (default: the current directory)
# BUNDLE_DIR: tests/gpu/bundle.sh DIR //runtime/cuda:cuda_mla_fp8_dummy_test
#   //runtime/cuda:cuda_moe_fp8_dummy_test //kernels/fp8:fp8_cuda_test
#   //runtime/cuda:decode_step_bench. Steps, each under its own timeout (logs under
#   $OUT/gdummy, a summary to stdout):
#   tiles       fp8_cuda_test: WeightTilesAndDequantizeEqualTheCpu (QuantizeWeightTiles128 and
#               DequantizeWeight vs the CPU, bit for bit) and QuantizeActivationsEqualsTheCpu
#               (the activation kernels now share BlockMax / ScaleFor with the tile kernel);
#   mla         cuda_mla_fp8_dummy_test (DeepSeek FP8 device draw vs the host draw; the engine on
#               it vs the host draw uploaded and vs the CPU);
#   moe         cuda_moe_fp8_dummy_test (the Qwen3-MoE FP8 experts, now tiles);
#   (the three side by side on the GPU: small models), then alone:
#   v2lite_fp8  decode_step_bench --shape=deepseek-v2-lite-fp8 (15.7B, every decoder projection
#               and expert e4m3 in 128 x 128 tiles, drawn on the device), batch 1 and 8;
#   v3_fp8      time permitting, --shape=deepseek-v3-4l-fp8 (V3 shape, 3 dense + 1 MoE layer of
#               256 experts) at batch 1.
set -uo pipefail
T0=$SECONDS
B=$(cd "${1:-.}" && pwd)
export OUT=${OUT:-/tmp/gdummy_out} TANDEM_REQUIRE_GPU=1 NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=0
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
LOG=$OUT/gdummy
mkdir -p "$LOG"
nvidia-smi -L > "$LOG/gpus.txt" 2>&1
echo "== device: $(head -n 1 "$LOG/gpus.txt")"

# job NAME SECONDS CMD...: CMD under timeout into $LOG/NAME.txt, its "rc seconds" into NAME.rc.
job() {
  local name=$1 secs=$2 t0=$SECONDS
  shift 2
  timeout "$secs" "$@" > "$LOG/$name.txt" 2>&1
  echo "$? $((SECONDS - t0))" > "$LOG/$name.rc"
}
report() { # NAME PATTERN
  local rc='?' secs='?'
  read -r rc secs < "$LOG/$1.rc"
  echo "== $1: rc $rc in $secs s (call at $((SECONDS - T0)) s)"
  grep -E "$2" "$LOG/$1.txt" | head -n 40
}
TESTS='^\[ +(OK|FAILED|PASSED|SKIPPED) |Failure|Expected|Which is|codes \(|cosine|rel\. L2|rror'

job tiles 20 "$B/bin/kernels/fp8/fp8_cuda_test" &
job mla 30 "$B/bin/runtime/cuda/cuda_mla_fp8_dummy_test" &
job moe 25 "$B/bin/runtime/cuda/cuda_moe_fp8_dummy_test" &
wait
report tiles "$TESTS"
report mla "$TESTS"
report moe "$TESTS"

BENCH='shapes|^ *batch|^ +[0-9]+ +[0-9]+ |rror|engine'
D=(--context=256 --steps=16)
job v2lite_fp8 30 "$B/bin/runtime/cuda/decode_step_bench" --shape=deepseek-v2-lite-fp8 \
  --batches=1,8 "${D[@]}"
report v2lite_fp8 "$BENCH"
if ((SECONDS - T0 < 26)); then
  job v3_fp8 20 "$B/bin/runtime/cuda/decode_step_bench" --shape=deepseek-v3-4l-fp8 --batches=1 \
    "${D[@]}"
  report v3_fp8 "$BENCH"
fi
echo "== total wall $((SECONDS - T0)) s"
