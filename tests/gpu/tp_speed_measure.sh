#!/usr/bin/env bash
# Issue 31's measurements on a machine with 4 GPUs (nvidia-h200-x4), in two parts that each fit
# one device call:
#   check:  topology + NCCL version, the custom all-reduce's GPU test and the NCCL fault tests,
#           all_reduce_bench next to torch.distributed, the TP CUDA goldens with one GPU per rank.
#   decode: group start time of `generate --tp=N` with device dummy weights (Llama-3-8B preset;
#           Llama-3-70B from tests/gpu/configs/llama3-70b/config.json, the file form of
#           --dummy_config), then decode_step_bench --tp=1/2/4 (8B; 70B at 2/4), custom
#           all-reduce on and off.
#
#   tests/gpu/tp_speed_measure.sh BUNDLE_DIR LOG_DIR check|decode
# BUNDLE_DIR: tests/gpu/bundle.sh with the default targets plus tool//runtime:generate
# tool//runtime/model:make_dummy_model. Run from the repository root.
set -uo pipefail
B=$(cd "${1:?bundle}" && pwd)
LOG=${2:?log dir}
PART=${3:?check or decode}
mkdir -p "$LOG"
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
NGPU=$(nvidia-smi -L | wc -l)
G=$B/bin/runtime/generate

start_time() {  # NAME TP CONFIG
  local t0 t1
  t0=$(date +%s.%N)
  timeout 400 "$G" --backend=cuda --tp="$2" --load_format=dummy --dummy_config="$3" --prompt_ids=1,2,3 \
    --max_tokens=8 --kv_cache_bytes=4294967296 --num_threads=1 >"$LOG/start-$1.out" 2>"$LOG/start-$1.err"
  local rc=$?
  t1=$(date +%s.%N)
  printf "start %-10s tp=%d rc=%d: first 8 tokens after %.1f s;" "$1" "$2" "$rc" "$(python3 -c "print($t1 - $t0)")"
  grep -o "loaded the model in [0-9.a-z]*" "$LOG/start-$1.err" | sort | uniq -c | tr '\n' ' '
  echo
}

if [[ $PART == check ]]; then
  nvidia-smi -L
  nvidia-smi topo -m
  TANDEM_REQUIRE_GPU=1 timeout 300 "$B/bin/comm/custom_all_reduce_gpu_test" >"$LOG/custom_ar_test.log" 2>&1
  echo "custom_all_reduce_gpu_test rc=$?"; grep -E "OK|FAILED|rank [0-9]:" "$LOG/custom_ar_test.log" | head -20
  TANDEM_REQUIRE_GPU=1 timeout 200 "$B/bin/comm/device_communicator_test" >"$LOG/devcomm_test.log" 2>&1
  echo "device_communicator_test rc=$?"; grep -E "OK \]|FAILED|after peer" "$LOG/devcomm_test.log" | head -12
  for w in 2 4; do
    [[ $w -le $NGPU ]] || continue
    NCCL_DEBUG=VERSION timeout 200 "$B/bin/comm/all_reduce_bench" --world=$w 2>&1 | grep -v "^$"
    timeout 200 python3 tests/gpu/torch_allreduce_bench.py --world=$w 2>&1 | grep "^torch"
  done
  SHARE="" timeout 600 tests/gpu/tp_cuda_golden.sh "$B" "$LOG/golden" 2>&1 | grep -E "PASS|FAIL|passed|cosine" | head -30
fi

if [[ $PART == decode ]]; then
  for tp in 4 2 1; do [[ $tp -le $NGPU ]] && start_time "8b-tp$tp" "$tp" llama3-8b; done
  [[ $NGPU -ge 4 ]] && start_time 70b-tp4 4 "$PWD/tests/gpu/configs/llama3-70b/config.json"
  D=$B/bin/runtime/cuda/decode_step_bench
  run_bench() { timeout 300 "$D" --steps=32 "$@" 2>&1 | grep -vE "^(I|W)[0-9]{4}" ; }
  run_bench --tp=1 --batches=1,8,64
  for tp in 2 4; do
    [[ $tp -le $NGPU ]] || continue
    run_bench --tp=$tp --batches=1,8,64 --custom_ar=0
    run_bench --tp=$tp --batches=1,8,64 --custom_ar=1
  done
  run_bench --tp=4 --batches=1,8 --context=8192
  [[ $NGPU -ge 4 ]] && { run_bench --shape=70b --tp=4 --batches=1,8,64 --custom_ar=0
                         run_bench --shape=70b --tp=4 --batches=1,8,64 --custom_ar=1
                         run_bench --shape=70b --tp=2 --batches=1,8,64; }
fi
