#!/usr/bin/env bash
# Restarts every worker of a cluster started by deploy/local/up.sh, one at a time, while it keeps
# serving: SIGTERM (a prefill worker stops taking prompts but serves the KV its leases hold until
# decode workers have read it; a decode worker finishes its streams), wait for the exit, start the
# same command line again (same flags, certificates, port file, log), wait until the router lists
# the new incarnation (a new epoch) healthy and SERVING, then the next worker.
#
#   deploy/local/rolling_restart.sh [RUN_DIR=out/local] [--roles=prefill,decode,mixed]
#                                   [--drain_timeout_s=60] [--timeout_s=120] [--settle_s=0]
#
# Prints one line per worker and phase (Unix ms timestamps, for drivers that split a load run by
# phase, e.g. tests/bench/rolling_restart_bench.sh):
#   phase worker=prefill-0 begin_unix_ms=.. exit_unix_ms=.. healthy_unix_ms=.. drain_ms=..
#         restart_ms=.. total_ms=..
# and `rolling restart: N workers in S s`. Each worker's command line comes from /proc (so
# nothing up.sh passed is lost); RUN_DIR/pids gets the new pids (down.sh keeps working).
# A worker that does not exit within --drain_timeout_s is killed (reported: its drain failed);
# one that is not healthy within --timeout_s stops the script with status 1.
set -euo pipefail

run_dir=out/local roles=prefill,decode,mixed drain_timeout_s=60 timeout_s=120 settle_s=0
for a in "$@"; do
  case "$a" in
    --roles=*) roles="${a#*=}" ;;
    --drain_timeout_s=*) drain_timeout_s="${a#*=}" ;;
    --timeout_s=*) timeout_s="${a#*=}" ;;
    --settle_s=*) settle_s="${a#*=}" ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    -*) echo "rolling_restart.sh: unknown flag $a" >&2; exit 2 ;;
    *) run_dir="$a" ;;
  esac
done
pids_file="$run_dir/pids"
[[ -s "$pids_file" ]] || { echo "rolling_restart.sh: no $pids_file (start with up.sh)" >&2; exit 1; }

now_ms() { date +%s%3N; }
# Alive and not a zombie (a worker whose parent is gone may wait to be reaped).
alive() {
  [[ -r "/proc/$1/stat" ]] || return 1
  local state
  state="$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)" || return 1
  [[ -n "$state" && "$state" != Z ]]
}
flag_value() {  # flag_value NAME ARGS...: the value of --NAME=VALUE, empty when absent
  local name="$1" a
  shift
  for a in "$@"; do [[ "$a" == "--$name="* ]] && { echo "${a#*=}"; return; }; done
  return 0
}

router_pid="$(awk '$2 == "router" {print $1; exit}' "$pids_file")"
[[ -n "$router_pid" ]] && alive "$router_pid" || { echo "rolling_restart.sh: the router is not running" >&2; exit 1; }
router_addr="$(cat "$run_dir/router.port")"
mapfile -d '' -t router_argv < "/proc/$router_pid/cmdline"
router_cwd="$(readlink "/proc/$router_pid/cwd")"
cli_bin="$(cd "$router_cwd" && cd "$(dirname "${router_argv[0]}")" && pwd)/tandem_cli"
[[ -x "$cli_bin" ]] || { echo "rolling_restart.sh: no $cli_bin next to the router" >&2; exit 1; }
if printf '%s\n' "${router_argv[@]}" | grep -qx -- --insecure; then
  cli_sec=(--insecure)
else  # up.sh's certificates: the CA and the operator (admin) key (ListWorkers on the public port)
  cli_sec=(--tls_ca="$run_dir/certs/ca.pem" --api_key="$(cat "$run_dir/certs/admin_api_key")")
fi

# The router's view of one worker: "EPOCH HEALTHY STATUS" (empty when it is not listed).
worker_view() {
  "$cli_bin" workers --router="$router_addr" "${cli_sec[@]}" --json 2>/dev/null |
    python3 -c '
import json, sys
for w in json.load(sys.stdin)["workers"]:
    if w["worker_id"] == sys.argv[1]:
        print(w["epoch"], str(w["healthy"]).lower(), w["status"])' "$1" || true
}

# Workers in role order (prefill first: their drains are the interesting ones), then index.
mapfile -t workers < <(awk '$2 != "router" {print $2}' "$pids_file" |
  awk -v roles="$roles" 'BEGIN { n = split(roles, r, ","); for (i = 1; i <= n; i++) rank[r[i]] = i }
    { role = $1; sub(/-[0-9]+$/, "", role); if (role in rank) print rank[role], $1 }' |
  sort -k1,1n -k2,2V | cut -d' ' -f2)
[[ ${#workers[@]} -gt 0 ]] || { echo "rolling_restart.sh: no workers of roles $roles" >&2; exit 1; }

start_all=$(now_ms)
for name in "${workers[@]}"; do
  pid="$(awk -v n="$name" '$2 == n {print $1; exit}' "$pids_file")"
  alive "$pid" || { echo "rolling_restart.sh: $name ($pid) is not running" >&2; exit 1; }
  mapfile -d '' -t argv < "/proc/$pid/cmdline"
  cwd="$(readlink "/proc/$pid/cwd")"
  worker_id="$(flag_value worker_id "${argv[@]}")"
  worker_id="${worker_id:-$name}"
  port_file="$(flag_value port_file "${argv[@]}")"
  old_epoch="$(worker_view "$worker_id" | cut -d' ' -f1)"

  begin=$(now_ms)
  kill -TERM "$pid"
  deadline=$((SECONDS + drain_timeout_s))
  while alive "$pid" && (( SECONDS < deadline )); do sleep 0.05; done
  drained=ok
  if alive "$pid"; then
    echo "rolling_restart.sh: $name did not exit ${drain_timeout_s}s after SIGTERM; killing" >&2
    kill -KILL "$pid" 2>/dev/null || true
    drained=killed
    while alive "$pid"; do sleep 0.05; done
  fi
  exited=$(now_ms)

  [[ -n "$port_file" ]] && (cd "$cwd" && rm -f "$port_file")
  echo "=== rolling_restart.sh: restarted at $(date -u +%FT%TZ) ===" >> "$run_dir/$name.log"
  (cd "$cwd" && exec "${argv[@]}" < /dev/null >> "$run_dir/$name.log" 2>&1) &
  new_pid=$!
  sed -i "s/^$pid $name\$/$new_pid $name/" "$pids_file"

  deadline=$((SECONDS + timeout_s))
  while true; do
    if ! alive "$new_pid"; then
      echo "rolling_restart.sh: $name exited while starting again; its log:" >&2
      tail -n 30 "$run_dir/$name.log" >&2
      exit 1
    fi
    read -r epoch healthy status <<< "$(worker_view "$worker_id")" || true
    [[ -n "${epoch:-}" && "$epoch" != "$old_epoch" && "$healthy" == true &&
       "${status,,}" == serving ]] && break
    if (( SECONDS >= deadline )); then
      echo "rolling_restart.sh: $name not healthy ${timeout_s}s after its restart" >&2
      exit 1
    fi
    sleep 0.1
  done
  healthy_at=$(now_ms)
  echo "phase worker=$name begin_unix_ms=$begin exit_unix_ms=$exited healthy_unix_ms=$healthy_at" \
    "drain_ms=$((exited - begin)) restart_ms=$((healthy_at - exited))" \
    "total_ms=$((healthy_at - begin)) drain=$drained"
  [[ "$settle_s" == 0 ]] || sleep "$settle_s"
done
echo "rolling restart: ${#workers[@]} workers in $(( ($(now_ms) - start_all) / 1000 )) s"
