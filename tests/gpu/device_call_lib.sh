# shellcheck shell=bash
# Shared by the one-device-call scripts (fp8_cuda_call.sh, mla_cuda_call.sh, moe_kernels_ab.sh):
# each runs its steps under their own timeout, one log file a step; sourced, not run.
#
# device_call_start BUNDLE_DIR LOG_DIR: sets B and LOG, creates LOG, turns NVLink multicast off
#   for NCCL and writes the GPUs to $LOG/gpus.txt.
# timed_step FILE SECONDS CMD...: CMD under `timeout SECONDS`, stdout and stderr to $LOG/FILE;
#   sets step_rc (CMD's status, 124 when it timed out) and step_secs (wall seconds).
# step NAME SECONDS CMD...: timed_step into $LOG/NAME.txt, then "== NAME: rc RC in S s".

device_call_start() {
  # shellcheck disable=SC2034  # B is the sourcing script's
  B=${1:?bundle dir}
  LOG=${2:?log dir}
  mkdir -p "$LOG"
  export NCCL_NVLS_ENABLE=0
  nvidia-smi -L > "$LOG/gpus.txt" 2>&1
}

timed_step() {
  local file=$1 secs=$2
  shift 2
  local t0=$SECONDS
  timeout "$secs" "$@" > "$LOG/$file" 2>&1
  step_rc=$?
  step_secs=$((SECONDS - t0))
}

step() {
  local name=$1
  timed_step "$name.txt" "${@:2}"
  echo "== $name: rc $step_rc in $step_secs s"
}

# The parallel form (jobs on separate GPUs of one call, from a tarball bundle):
# bundle_call_start TARBALL BUNDLE_DIR: sets LOG=$OUT/logs, turns NVLink multicast off, extracts
#   TARBALL (tests/gpu/bundle.sh's directory, tar'd and xz'd) into BUNDLE_DIR (emptied first) and
#   writes the GPUs to $LOG/gpus.txt; exits on a failed extraction.
# gpu_job NAME GPUS CMD...: CMD in the background on CUDA_VISIBLE_DEVICES=GPUS under `timeout
#   $SECS`, its output to $LOG/NAME.txt and "RC SECONDS" to $LOG/NAME.rc; `wait` for them all.
# device_line: "== device: <first GPU> (N GPUs)" from $LOG/gpus.txt, then which of nsys, ncu and
#   compute-sanitizer the machine has (a summary's header).
device_line() {
  echo "== device: $(head -n 1 "$LOG/gpus.txt") ($(grep -c '^GPU' "$LOG/gpus.txt") GPUs)"
  local tool
  for tool in nsys ncu compute-sanitizer; do
    [[ -x /usr/local/cuda/bin/$tool ]] && printf '%s ' "$tool"
  done
  echo
}

bundle_call_start() {
  local t0=$SECONDS
  LOG=${OUT:?OUT}/logs
  mkdir -p "$LOG"
  export NCCL_NVLS_ENABLE=0
  rm -rf "${2:?bundle dir}" && mkdir -p "$2"
  tar xJf "${1:?bundle .tar.xz}" -C "$2" || { echo "FAIL extract"; exit 1; }
  echo "extracted in $((SECONDS - t0)) s"
  nvidia-smi -L > "$LOG/gpus.txt" 2>&1 || echo "no GPU (nvidia-smi failed)"
}

gpu_job() {
  local name=$1 gpus=$2
  shift 2
  (
    t=$SECONDS
    CUDA_VISIBLE_DEVICES=$gpus timeout "${SECS:?SECS}" "$@" > "$LOG/$name.txt" 2>&1
    echo "$? $((SECONDS - t))" > "$LOG/$name.rc"
  ) &
}
