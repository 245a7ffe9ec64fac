# shellcheck shell=bash
# Shared by issue 35's device calls (attention_step_call.sh, attention_peer_extra_call.sh): jobs
# pinned to one GPU under a call deadline, copies of the FlashInfer peer package, ncu runs of ours
# and FlashInfer's kernels; sourced, not run. The sourcing script sets HERE (tests/gpu), then
# calls attention_call_start, which sets the variables the other functions use.
#
# attention_call_start NAME SECONDS BUNDLE_TAR_XZ FLASHINFER_DIR OUT   checks the arguments; sets
#                               FI (the peer package folder), OUT (created) and L (OUT/logs),
#                               DEADLINE (SECONDS from now, or CALL_SECONDS), W (TMPDIR/NAME,
#                               emptied) with the bundle unpacked into W/b, A (its
#                               kernels/attention/cuda binaries) and NCU (ncu's path, or empty);
#                               the GPUs to L/gpu.txt; NVLink multicast off
# job NAME GPU SECONDS CMD...   CMD on GPU for at most SECONDS and not past DEADLINE, output to
#                               $L/NAME.log; "NAME gpu=GPU rc=RC Ns" appended to $OUT/summary.txt
# peer_copy DIR                 the peer's files linked into DIR, its run_flashinfer.sh patched to
#                               unpack into DIR/root (the original always unpacks into
#                               /tmp/fi_peers) from whichever flashinfer-*.tar.* it holds
# fi_unpack DIR                 peer_copy DIR, then its run_flashinfer.sh with a peer that only
#                               prints: DIR/root/site holds FlashInfer, checked to import
# ncu_job NAME GPU SECONDS ARGS...   job running $NCU --clock-control none NCU_SECTIONS ARGS...
#                               (ARGS: ncu's kernel filter, then the command)
# fi_ncu NAME GPU SECONDS ROOT "FILTER" DRIVER_ARGS...   ncu_job of fi_ncu_driver.py with the
#                               peer unpacked in ROOT (ROOT/site); FILTER: ncu's filter arguments
#                               as one word list; the driver's table goes to $OUT/NAME.txt

attention_call_start() {
  local name=$1 secs=$2 tarball
  shift 2
  [[ $# -eq 3 ]] || { echo "usage: $0 BUNDLE_TAR_XZ FLASHINFER_DIR OUT" >&2; exit 2; }
  tarball=$(realpath "$1")
  FI=$(realpath "$2")
  mkdir -p "$3/logs" && OUT=$(realpath "$3")
  L=$OUT/logs
  DEADLINE=$((SECONDS + ${CALL_SECONDS:-$secs}))
  W=${TMPDIR:-/tmp}/$name
  rm -rf "$W" && mkdir -p "$W/b"
  xz -dc "$tarball" | tar xf - -C "$W/b" || { echo "cannot unpack $tarball" >&2; exit 1; }
  export NCCL_NVLS_ENABLE=0
  export LD_LIBRARY_PATH="$W/b/lib:${CUDA_HOME:-/usr/local/cuda}/lib64:/usr/local/cuda/lib64"
  # shellcheck disable=SC2034  # A is the sourcing script's
  A=$W/b/bin/kernels/attention/cuda
  : > "$OUT/summary.txt"
  nvidia-smi --query-gpu=index,name,clocks.sm,clocks.mem,temperature.gpu --format=csv \
    > "$L/gpu.txt" 2>&1
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2> /dev/null)
}

job() {
  local name=$1 gpu=$2 secs=$3 t0=$SECONDS
  shift 3
  ((secs > DEADLINE - SECONDS)) && secs=$((DEADLINE - SECONDS))
  if ((secs < 5)); then
    echo "$name gpu=$gpu not run (deadline)" >> "$OUT/summary.txt"
    return
  fi
  CUDA_VISIBLE_DEVICES=$gpu timeout "$secs" "$@" > "$L/$name.log" 2>&1
  echo "$name gpu=$gpu rc=$? $((SECONDS - t0))s" >> "$OUT/summary.txt"
}

peer_copy() {
  mkdir -p "$1"
  local f
  for f in "$FI"/*; do ln -sfn "$f" "$1/"; done
  rm "$1/run_flashinfer.sh"
  # shellcheck disable=SC2016  # $HERE and $(...) belong to the patched script
  sed -e "s|^ROOT=/tmp/fi_peers|ROOT=$1/root|" -e 's|tar -xzf|tar -xf|' \
    -e 's|^ARC=.*|ARC=$(ls "$HERE"/flashinfer-*.tar.* \| head -1)|' \
    "$FI/run_flashinfer.sh" > "$1/run_flashinfer.sh"
}

fi_unpack() {
  peer_copy "$1"
  rm "$1/peers_flashinfer.py"
  echo 'print("unpacked")' > "$1/peers_flashinfer.py"
  bash "$1/run_flashinfer.sh" "$1/unpack.txt" > /dev/null 2>&1
}

NCU_SECTIONS=(--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy
  --section LaunchStats --section SchedulerStats --section WarpStateStats --metrics
  'dram__bytes_read.sum.per_second,lts__t_sector_hit_rate.pct,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio')

ncu_job() {
  job "$1" "$2" "$3" "$NCU" --clock-control none "${NCU_SECTIONS[@]}" "${@:4}"
}

fi_ncu() {
  local name=$1 gpu=$2 secs=$3 root=$4 filter=$5
  shift 5
  # shellcheck disable=SC2086  # FILTER is a word list
  PYTHONPATH=$root/site PYTHONNOUSERSITE=1 FLASHINFER_WORKSPACE_BASE=$root/ws TMPDIR=$root/tmp \
    ncu_job "$name" "$gpu" "$secs" --target-processes all $filter \
    python3 "$HERE/fi_ncu_driver.py" "$FI/peers_flashinfer.py" "$OUT/$name.txt" "$@"
}
