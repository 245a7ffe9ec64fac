#!/usr/bin/env bash
# Speculative decoding (n-gram drafts) on one GPU through //runtime:generate with dummy weights of
# the Llama-3-8B shape (bf16): tokens/s and acceptance with and without drafts, on workloads
#   repeat  prompts repeating an 8-token pattern, greedy, the real vocabulary;
#   loop    the 8B shape with a 64-token vocabulary, greedy: the random-weight output falls into
#           loops the drafter predicts (a synthetic high-acceptance workload);
#   reject  the same 64-token model at temperature 1: drafts almost always rejected.
#
#   tests/gpu/bundle.sh B tool//runtime:generate; tests/gpu/spec_decode_bench.sh B [MAX_TOKENS]
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=../../runtime/engine/spec_bench_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../runtime/engine/spec_bench_lib.sh"
gpu_generate "$1"
max_tokens=${2:-256}
v64=$(mktemp --suffix=.json)
trap 'rm -f "$v64"' EXIT
llama8b_v64_config "$v64"
run() { # run KIND BATCH K
  local model=(--dummy_config=llama3-8b) vocab=30000 sampling=() spec=()
  if [[ $1 != repeat ]]; then model=(--dummy_config="$v64") vocab=64; fi
  if [[ $1 == reject ]]; then sampling=(--temperature=1); fi
  [[ $3 == 0 ]] || spec=(--speculative_method=ngram --num_speculative_tokens="$3")
  local line
  line=$("$gen" --backend=cuda --load_format=dummy "${model[@]}" \
    --prompt_ids="$(prompts "$1" "$2" "$vocab")" --max_tokens="$max_tokens" --ignore_eos \
    ${sampling[@]+"${sampling[@]}"} ${spec[@]+"${spec[@]}"} 2>&1 > /dev/null | tail -1)
  echo "workload=$1 batch=$2 K=$3 $line"
}
nvidia-smi -L
workloads=${WORKLOADS:-repeat loop reject}
for w in $workloads; do
  case $w in
    repeat | loop) for batch in 1 8; do for k in 0 2 4; do run "$w" "$batch" "$k"; done; done ;;
    reject) for k in 0 3; do run reject 1 "$k"; done ;;
  esac
done
