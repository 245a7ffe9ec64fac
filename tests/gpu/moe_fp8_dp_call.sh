#!/usr/bin/env bash
# FP8 experts under data-parallel attention + EP (b) on CUDA (issues 32 / 38), and DeepSeek's MLA
# model under --dp_attention, in one device call on nvidia-h200-x4 (4 GPUs), from the repository
# root:
#   tests/gpu/moe_fp8_dp_call.sh BUNDLE_TAR_XZ [SECONDS]
# Extracts BUNDLE_TAR_XZ (tests/gpu/bundle.sh .. tool//runtime:generate), then runs two chains
# in parallel, each on two GPUs (one per rank, NCCL, so the DP decode steps replay as CUDA
# graphs; on nvidia-h200-x2 both on GPUs 0, 1) under one timeout of SECONDS (default 42), the new
# rows first:
#   GPUs 0,1  fp8_cuda_golden.sh ct_moe_channel_dynamic[_pkg]-dp / -dp-eager (EP (b) against the
#             CPU backend's --dp_attention run; eager padded steps against the graphs' tokens),
#             then the same fixtures' TP=1 / TP=2 / EP (a) rows
#   GPUs 2,3  fp8_cuda_golden.sh fp8_deepseek_v3-dp / -dp-eager, then moe_ep_cuda_golden.sh
#             ROWS=dp (the bf16 EP (b) rows, with the DeepSeek-V3 MoE fixture's MLA DP row)
# Logs under $OUT (logs.tar.gz + summary.txt); prints a PASS / FAIL line per chain.
set -uo pipefail
T0=$SECONDS
export OUT=${OUT:-/tmp/moe_fp8_dp_out} SECS=${2:-42}
source "$(dirname "${BASH_SOURCE[0]}")/device_call_lib.sh"
BD=/tmp/moe_fp8_dp_bundle
bundle_call_start "$(realpath "${1:?bundle .tar.xz}")" "$BD"
export LD_LIBRARY_PATH="$BD/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"

golden() { # SHARE ONLY_REGEX LOG_NAME: fp8_cuda_golden.sh on the chain's GPUs
  echo "SHARE='$1' ONLY='$2' tests/gpu/fp8_cuda_golden.sh '$BD' '$LOG/$3'"
}
CT='ct_moe_channel_dynamic(_pkg)?'
DS_GPUS=2,3  # nvidia-h200-x2: both chains on GPUs 0, 1 (tiny models; two processes a GPU)
(($(grep -c '^GPU' "$LOG/gpus.txt") < 4)) && DS_GPUS=0,1
gpu_job ct 0,1 bash -c "$(golden '' "^$CT-dp(-eager)?\$" ct_dp);
  $(golden '' "^$CT(-ep)?\$" ct_tp)"
gpu_job deepseek "$DS_GPUS" bash -c "$(golden '' '^fp8_deepseek_v3-dp(-eager)?$' ds_dp);
  SHARE='' ROWS=dp tests/gpu/moe_ep_cuda_golden.sh '$BD' '$LOG/ep_dp'"
wait

{
  device_line
  fails=0
  for n in ct deepseek; do
    read -r rc secs < "$LOG/$n.rc" || { rc='?'; secs='?'; }
    verdict=PASS
    [[ $rc == 0 ]] || { verdict=FAIL; fails=$((fails + 1)); }
    echo "== $n: $verdict (rc $rc in $secs s)"
    grep -E "^(PASS|FAIL|SKIP)|passed|cosine|prompts with equal" "$LOG/$n.txt" | head -n 40
  done
  echo "== total wall $((SECONDS - T0)) s; $fails of 2 chains failed"
} | tee "$OUT/summary.txt"
tar czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$LOG"
