#!/usr/bin/env bash
# Issue 31 item 4 in one device call on a 4-GPU machine (nvidia-h200-x4): decode_step_bench's
# context-8192 rows, then the outside measurement (a copy of the shared tools'
# multi_gpu_measure.sh) for the serving tables through the router.
#
#   tests/gpu/tp_serving_call.sh BUNDLE_DIR MEASURE_SCRIPT LOG_DIR [SECTIONS]
# MEASURE_SCRIPT: the copy of multi_gpu_measure.sh adapted with adapt_measure below (dcp_bench
#   moved to runtime/parallel/dcp_bench/; request counts and dcp contexts made env knobs).
# SECTIONS default "env tp8 tp70 pd pdtp dcp". Env passed through to the script: TPS, RATES, PD_N,
#   N_B1, N70_B1, DCP_CONTEXTS, DCP_TIMEOUT, HEALTH_POLLS, DIST_TIMEOUT. DECODE8K=0 skips the
#   decode_step_bench rows (DECODE_TIMEOUT seconds each, default 60). Run from the repository root.
#
#   adapt_measure SRC DST: writes the adapted copy (the edits, all in one place). More knobs
#   (defaults: the script's own counts): N70_B16, N70_B64, NPDTP_B1, N70_B1=0 skips the 70B
#   batch-1 row, WARMUP (the one-at-a-time warmup requests of the tp8/tp70/pdtp-b1 rows), PD_WARMUP
#   (those of the Poisson rows); the 70B config is tests/gpu/configs/llama3-70b/config.json.
set -uo pipefail

adapt_measure() {
  sed -e 's#\$B/bin/comm/dcp_bench#$B/bin/runtime/parallel/dcp_bench/dcp_bench#' \
    -e 's#--context=32768,131072,524288#--context=${DCP_CONTEXTS:-32768,131072,524288}#' \
    -e 's#timeout 400 "\$B#timeout ${DCP_TIMEOUT:-400} "$B#' \
    -e 's#"8b-tp\$tp-b1" --num_requests=16#"8b-tp$tp-b1" --num_requests=${N_B1:-16}#' \
    -e 's#"70b-tp\$tp-b1" --num_requests=12#"70b-tp$tp-b1" --num_requests=${N70_B1:-12}#' \
    -e 's#^\( *\)bench "70b-tp\$tp-b1"#\1[[ ${N70_B1:-12} -gt 0 ]] \&\& bench "70b-tp$tp-b1"#' \
    -e 's#"70b-tp\$tp-b16" --num_requests=48#"70b-tp$tp-b16" --num_requests=${N70_B16:-48}#' \
    -e 's#"70b-tp\$tp-b64" --num_requests=128#"70b-tp$tp-b64" --num_requests=${N70_B64:-128}#' \
    -e 's#"pdtp22-b1" --num_requests=16#"pdtp22-b1" --num_requests=${NPDTP_B1:-16}#' \
    -e 's#--warmup=4#--warmup=${PD_WARMUP:-4}#g' -e 's#--warmup=2#--warmup=${WARMUP:-2}#g' \
    -e 's#wait_healthy 4 \&\& \(for r in [^"]*"\)\([0-9a-z]*\)#t0=$SECONDS; wait_healthy 4 \&\& echo "\2: 4 workers healthy after $((SECONDS - t0)) s" \&\& \1\2#' \
    -e "s#\$HERE/llama3-70b#\$PWD/tests/gpu/configs/llama3-70b/config.json#" \
    "$1" >"$2"
  chmod +x "$2"
}
if [[ ${1:-} == adapt_measure ]]; then
  adapt_measure "$2" "$3"
  exit
fi

B=$(cd "${1:?bundle}" && pwd)
MEASURE=${2:?adapted multi_gpu_measure.sh}
LOG=${3:?log dir}
SECTIONS=${4:-env tp8 tp70 pd pdtp dcp}
mkdir -p "$LOG"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [[ ${DECODE8K:-1} == 1 ]]; then
  export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
  D=$B/bin/runtime/cuda/decode_step_bench
  run_bench() {
    echo "== decode_step_bench --steps=32 --context=8192 $*"
    timeout "${DECODE_TIMEOUT:-60}" "$D" --steps=32 --context=8192 "$@" 2>&1 | grep -vE "^(I|W)[0-9]{4}"
  }
  run_bench --tp=1 --batches=1,8
  run_bench --tp=2 --batches=1,8
  run_bench --tp=4 --batches=1,8,64
  run_bench --shape=70b --tp=4 --batches=1,8
fi

NCCL_DEBUG=VERSION bash "$MEASURE" "$B" "$LOG/measure" "$SECTIONS" 2>&1
