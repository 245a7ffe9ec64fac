#!/usr/bin/env bash
# Stops a cluster started by deploy/local/up.sh: SIGTERM (workers drain), then SIGKILL after a
# grace period. Usage: deploy/local/down.sh [RUN_DIR=out/local] [--grace_s=15]
set -uo pipefail
run_dir=out/local grace_s=15
for a in "$@"; do
  case "$a" in
    --grace_s=*) grace_s="${a#*=}" ;;
    *) run_dir="$a" ;;
  esac
done
pids_file="$run_dir/pids"
[[ -f "$pids_file" ]] || { echo "down.sh: no $pids_file; nothing to stop"; exit 0; }
# Workers first (they drain and say goodbye to the router), then the router.
mapfile -t lines < <(grep -v ' router$' "$pids_file"; grep ' router$' "$pids_file")
for line in "${lines[@]}"; do
  pid="${line%% *}"
  kill -TERM "$pid" 2>/dev/null || true
done
deadline=$((SECONDS + grace_s))
for line in "${lines[@]}"; do
  pid="${line%% *}"
  while kill -0 "$pid" 2>/dev/null && (( SECONDS < deadline )); do sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "down.sh: ${line#* } ($pid) did not stop in ${grace_s}s; killing" >&2
    kill -KILL "$pid" 2>/dev/null || true
  fi
done
rm -f "$pids_file" "$run_dir"/*.port
echo "stopped (${#lines[@]} processes)"
