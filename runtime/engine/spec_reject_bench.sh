#!/usr/bin/env bash
# The cost of rejected drafts on the CPU engine: plain, fixed K = 3 and adaptive K = 3 n-gram
# speculation, interleaved over ROUNDS rounds, on the reject workload of spec_bench.sh (a
# 64-token vocabulary of the llama-100m shape at temperature 1: drafts at almost every step,
# almost all rejected), 64-token prompts, 128 tokens per request, batch 1 and 8. Each line gives
# the step loop's wall time (generate's stderr) and the process's CPU time (user + system, from
# /usr/bin/time: steadier than wall time on a shared machine; mode "load" is the same process with
# max_tokens = 1, the part of the CPU time that is not decoding).
#
#   runtime/engine/spec_reject_bench.sh [GENERATE_BIN] [THREADS] [ROUNDS]
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=spec_bench_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/spec_bench_lib.sh"
gen=${1:-bazel-bin/runtime/generate}
threads=${2:-1}
rounds=${3:-5}
v64=$(mktemp --suffix=.json)
trap 'rm -f "$v64" "$v64.time"' EXIT
llama_config "$v64" vocab_size=64
for batch in 1 8; do
  p=$(prompts random "$batch" 64)
  for round in $(seq "$rounds"); do
    for mode in load plain fixed adaptive; do
      spec=() max_tokens=128
      [[ $mode == load ]] && max_tokens=1
      [[ $mode == fixed || $mode == adaptive ]] &&
        spec=(--speculative_method=ngram --num_speculative_tokens=3)
      [[ $mode == fixed ]] && spec+=(--speculative_adaptive=false)
      line=$(/usr/bin/time -o "$v64.time" -f "cpu %U+%S s" "$gen" --load_format=dummy \
        --dummy_config="$v64" --prompt_ids="$p" --max_tokens="$max_tokens" --ignore_eos \
        --num_threads="$threads" --temperature=1 ${spec[@]+"${spec[@]}"} 2>&1 > /dev/null |
        tail -1)
      line="$line; $(cat "$v64.time")"
      echo "batch=$batch round=$round mode=$mode $line"
    done
  done
done
