#!/usr/bin/env bash
# One device call on nvidia-h200-x4 (4 GPUs, 64 cores, 512 GiB) for issue 31's start targets from
# files, from the repository root:
#   tests/gpu/tp70_files_call.sh BUNDLE_TAR_XZ
# BUNDLE_TAR_XZ: tests/gpu/bundle.sh .. //runtime/cuda:checkpoint_upload_test
#   tool//runtime/model:make_dummy_model tool//runtime:tandem_worker tool//router:tandem_router
#   tool//router:tandem_cli tool//tests/bench:tandem_bench, tarred and xz-compressed.
# Steps: checkpoint_upload_test on GPU 0 (the device read vs the fp32 host path, bit-identical
# logits), then tp_files_measure.sh with the checkpoints in /dev/shm (tmpfs: warm reads, COLD=0):
# Llama-3-8B bf16 written, its TP=4 group started from the files with the device read (the
# default) and again with --checkpoint_on_device=false (the fp32 host path; same greedy tokens
# expected), then Llama-3-70B bf16 (141 GB, the hub's 30 shards) written and started at TP=4;
# each healthy group gets 16 greedy tokens through the router and a concurrency-1 tandem_bench
# row (SMOKE=1). The 2026-11-28 19:23 call (lanes for other issues beside it) wrote the 70B files
# in 67.9 s, and no rank had finished LoadModelWeights' fp32 load 69 s later.
# Env: WRITE_TIMEOUT / LOAD_TIMEOUT (seconds per write / start; defaults 100 / 150), MODELS
# (default "8b 70b"), CKPT_ROOT (default /dev/shm when it has >= 150 GiB free), BACKEND and
# MODEL_CFG (a CPU rehearsal: BACKEND=cpu MODEL_CFG=a tiny config.json, MODELS=70b).
# Logs: $OUT/logs.tar.gz + summary.txt.
set -uo pipefail
T0=$SECONDS
OUT=${OUT:-/tmp/tp70_out}
LOG=$OUT/logs
mkdir -p "$LOG"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
TARBALL=$(realpath "${1:?bundle .tar.xz}")
BD=/tmp/tp70_bundle
rm -rf "$BD" && mkdir -p "$BD"
tar xJf "$TARBALL" -C "$BD" || { echo "FAIL extract"; exit 1; }
export LD_LIBRARY_PATH="$BD/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
BACKEND=${BACKEND:-cuda}
{
  echo "extracted in $((SECONDS - T0)) s; $(nproc) cores; $(free -g | awk '/Mem:/ {print $2}') GiB"
  nvidia-smi -L 2>&1 | head -4
  nvidia-smi topo -m 2>&1 | head -6
  df -h /dev/shm /tmp 2>&1
} | tee "$LOG/machine.txt"
if [[ -z ${CKPT_ROOT:-} ]]; then
  shm=$(df -BG --output=avail /dev/shm 2>/dev/null | tail -1 | tr -dc 0-9)
  [[ -n $shm && $shm -ge 150 ]] && export CKPT_ROOT=/dev/shm
fi
echo "checkpoint root: ${CKPT_ROOT:-the largest disk (tp_files_measure.sh)}"

# The GPU test beside the 8B write (GPU 0 only; the write is CPU work).
test_bin=$BD/bin/runtime/cuda/checkpoint_upload_test
if [[ -x $test_bin && $BACKEND == cuda ]]; then
  (CUDA_VISIBLE_DEVICES=0 TEST_TMPDIR=/tmp timeout 120 "$test_bin" >"$LOG/upload_test.txt" 2>&1
    echo "rc $?" >>"$LOG/upload_test.txt") &
fi

COLD=0 STEP_TIMEOUT=${LOAD_TIMEOUT:-150} WRITE_TIMEOUT=${WRITE_TIMEOUT:-100} \
  WRITE_THREADS=$(nproc) SHARD_MB=4700 NEED_GB=${NEED_GB:-150} BACKEND=$BACKEND \
  CFG_70B=${MODEL_CFG:-} KV_CACHE_BYTES=${KV_CACHE_BYTES:-0} HOST_PATH_TOO=${HOST_PATH_TOO:-8b} SMOKE=1 \
  tests/gpu/tp_files_measure.sh "$BD" "$LOG/files" ${MODELS:-8b 70b} 2>&1 | tee "$LOG/files.txt"
wait

{
  cat "$LOG/machine.txt"
  echo "== checkpoint_upload_test"
  grep -E "^\[ +(OK|FAILED|PASSED|SKIPPED) |rc [0-9]+|Failure|differ" "$LOG/upload_test.txt" 2>/dev/null |
    head -20
  echo "== TP=4 from files"
  cat "$LOG/files.txt"
  echo "== total $((SECONDS - T0)) s"
} >"$OUT/summary.txt"
cat "$OUT/summary.txt"
tar czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$LOG"
