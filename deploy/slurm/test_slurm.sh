#!/usr/bin/env bash
# deploy/slurm/test_slurm.sh: runs deploy/slurm/tandem.sbatch on a REAL Slurm (Debian's slurm-wlm)
# brought up just for this test, and checks it end to end:
#   * munged on its own key and socket, slurmctld, and two slurmd "nodes" (n1, n2), each in its own
#     Linux network namespace (+ UTS namespace) on a bridge 10.213.77.0/24 created here; if network
#     namespaces cannot be made, ONE node (n1 on 127.0.0.1) instead, said so in the output.
#   * job A: sbatch -N 2 tandem.sbatch, CPU backend, dummy tiny weights, 1 prefill + 1 decode
#     (tp=1), secure by default (the job generates its CA + per-role certificates + API key):
#     waits for `router: HOST:PORT`, generates 8 tokens through it over TLS with the key, checks
#     the certificates' SANs cover the nodes' addresses, that plain text / no key / no client
#     certificate are refused and an admin certificate lists the workers on the internal port,
#     that every daemon logged mutual TLS, checks the logs, scancel, checks that every tandem
#     process is gone.
#   * job B: one mixed TP=2 group, two srun tasks (--rank/--world_size/--dist_init from Slurm),
#     spread over both nodes (two namespaces) when there are two, with certificates made here
#     (--certs_dir): same checks.
#   * two nodes: a --certs_dir whose certificates lack the nodes' addresses is refused before any
#     step starts.
#   * job C: --insecure (the explicit opt-out) still serves, in plain text; its one mixed worker
#     gives the reference tokens for jobs D and E.
#   * jobs D and E: 1 prefill worker + a decode GROUP of --decode_tp=2 ranks, one per node
#     (--decode_group_nodes=2), E with --dcp=2: greedy tokens equal the mixed worker's, the decode
#     worker's WorkerStats show KV received on both ranks, and the rank on the node without the
#     prefill worker reads a 1500-token prompt's KV over its veth (each node has its own boot id,
#     so UCX cannot take the shared-memory path).
#   * at the end (also on failure / TERM): jobs cancelled, daemons stopped, namespaces, bridge and
#     the temp dir removed. Prints `N passed, N failed`; exits non-zero on failure.
# Needs root, iproute2, util-linux (unshare), slurm-wlm and munge (installed here with apt-get if
# missing). Refuses to run if a munged/slurmctld/slurmd is already running on this machine.
#
#   deploy/slurm/test_slurm.sh                 # from the repository root (uses bazel-bin), or
#   bazel test //deploy/slurm:slurm_test       # (binaries from the runfiles)
# Environment: TANDEM_SLURM_NODES=auto|netns|local (auto: netns, else local), KEEP_TMP=1,
# TANDEM_SLURM_SHARED_BOOT_ID=1 (the nodes share the host's boot id: UCX moves KV through shared
# memory and the veth checks of jobs D and E fail; shows that they can).
set -uo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH
t_start=$SECONDS
passed=0 failed=0
say() { echo "[test_slurm +$((SECONDS - t_start))s] $*"; }
ok() { passed=$((passed + 1)); say "PASS: $*"; }
bad() { failed=$((failed + 1)); say "FAIL: $*"; }
finish() { echo "$passed passed, $failed failed"; (( failed == 0 )) && exit 0 || exit 1; }
abort() { bad "$*"; finish; }

# ---- where things are -------------------------------------------------------------------------
if [[ -n "${TEST_SRCDIR:-}" ]]; then   # bazel test: cwd is the runfiles root (same layout as bazel-bin)
  root=$PWD bin_dir=$PWD
else
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd) bin_dir=$root/bazel-bin
fi
sbatch_script=$root/deploy/slurm/tandem.sbatch
make_certs=$root/deploy/certs/make_certs.sh
cli=$bin_dir/router/tandem_cli
for f in "$sbatch_script" "$make_certs" "$bin_dir/router/tandem_router" "$bin_dir/runtime/tandem_worker" "$cli"; do
  [[ -e "$f" ]] || abort "missing $f (build //router:tandem_router //runtime:tandem_worker //router:tandem_cli)"
done
(( EUID == 0 )) || abort "needs root (slurmd, munged, network namespaces)"

# ---- Slurm + munge: install if missing; never touch running ones -------------------------------
if ! command -v slurmctld > /dev/null || ! command -v slurmd > /dev/null || ! command -v sbatch > /dev/null ||
   ! command -v munged > /dev/null; then
  say "installing slurm-wlm and munge (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  timeout 600 apt-get install -y slurm-wlm munge > /tmp/test_slurm_apt.$$.log 2>&1 ||
    { timeout 300 apt-get update > /dev/null 2>&1 &&
      timeout 600 apt-get install -y slurm-wlm munge > /tmp/test_slurm_apt.$$.log 2>&1; } ||
    { tail -n 20 /tmp/test_slurm_apt.$$.log; abort "apt-get install slurm-wlm munge failed"; }
  rm -f /tmp/test_slurm_apt.$$.log
fi
for d in munged slurmctld slurmd slurmstepd; do
  for p in $(pgrep -x "$d"); do   # (zombies of an earlier run, waiting for init to reap them, do not count)
    grep -q '^State:[[:space:]]*Z' "/proc/$p/status" 2>/dev/null && continue
    abort "a $d is already running here (pid $p); refusing to start a test cluster next to it"
  done
done
say "$(slurmctld -V), $(munged -V 2>&1 | head -n 1)"

# ---- state, cleanup ---------------------------------------------------------------------------
T=$(mktemp -d /tmp/tdmslurm.XXXXXX) || abort "mktemp failed"
mkdir -p "$T/munge" "$T/state" "$T/spool" "$T/log" "$T/job"
chmod 711 "$T" "$T/munge"   # munged wants its socket's directories searchable by all
sfx=$$ net=10.213.77 br="" netns=() munged_pid="" ctld_pid="" slurmd_pids=() cleaned=0
export SLURM_CONF=$T/slurm.conf
cleanup() {
  (( cleaned )) && return 0
  cleaned=1
  trap '' TERM INT
  if [[ -n "$ctld_pid" ]] && kill -0 "$ctld_pid" 2>/dev/null; then
    if [[ -n "$(squeue -h -o %i 2>/dev/null)" ]]; then   # only our cluster's jobs (own slurm.conf)
      scancel --full $(squeue -h -o %i) 2>/dev/null
      for _ in $(seq 100); do [[ -z "$(squeue -h -o %i 2>/dev/null)" ]] && break; sleep 0.2; done
    fi
  fi
  stop_pid() {  # stop_pid PID: TERM, then KILL after 10 s
    [[ -n "$1" ]] || return 0
    kill -TERM "$1" 2>/dev/null || return 0
    for _ in $(seq 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$1" 2>/dev/null
    wait "$1" 2>/dev/null
  }
  for p in "${slurmd_pids[@]}"; do stop_pid "$p"; done
  stop_pid "$ctld_pid"
  stop_pid "$munged_pid"
  # Anything still inside our namespaces is ours (slurmstepd, stray tasks): kill it, then the
  # namespaces (their veth ends go with them) and the bridge.
  local i
  for i in "${!netns[@]}"; do
    for p in $(ip netns pids "${netns[$i]}" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
    ip link del "tdm${sfx}h$((i + 1))" 2>/dev/null
    ip netns del "${netns[$i]}" 2>/dev/null
  done
  [[ -n "$br" ]] && ip link del "$br" 2>/dev/null
  if [[ "${KEEP_TMP:-0}" == 1 ]]; then say "kept $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT
trap 'say "signal: cleaning up"; exit 143' TERM INT
show_logs() {  # on failure: what the daemons and the job said
  local f
  for f in "$T"/log/*.log "$T"/job/*.out "$T"/job/tandem-*/logs/*.log; do
    [[ -f "$f" ]] || continue
    echo "---- ${f#$T/} (last 15 lines)"; tail -n 15 "$f"
  done
}
# Slurm's ports are fixed in slurm.conf, so they are picked here and bound later. Below the kernel's
# ephemeral range (ip_local_port_range): a port of 32768-60999 could be taken meanwhile by any
# connect() or bind(port 0) on this host (every other daemon and test binds port 0).
ephemeral_low=$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null)
[[ "$ephemeral_low" =~ ^[0-9]+$ ]] && (( ephemeral_low > 12000 )) || ephemeral_low=32768
free_port() {  # a TCP port nobody listens on in this (host) namespace, outside the ephemeral range
  local p
  while true; do
    p=$((10000 + RANDOM % (ephemeral_low - 10000)))
    [[ -z "$(ss -Htln "sport = :$p" 2>/dev/null)" ]] && { echo "$p"; return; }
  done
}
wait_until() {  # wait_until TIMEOUT_S CMD...: polls CMD every 0.2 s
  local deadline=$((SECONDS + $1)); shift
  until "$@"; do (( SECONDS < deadline )) || return 1; sleep 0.2; done
}

# ---- nodes: two network namespaces on a bridge, or one node on loopback -----------------------
mode=${TANDEM_SLURM_NODES:-auto}
setup_netns() {
  if ip -4 addr show | grep -q " $net\."; then say "$net.0/24 is already in use here"; return 1; fi
  br=tdmbr$sfx
  ip link add "$br" type bridge || { br=""; return 1; }
  ip addr add "$net.1/24" dev "$br" && ip link set "$br" up || return 1
  local i ns
  for i in 1 2; do
    ns=tdm${sfx}n$i
    ip netns add "$ns" || return 1
    netns+=("$ns")
    ip link add "tdm${sfx}h$i" type veth peer name "tdm${sfx}p$i" || return 1
    ip link set "tdm${sfx}p$i" netns "$ns" &&
      ip link set "tdm${sfx}h$i" master "$br" && ip link set "tdm${sfx}h$i" up &&
      ip netns exec "$ns" ip link set lo up &&
      ip netns exec "$ns" ip addr add "$net.1$i/24" dev "tdm${sfx}p$i" &&
      ip netns exec "$ns" ip link set "tdm${sfx}p$i" up || return 1
  done
  # The bridge must carry traffic between the namespaces and to the host (slurmctld, the test):
  # a TCP connect to a closed port must be refused (not time out).
  refused() {  # refused ADDR [ip netns exec NS]
    local a=$1 out; shift
    out=$(timeout 3 "$@" bash -c "echo > /dev/tcp/$a/9" 2>&1)
    [[ "$out" == *refused* ]]
  }
  bridge_up() {
    refused "$net.12" ip netns exec "tdm${sfx}n1" && refused "$net.11" &&
      refused "$net.1" ip netns exec "tdm${sfx}n2"
  }
  wait_until 15 bridge_up || { say "no traffic across the bridge $br"; return 1; }
}
teardown_netns() {
  local i
  for i in "${!netns[@]}"; do
    ip link del "tdm${sfx}h$((i + 1))" 2>/dev/null
    ip netns del "${netns[$i]}" 2>/dev/null
  done
  netns=()
  [[ -n "$br" ]] && ip link del "$br" 2>/dev/null
  br=""
}
if [[ "$mode" != local ]]; then
  if setup_netns; then mode=netns
  else
    teardown_netns
    [[ "$mode" == netns ]] && abort "network namespaces were asked for (TANDEM_SLURM_NODES=netns) but could not be set up"
    mode=local
  fi
fi
if [[ "$mode" == netns ]]; then
  nodes=(n1 n2) addrs=("$net.11" "$net.12") ctld_addr=$net.1
  say "MODE: two Slurm nodes n1 ($net.11) and n2 ($net.12), each slurmd in its own network+UTS namespace"
else
  nodes=(n1) addrs=(127.0.0.1) ctld_addr=127.0.0.1
  say "MODE: ONE Slurm node n1 on 127.0.0.1 (network namespaces unavailable here): no cross-node traffic is tested"
fi

# ---- munge ------------------------------------------------------------------------------------
sock=$T/munge/munge.socket
head -c 1024 /dev/urandom > "$T/munge/munge.key" && chmod 400 "$T/munge/munge.key"
munged -F --socket="$sock" --key-file="$T/munge/munge.key" --pid-file="$T/munge/munged.pid" \
  --log-file="$T/log/munged.log" --seed-file="$T/munge/munged.seed" > "$T/log/munged.out.log" 2>&1 &
munged_pid=$!
wait_until 10 bash -c "{ munge -n --socket='$sock' | unmunge --socket='$sock'; } > /dev/null 2>&1" ||
  { show_logs; abort "munged did not come up"; }
ok "munged up (own key, socket $sock)"

# ---- slurm.conf -------------------------------------------------------------------------------
ctld_port=$(free_port) slurmd_port=$(free_port)
while [[ "$slurmd_port" == "$ctld_port" ]]; do slurmd_port=$(free_port); done
{
  cat <<EOF
ClusterName=tandemtest
SlurmctldHost=$(hostname -s)($ctld_addr)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$sock
CredType=cred/munge
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool/%n
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd-%n.pid
SlurmctldLogFile=$T/log/slurmctld.log
SlurmdLogFile=$T/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
SlurmdParameters=config_overrides
PropagateResourceLimits=NONE
KillWait=15
MessageTimeout=10
SlurmdTimeout=60
InactiveLimit=0
MinJobAge=60
EOF
  for i in "${!nodes[@]}"; do
    echo "NodeName=${nodes[$i]} NodeAddr=${addrs[$i]} CPUs=8 RealMemory=1000 State=UNKNOWN"
  done
  echo "PartitionName=tandem Nodes=$(IFS=,; echo "${nodes[*]}") Default=YES MaxTime=INFINITE State=UP"
} > "$T/slurm.conf"

# ---- daemons ----------------------------------------------------------------------------------
slurmctld -D -c -f "$T/slurm.conf" > "$T/log/slurmctld.out.log" 2>&1 &
ctld_pid=$!
for i in "${!nodes[@]}"; do
  n=${nodes[$i]}
  mkdir -p "$T/spool/$n"
  if [[ "$mode" == netns ]]; then   # its own network and hostname: a separate machine, as far as it can tell
    # (nsenter, not `ip netns exec`: that remounts /sys, hiding /sys/fs/cgroup, which slurmd needs).
    # Its own sysfs too, so the workers it starts see this namespace's network interfaces (UCX
    # reads /sys/class/net; the worker refuses to start on a device it cannot see), with the
    # host's cgroup mount carried over for slurmd. And its own boot id: UCX takes processes with
    # the same /proc/sys/kernel/random/boot_id for one host and moves KV through shared memory
    # (`sm` is in the default --ucx_tls), so without it no KV would cross the veths
    # (tests/multihost/README.md; TANDEM_SLURM_SHARED_BOOT_ID=1 shows that: the P/D TP jobs'
    # veth check fails).
    mkdir -p "$T/cg-$n"
    if [[ "${TANDEM_SLURM_SHARED_BOOT_ID:-0}" == 1 ]]; then cp /proc/sys/kernel/random/boot_id "$T/boot_id-$n"
    else cat /proc/sys/kernel/random/uuid > "$T/boot_id-$n"; fi
    nsenter --net="/run/netns/${netns[$i]}" unshare --uts --mount --propagation private bash -c \
      "mount --rbind /sys/fs/cgroup '$T/cg-$n' && mount -t sysfs -o ro sysfs /sys &&
       mount --rbind '$T/cg-$n' /sys/fs/cgroup && mount --bind '$T/boot_id-$n' /proc/sys/kernel/random/boot_id &&
       hostname $n && exec slurmd -D -N $n -f '$T/slurm.conf'" \
      > "$T/log/slurmd-$n.out.log" 2>&1 &
  else
    slurmd -D -N "$n" -f "$T/slurm.conf" > "$T/log/slurmd-$n.out.log" 2>&1 &
  fi
  slurmd_pids+=($!)
done
nodes_idle() { [[ "$(sinfo -h -N -o '%t' 2>/dev/null | grep -c '^idle')" == "${#nodes[@]}" ]]; }
if wait_until 40 nodes_idle; then ok "slurmctld + ${#nodes[@]} slurmd up, nodes idle: $(sinfo -h -N -o '%N=%t' | tr '\n' ' ')"
else sinfo -N 2>&1; show_logs; abort "Slurm nodes did not become idle"; fi

# ---- one job ----------------------------------------------------------------------------------
# run_job NAME NODES TOKEN_CHECK_ROLE SBATCH_ARGS...: submit, wait for the endpoint, generate, check
# logs and workers, scancel, check that every tandem process is gone.
job_state() { squeue -h -j "$1" -o %T 2>/dev/null; }
run_job() {
  local name=$1 n=$2; shift 2
  local out=$T/job/$name.out job_dir=$T/job/tandem-$name jobid ep="" deadline
  jobid=$(sbatch --parsable -N "$n" --chdir="$T/job" --output="$out" --job-name="tandem-$name" \
    --time=10 "$sbatch_script" --backend=cpu --load_format=dummy --dummy_config=tiny \
    --bin_dir="$bin_dir" --job_dir="$job_dir" --router_port=0 --cpus_per_task=1 \
    --ready_timeout_s=60 --stop_grace_s=10 "$@" 2>&1) || { bad "$name: sbatch failed: $jobid"; return; }
  say "$name: submitted job $jobid ($*)"
  deadline=$((SECONDS + 90))
  while (( SECONDS < deadline )); do
    ep=$(sed -n 's/^router: //p' "$out" 2>/dev/null | head -n 1)
    [[ -n "$ep" ]] && break
    [[ -z "$(job_state "$jobid")" ]] && break   # the job ended without an endpoint
    sleep 0.3
  done
  if [[ -z "$ep" ]]; then
    bad "$name: no 'router: HOST:PORT' in the job output (job state: $(job_state "$jobid" || true); empty = ended)"
    show_logs; scancel "$jobid" 2>/dev/null; return
  fi
  ok "$name: job $jobid $(job_state "$jobid") on $(squeue -h -j "$jobid" -o %N), endpoint $ep (+$((SECONDS - t_start))s)"
  [[ "$(cat "$job_dir/endpoint" 2>/dev/null)" == "$ep" ]] && ok "$name: endpoint file $job_dir/endpoint" ||
    bad "$name: endpoint file missing or different"
  say "$name: steps: $(squeue -h -s -j "$jobid" -o '%i=%j@%N' | tr '\n' ' ')"
  # What the job printed for clients: the CA and the API key file (none with --insecure).
  local internal ca key_file
  internal=$(sed -n 's/^internal: //p' "$out" | head -n 1)
  ca=$(sed -n 's/^tls_ca: //p' "$out" | head -n 1) key_file=$(sed -n 's/^admin_api_key_file: //p' "$out" | head -n 1)
  if [[ -n "$ca" ]]; then
    cli_sec=(--tls_ca="$ca") api_key=$(cat "$key_file" 2>/dev/null)
    check_security "$name" "$ep" "$internal" "$(dirname "$ca")" "$job_dir/logs"
  else
    cli_sec=(--insecure) api_key=""
  fi
  check_certs_source "$name" "$out" "$job_dir"
  local gen
  gen=$(timeout 30 env TANDEM_API_KEY="$api_key" "$cli" "${cli_sec[@]}" generate --router="$ep" --prompt_ids=1,2,3 --max_tokens=8 --json --timeout_ms=20000 2>&1)
  local ntok
  ntok=$(sed -n 's/.*"tokens":\[\([0-9,]*\)\].*/\1/p' <<< "$gen" | tr ',' '\n' | grep -c .)
  if [[ "$ntok" == 8 ]]; then ok "$name: generate through $ep: 8 tokens: $gen"
  else bad "$name: generate: $gen"; show_logs; fi
  local workers
  workers=$(timeout 10 env TANDEM_API_KEY="$api_key" "$cli" "${cli_sec[@]}" workers --router="$ep" --json 2>&1)
  echo "$workers" | grep -q '"healthy":false' && bad "$name: an unhealthy worker: $workers"
  check_workers "$name" "$workers"
  check_serving "$name" "$ep" "$ca" "$job_dir/logs"
  local logs
  logs=$(cd "$job_dir/logs" 2>/dev/null && ls | tr '\n' ' ')
  [[ -n "$logs" ]] && ok "$name: per-node per-role logs: $logs" || bad "$name: no logs in $job_dir/logs"
  check_logs "$name" "$job_dir/logs"

  # Teardown: scancel; the job's trap stops the steps; nothing of tandem may be left running.
  scancel "$jobid"
  if wait_until 40 bash -c "[[ -z \"\$(squeue -h -j $jobid -o %i 2>/dev/null)\" ]]"; then
    ok "$name: scancel: job $jobid gone"
  else bad "$name: job $jobid still there 40 s after scancel: $(job_state "$jobid")"; fi
  local left=()
  left_now() {
    left=()
    local p comm
    for p in $(pgrep -f -- "--router=$ep") ${internal:+$(pgrep -f -- "--router=$internal")} $(pgrep -f -- "$job_dir") $(for ns in "${netns[@]}"; do ip netns pids "$ns"; done); do
      comm=$(cat "/proc/$p/comm" 2>/dev/null) || continue
      [[ "$comm" == tandem* || "$comm" == srun || "$comm" == worker_task.sh ]] && left+=("$p:$comm")
    done
    (( ${#left[@]} == 0 ))
  }
  if wait_until 20 left_now; then ok "$name: no tandem process left after scancel"
  else bad "$name: left running after scancel: ${left[*]}"; fi
  grep -q "all steps stopped" "$out" && ok "$name: the job's trap tore the steps down" ||
    { bad "$name: no 'all steps stopped' in the job output"; tail -n 20 "$out"; }
  [[ ! -e "$job_dir/endpoint" ]] || bad "$name: endpoint file left behind"
}

# check_security NAME ENDPOINT INTERNAL CERTS_DIR LOGS: a TLS job's certificates and planes.
check_security() {
  local name=$1 ep=$2 internal=$3 certs=$4 logs=$5 r a bad_sans=() out
  for r in router prefill decode mixed; do
    [[ -f "$certs/$r.pem" ]] || continue
    for a in "${addrs[@]}"; do
      openssl x509 -in "$certs/$r.pem" -noout -checkip "$a" | grep -q 'does match' || bad_sans+=("$r.pem:$a")
    done
  done
  (( ${#bad_sans[@]} == 0 )) && ok "$name: every role certificate has SANs for the nodes' addresses (${addrs[*]})" ||
    bad "$name: SANs missing: ${bad_sans[*]}"
  [[ "$(stat -c %a "$certs/router.key")" == 600 ]] && ok "$name: keys are 0600" ||
    bad "$name: $certs/router.key mode $(stat -c %a "$certs/router.key")"
  # The public port: TLS, and the key is required.
  out=$(timeout 10 env -u TANDEM_API_KEY "$cli" --insecure workers --router="$ep" --timeout_ms=5000 2>&1) &&
    bad "$name: plain text accepted on the public port: $out" || ok "$name: plain text refused on the public port"
  out=$(timeout 10 env -u TANDEM_API_KEY "$cli" --tls_ca="$certs/ca.pem" generate --router="$ep" --prompt_ids=1 --max_tokens=1 --timeout_ms=5000 2>&1)
  [[ $? != 0 && "$out" == *UNAUTHENTICATED* ]] && ok "$name: TLS without the API key: UNAUTHENTICATED" ||
    bad "$name: TLS without the API key: $out"
  # The internal port: mutual TLS (no client certificate: refused; an admin certificate: served).
  out=$(timeout 10 "$cli" --tls_ca="$certs/ca.pem" workers --router="$internal" --timeout_ms=5000 2>&1) &&
    bad "$name: internal port without a client certificate: $out" || ok "$name: internal port refuses a client without a certificate"
  out=$(timeout 10 "$cli" --tls_ca="$certs/ca.pem" --tls_cert="$certs/admin.pem" --tls_key="$certs/admin.key" \
        workers --router="$internal" --json --timeout_ms=5000 2>&1)
  grep -q '"healthy":true' <<< "$out" && ok "$name: internal port $internal lists the workers for an admin certificate" ||
    bad "$name: admin on the internal port: $out"
  # Every daemon (router, each worker rank) logged that it runs mutual TLS.
  local f plain=()
  for f in "$logs"/*.log; do grep -q 'mutual TLS with the cluster CA' "$f" || plain+=("${f##*/}"); done
  (( ${#plain[@]} == 0 )) && ok "$name: every daemon runs mutual TLS ($(ls "$logs" | wc -l) logs)" ||
    bad "$name: no 'mutual TLS' in ${plain[*]}"
}
# check_serving NAME ENDPOINT CA LOGS: more checks through the endpoint (per job; none by default).
check_serving() { :; }
# Job A: 1 prefill + 1 decode, tp=1; the job generates its certificates.
check_certs_source() {
  grep -q "certificates: $3/certs (CA + " "$2" && [[ -s "$3/certs/ca.pem" ]] &&
    ok "$1: the job generated its CA and certificates in $3/certs" ||
    bad "$1: no generated certificates: $(grep certificates "$2")"
}
check_workers() {
  grep -q '"role":"prefill"' <<< "$2" && grep -q '"role":"decode"' <<< "$2" &&
    ok "$1: router lists a healthy prefill and a decode worker" || bad "$1: workers: $2"
}
check_logs() {
  ls "$2" | grep -q -- '-router.log$' && ls "$2" | grep -q -- '-prefill0-rank0.log$' &&
    ls "$2" | grep -q -- '-decode0-rank0.log$' || bad "$1: router/prefill/decode logs missing"
}
run_job pd "${#nodes[@]}" --prefill=1 --decode=1 --tp=1

# Job B: one mixed TP=2 group, rank 0 and rank 1 on different nodes when there are two; the
# certificates are made here and passed with --certs_dir.
given_certs=$T/job/given-certs
"$make_certs" "$given_certs" --hosts="$(IFS=,; echo "${addrs[*]}")" --api_key > /dev/null ||
  abort "make_certs.sh $given_certs failed"
check_certs_source() {
  grep -q "certificates: $given_certs (given)" "$2" && [[ ! -e "$3/certs" ]] &&
    ok "$1: the job used --certs_dir=$given_certs (generated none)" ||
    bad "$1: --certs_dir not used: $(grep certificates "$2")"
}
check_workers() {
  grep -q '"tp_size":2' <<< "$2" && ok "$1: router lists one healthy mixed worker group of tp_size 2" ||
    bad "$1: workers: $2"
}
check_logs() {
  local r0 r1
  r0=$(ls "$2" | grep -- '-mixed0-rank0.log$') r1=$(ls "$2" | grep -- '-mixed0-rank1.log$')
  if [[ -z "$r0" || -z "$r1" ]]; then bad "$1: mixed0 rank logs missing"; return; fi
  grep -q "rank 1/2: .*--rank=1 --world_size=2 --dist_init=" "$2/$r1" &&
    ok "$1: rank 1 got --rank/--world_size/--dist_init from Slurm: $(grep -o -- '--dist_init=[^ ]*' "$2/$r1")" ||
    bad "$1: rank 1's flags: $(head -n 1 "$2/$r1")"
  grep -q "rank 1 of 2 joined" "$2/$r1" && ok "$1: rank 1 joined the group ($r0, $r1)" ||
    bad "$1: rank 1 did not join: $(tail -n 3 "$2/$r1")"
}
if [[ "$mode" == netns ]]; then run_job tp2 2 --mixed=1 --prefill=0 --decode=0 --tp=2 --group_nodes=2 --certs_dir="$given_certs"
else run_job tp2 1 --mixed=1 --prefill=0 --decode=0 --tp=2 --group_nodes=1 --certs_dir="$given_certs"; fi

if [[ "$mode" == netns ]]; then
  # Certificates without the nodes' addresses (SANs localhost / 127.0.0.1 only): refused up front.
  "$make_certs" "$T/job/nosan-certs" --api_key > /dev/null || abort "make_certs.sh nosan-certs failed"
  out=$T/job/nosan.out
  jobid=$(sbatch --parsable -N 2 --chdir="$T/job" --output="$out" --job-name=tandem-nosan --time=5 \
    "$sbatch_script" --backend=cpu --load_format=dummy --bin_dir="$bin_dir" --job_dir="$T/job/tandem-nosan" \
    --router_port=0 --certs_dir="$T/job/nosan-certs" 2>&1) || bad "nosan: sbatch failed: $jobid"
  wait_until 40 bash -c "[[ -z \"\$(squeue -h -j $jobid -o %i 2>/dev/null)\" ]]"
  if grep -q "has no SAN for node address ${addrs[0]}" "$out" && ! grep -q '^router: ' "$out" &&
     [[ -z "$(ls -A "$T/job/tandem-nosan/logs" 2>/dev/null)" ]]; then
    ok "nosan: --certs_dir without the nodes' addresses refused before any step: $(grep -o 'has no SAN.*' "$out" | head -c 120)"
  else bad "nosan: job output: $(tail -n 5 "$out" 2>/dev/null)"; fi
fi

# Job C: the explicit opt-out: one mixed worker (tp=1), which also gives the reference tokens of
# the P/D TP jobs: `prompts`, 16 greedy tokens each (--ignore_eos).
prompts=(1,2,3 "$(for i in $(seq 0 99); do echo $((3 + (i * 37) % 250)); done | paste -sd, -)")
long_prompt=$(for i in $(seq 0 1499); do echo $((3 + (i * 131 + i / 7) % 250)); done | paste -sd, -)
declare -A ref=()
gen16() {  # gen16 ENDPOINT PROMPT: the 16 tokens (comma separated), or the client's output
  local out
  out=$(timeout 30 env TANDEM_API_KEY="$api_key" "$cli" "${cli_sec[@]}" generate --router="$1" \
    --prompt_ids="$2" --max_tokens=16 --ignore_eos --json --timeout_ms=20000 2>&1)
  sed -n 's/.*"tokens":\[\([0-9,]*\)\].*/\1/p' <<< "$out" | tail -n 1 | grep -E '^[0-9]+(,[0-9]+){15}$' ||
    echo "$out" | tail -n 2
}
check_certs_source() {
  grep -q "WARNING: --insecure" "$2" && [[ ! -e "$3/certs" ]] && ! grep -q '^tls_ca: ' "$2" &&
    ok "$1: --insecure: no certificates, a warning in the job output" || bad "$1: --insecure output: $(head -n 5 "$2")"
}
check_workers() {
  grep -q '"role":"mixed"' <<< "$2" && ok "$1: router lists the mixed worker (plain text)" || bad "$1: workers: $2"
}
check_logs() {
  grep -q 'INSECURE' "$2"/*-router.log && ok "$1: the router logged INSECURE" || bad "$1: no INSECURE in the router's log"
}
check_serving() {
  local p
  for p in "${!prompts[@]}"; do ref[$p]=$(gen16 "$2" "${prompts[$p]}"); done
  [[ "${ref[0]}" =~ ^[0-9,]+$ && "${ref[1]}" =~ ^[0-9,]+$ ]] &&
    ok "$1: reference tokens (one mixed worker, 16 each): [${ref[0]}] for 1,2,3; [${ref[1]}] for 100 tokens" ||
    bad "$1: reference generation failed: ${ref[*]}"
}
run_job insecure 1 --mixed=1 --prefill=0 --decode=0 --tp=1 --insecure

# Jobs D and E: a prefill worker and a decode GROUP of two ranks, one per node (two srun tasks of
# one step over both nodes), secure by default; E also shards the decode group's KV (--dcp=2).
# The tokens must equal the mixed worker's, and the decode worker's stats must show KV received
# on BOTH ranks: each rank reads its own part from the prefill worker's agent (one of them from
# the other node, over the veths: each node has its own boot id, so UCX cannot use shared memory).
check_certs_source() {
  grep -q "certificates: $3/certs (CA + " "$2" && [[ -s "$3/certs/ca.pem" ]] &&
    ok "$1: the job generated its CA and certificates in $3/certs" ||
    bad "$1: no generated certificates: $(grep certificates "$2")"
}
check_workers() {
  grep -q '"role":"prefill".*"tp_size":1' <<< "$2" && grep -q '"role":"decode".*"tp_size":2' <<< "$2" &&
    ok "$1: router lists a healthy prefill worker and a decode group of tp_size 2 (one entry: rank 0)" ||
    bad "$1: workers: $2"
}
check_logs() {
  local r0 r1
  r0=$(ls "$2" | grep -- '-decode0-rank0.log$') r1=$(ls "$2" | grep -- '-decode0-rank1.log$')
  if [[ -z "$r0" || -z "$r1" ]]; then bad "$1: decode0 rank logs missing"; return; fi
  if [[ "$mode" == netns && "${r0%%-*}" == "${r1%%-*}" ]]; then
    bad "$1: both decode ranks on node ${r0%%-*} ($r0, $r1)"
  fi
  grep -q "rank 1/2: .*--rank=1 --world_size=2 --dist_init=[^ ]* --dist_bind=${addrs[-1]} .*$dcp_flag" "$2/$r1" &&
    grep -q "rank 1 of 2 joined" "$2/$r1" &&
    ok "$1: decode rank 1 ($r1) joined rank 0 ($r0): $(grep -o -- '--dist_init=[^ ]* --dist_bind=[^ ]*' "$2/$r1")${dcp_flag:+ $dcp_flag}" ||
    bad "$1: decode rank 1: $(head -n 1 "$2/$r1" | head -c 400) ... $(tail -n 2 "$2/$r1")"
}
# kv_per_rank WORKER CLI_SECURITY_FLAGS...: the worker's WorkerStats.kv_bytes_received_per_rank
# and kv_bytes_read_per_rank (space separated) in kv_bytes and kv_read, its --json in kv_stats.
kv_per_rank() {
  kv_stats=$(timeout 10 "$cli" "${@:2}" stats --worker="$1" --json --timeout_ms=5000 2>&1)
  kv_bytes=$(grep -o '"kv_bytes_received_per_rank":\[[^]]*\]' <<< "$kv_stats" | grep -o '[0-9][0-9]*' | paste -sd' ' -)
  kv_read=$(grep -o '"kv_bytes_read_per_rank":\[[^]]*\]' <<< "$kv_stats" | grep -o '[0-9][0-9]*' | paste -sd' ' -)
}
# veth_tx NODE_INDEX: bytes the bridge sent into that node's namespace (0 with one node).
veth_tx() { cat "/sys/class/net/tdm${sfx}h$(($1 + 1))/statistics/tx_bytes" 2>/dev/null || echo 0; }
check_serving() {
  local p got mism=() decode ca=$3 logs=$4 sec=(--insecure) b1 r1 r2 kv_stats kv_bytes kv_read
  local pnode far="" far_node=-1 i tx0 tx1
  for p in "${!prompts[@]}"; do
    got=$(gen16 "$2" "${prompts[$p]}")
    [[ -n "${ref[$p]}" && "$got" == "${ref[$p]}" ]] || mism+=("prompt $p: [$got] vs [${ref[$p]}]")
  done
  (( ${#mism[@]} == 0 )) && ok "$1: P -> D(tp=2${dcp_flag:+, $dcp_flag}) tokens equal the mixed worker's for ${#prompts[@]} prompts" ||
    bad "$1: tokens differ from the mixed worker's: ${mism[*]}"
  # The decode worker (rank 0's address, from the router): KV bytes per rank of its group.
  [[ -n "$ca" ]] && sec=(--tls_ca="$ca" --tls_cert="$(dirname "$ca")/admin.pem" --tls_key="$(dirname "$ca")/admin.key")
  decode=$(timeout 10 env TANDEM_API_KEY="$api_key" "$cli" "${cli_sec[@]}" workers --router="$2" --json 2>/dev/null |
           grep -o '"role":"decode","address":"[^"]*"' | sed 's/.*"address":"//; s/"$//')
  kv_per_rank "$decode" "${sec[@]}"
  read -r -a b1 <<< "$kv_bytes"
  read -r -a r1 <<< "$kv_read"
  if (( ${#b1[@]} == 2 && b1[0] > 0 && b1[1] > 0 )) &&
     grep -q '"kv_load_failures":"0"' <<< "$kv_stats" && grep -q '"kv_recomputes":"0"' <<< "$kv_stats" &&
     { [[ -n "$dcp_flag" ]] || (( b1[0] == b1[1] )); }; then
    ok "$1: decode $decode stats: kv_bytes_received_per_rank=[${b1[*]}] (KV on both ranks), kv_bytes_read_per_rank=[${r1[*]}], no load failure or recompute"
  else bad "$1: decode $decode stats: per rank [${b1[*]}]: $(head -c 700 <<< "$kv_stats")"; fi
  # Two nodes: the decode rank on the node WITHOUT the prefill worker reads its part of a
  # 1500-token prompt's KV over that node's veth (2 tokens: one decode step, so the group's own
  # collectives add little): at least the bytes its agent read must cross the veth into it.
  [[ "$mode" == netns ]] || return 0
  pnode=$(cd "$logs" && ls | sed -n 's/-prefill0-rank0[.]log$//p')
  for i in "${!nodes[@]}"; do
    [[ "${nodes[$i]}" != "$pnode" ]] || continue
    far_node=$i far=$(cd "$logs" && ls | sed -n "s/^${nodes[$i]}-decode0-rank\\([0-9]*\\)[.]log$/\\1/p")
  done
  [[ -n "$far" ]] || { bad "$1: no decode rank on the node without the prefill worker ($pnode)"; return; }
  tx0=$(veth_tx "$far_node")
  got=$(timeout 30 env TANDEM_API_KEY="$api_key" "$cli" "${cli_sec[@]}" generate --router="$2" \
    --prompt_ids="$long_prompt" --max_tokens=2 --ignore_eos --json --timeout_ms=20000 2>&1)
  tx1=$(veth_tx "$far_node")
  kv_per_rank "$decode" "${sec[@]}"
  read -r -a r2 <<< "$kv_read"
  if (( ${#r2[@]} == 2 && r2[far] - r1[far] > 0 && tx1 - tx0 >= r2[far] - r1[far] )) &&
     grep -q '"kv_load_failures":"0"' <<< "$kv_stats"; then
    ok "$1: 1500-token prompt: decode rank $far (${nodes[$far_node]}; prefill on $pnode) read $((r2[far] - r1[far])) KV bytes, $((tx1 - tx0)) bytes crossed ${nodes[$far_node]}'s veth"
  else
    bad "$1: 1500-token prompt: decode rank $far on ${nodes[$far_node]} read $((${r2[far]:-0} - ${r1[far]:-0})) KV bytes, $((tx1 - tx0)) crossed its veth: $(head -c 300 <<< "$got")"
  fi
}
pdtp_nodes=(--decode_group_nodes=1)
[[ "$mode" == netns ]] && pdtp_nodes=(--decode_group_nodes=2)
dcp_flag=""
run_job pdtp "${#nodes[@]}" --prefill=1 --decode=1 --decode_tp=2 "${pdtp_nodes[@]}"
dcp_flag=--dcp=2
run_job pddcp "${#nodes[@]}" --prefill=1 --decode=1 --decode_tp=2 "${pdtp_nodes[@]}" --dcp=2

# ---- teardown of the test cluster --------------------------------------------------------------
(( failed )) && show_logs
daemon_pids=("$munged_pid" "$ctld_pid" "${slurmd_pids[@]}")
cleanup
alive=()
for p in "${daemon_pids[@]}"; do kill -0 "$p" 2>/dev/null && alive+=("$p"); done
ip netns list 2>/dev/null | grep -q "^tdm${sfx}n" && alive+=("netns tdm${sfx}n*")
ip link show "tdmbr$sfx" > /dev/null 2>&1 && alive+=("bridge tdmbr$sfx")
[[ -d "$T" && "${KEEP_TMP:-0}" != 1 ]] && alive+=("dir $T")
if (( ${#alive[@]} == 0 )); then
  ok "munged, slurmctld and slurmd stopped; namespaces, bridge and temp dir cleaned up"
else bad "left after cleanup: ${alive[*]}"; fi
say "mode: $mode; took $((SECONDS - t_start)) s"
finish
