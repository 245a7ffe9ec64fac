#!/usr/bin/env bash
# tests/multihost/multihost_test.sh: a multi-host correctness test on ONE machine. The router, a
# prefill worker and a decode worker each run in their own Linux network namespace (+ UTS
# namespace: own hostname) on a bridge created here, so every gRPC call and every KV transfer
# crosses a veth pair and the bridge, as between hosts. Checks:
#   * the workers register across "hosts" with their advertised addresses (the prefill worker
#     listens on 0.0.0.0 with --advertise_address, the decode worker on its own address) and the
#     router lists both healthy;
#   * greedy tokens through the router (prefill -> decode, KV over UCX with the DEFAULT
#     --ucx_tls / --ucx_net_device) equal those of one mixed worker (own namespace, same dummy
#     model and seed) for several prompts, one of them 1500 tokens long;
#   * the decode worker really loaded the KV (WorkerStats: kv_bytes_received > 0,
#     kv_load_failures == 0, kv_loads_completed grows; the bytes crossed the decode's veth);
#     KV bandwidth = kv_bytes_received / kv_load_micros for the long prompt is printed;
#   * with the decode's link rate-limited (tc tbf 20mbit both ways) requests still give the same
#     tokens (and the long prompt's KV load is slower: it really went over the link);
#   * link down mid-stream: a long generation (--ignore_eos) is streaming when the decode's veth is
#     taken down; the client must get an error within 30 s (the time is printed); with the link
#     up again the decode worker must be healthy and serve a new request (time printed).
# Everything runs with TLS, as deployed: deploy/certs/make_certs.sh makes a CA, per-role
# certificates whose SANs are the namespaces' addresses, and an API key; the router serves its
# public port with TLS + the key and its internal port (worker registration) with mutual TLS,
# workers use their own certificates (naming their worker ids: KV leases are bound to the decode
# worker; router -> worker and worker -> worker calls are mTLS),
# tandem_cli uses the CA + key (an admin certificate for worker stats). Checked too: plain text
# refused on the router's public port, a worker refuses a client without a certificate and a
# `client`-role certificate (PERMISSION_DENIED), every daemon logged mutual TLS.
# Prints `N passed, N failed` and exits non-zero on failure. Cleans up (processes, namespaces,
# veths, bridge, temp dir) on every exit path.
#
#   tests/multihost/multihost_test.sh            # from the repository root (uses bazel-bin), or
#   bazel test //tests/multihost:multihost_test  # (binaries from the runfiles)
# Needs root and iproute2 (ip, tc with sch_tbf), util-linux (nsenter, unshare), python3.
# Environment: KEEP_TMP=1 keeps the logs; TANDEM_MULTIHOST_STREAM_RATE (300kbit) throttles the
# decode's token stream during the link-down check; TANDEM_MULTIHOST_UCX_FLAGS="--ucx_tls=..."
# adds worker flags (the default run uses none: the point is that the defaults work across
# hosts); TANDEM_MULTIHOST_HOST_SYSFS=1 / TANDEM_MULTIHOST_SHARED_BOOT_ID=1: see start() below.
set -uo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH
t_start=$SECONDS
passed=0 failed=0
say() { echo "[multihost +$((SECONDS - t_start))s] $*"; }
ok() { passed=$((passed + 1)); say "PASS: $*"; }
bad() { failed=$((failed + 1)); say "FAIL: $*"; }
finish() {
  say "took $((SECONDS - t_start)) s"
  echo "$passed passed, $failed failed"
  (( failed == 0 )) && exit 0 || exit 1
}
abort() { bad "$*"; show_logs; finish; }

# ---- where things are -------------------------------------------------------------------------
if [[ -n "${TEST_SRCDIR:-}" ]]; then   # bazel test: cwd is the runfiles root (same layout as bazel-bin)
  bin_dir=$PWD
else
  bin_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/bazel-bin
fi
ROUTER_BIN=$bin_dir/router/tandem_router WORKER_BIN=$bin_dir/runtime/tandem_worker
CLI=$bin_dir/router/tandem_cli
if [[ -n "${TEST_SRCDIR:-}" ]]; then MAKE_CERTS=$PWD/deploy/certs/make_certs.sh
else MAKE_CERTS=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/deploy/certs/make_certs.sh; fi
show_logs() { :; }
for f in "$ROUTER_BIN" "$WORKER_BIN" "$CLI" "$MAKE_CERTS"; do
  [[ -x "$f" ]] || abort "missing $f (build //router:tandem_router //runtime:tandem_worker //router:tandem_cli)"
done
(( EUID == 0 )) || abort "needs root (network namespaces, tc)"
for c in ip tc nsenter unshare python3 timeout openssl; do
  command -v "$c" > /dev/null || abort "needs $c"
done

# ---- state, cleanup ---------------------------------------------------------------------------
T=$(mktemp -d /tmp/tdmmultihost.XXXXXX) || abort "mktemp failed"
sfx=$$ br="" netns=() hveths=() pids=() cleaned=0
cleanup() {
  (( cleaned )) && return 0
  cleaned=1
  trap '' TERM INT
  local p ns v
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for _ in $(seq 25); do
    local alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    (( alive )) || break
    sleep 0.2
  done
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  # Anything still inside our namespaces is ours: kill it, then the namespaces, veths, bridge.
  for ns in "${netns[@]}"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
  done
  for v in "${hveths[@]}"; do ip link del "$v" 2>/dev/null; done
  for ns in "${netns[@]}"; do ip netns del "$ns" 2>/dev/null; done
  [[ -n "$br" ]] && ip link del "$br" 2>/dev/null
  if [[ "${KEEP_TMP:-0}" == 1 ]]; then say "kept $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT
trap 'say "signal: cleaning up"; exit 143' TERM INT
show_logs() {
  local f
  for f in "$T"/*.log; do
    [[ -f "$f" ]] || continue
    echo "---- ${f##*/} (last 15 lines)"; tail -n 15 "$f"
  done
}
wait_until() {  # wait_until TIMEOUT_S CMD...: polls CMD every 0.2 s
  local deadline=$((SECONDS + $1)); shift
  until "$@"; do (( SECONDS < deadline )) || return 1; sleep 0.2; done
}
now_ms() { date +%s%3N; }

# ---- network: a bridge, four namespaces (router, prefill, decode, mixed) ------------------------
net=""
for n in $((sfx % 200 + 20)) $(seq 20 250); do   # a free 10.214.N.0/24
  ip -4 addr show | grep -q " 10\.214\.$n\." || { net=10.214.$n; break; }
done
[[ -n "$net" ]] || abort "no free 10.214.N.0/24"
declare -A ADDR=([r]=$net.10 [p]=$net.11 [d]=$net.12 [m]=$net.13)
declare -A NAME=([r]=router [p]=prefill [d]=decode [m]=mixed)
ns_of() { echo "tmh${sfx}$1"; }     # namespace of node r/p/d/m
hveth() { echo "tmh${sfx}h$1"; }    # its veth's host (bridge) end
nveth() { echo "tmh${sfx}n$1"; }    # its veth's namespace end
br=tmhbr$sfx
ip link add "$br" type bridge || { br=""; abort "cannot create a bridge"; }
ip addr add "$net.1/24" dev "$br" && ip link set "$br" up || abort "bridge $br setup failed"
for k in r p d m; do
  ns=$(ns_of $k)
  ip netns add "$ns" || abort "ip netns add $ns failed"
  netns+=("$ns")
  ip link add "$(hveth $k)" type veth peer name "$(nveth $k)" || abort "veth for $k failed"
  hveths+=("$(hveth $k)")
  ip link set "$(nveth $k)" netns "$ns" &&
    ip link set "$(hveth $k)" master "$br" && ip link set "$(hveth $k)" up &&
    ip -n "$ns" link set lo up &&
    ip -n "$ns" addr add "${ADDR[$k]}/24" dev "$(nveth $k)" &&
    ip -n "$ns" link set "$(nveth $k)" up || abort "namespace $ns setup failed"
done
refused() {  # refused ADDR NS: a TCP connect from NS (or the host: "") to ADDR:9 is refused
  local out
  if [[ -n "$2" ]]; then out=$(timeout 3 nsenter --net="/run/netns/$2" bash -c "echo > /dev/tcp/$1/9" 2>&1)
  else out=$(timeout 3 bash -c "echo > /dev/tcp/$1/9" 2>&1); fi
  [[ "$out" == *refused* ]]
}
bridge_up() {
  refused "${ADDR[r]}" "$(ns_of p)" && refused "${ADDR[p]}" "$(ns_of d)" &&
    refused "${ADDR[d]}" "$(ns_of r)" && refused "${ADDR[r]}" "" && refused "${ADDR[m]}" ""
}
wait_until 15 bridge_up || abort "no traffic across the bridge $br"
ok "bridge $br ($net.0/24): router ${ADDR[r]}, prefill ${ADDR[p]}, decode ${ADDR[d]}, mixed ${ADDR[m]}; each in its own net+UTS namespace"

# start NODE LOGNAME PROGRAM ARGS...: in NODE's network namespace, with its own hostname (UTS
# namespace), its own sysfs and its own boot id (mount namespace): as on a host of its own, as far
# as UCX can tell; pid in $last_pid.
#  * sysfs: UCX finds its network devices in /sys/class/net. With nsenter alone /sys stays the
#    host's, which lists none of the namespace's interfaces, so UCX sees only 'lo' and every KV
#    load failed "Destination is unreachable"; the worker now refuses to start on such a device
#    (TANDEM_MULTIHOST_HOST_SYSFS=1 shows that).
#  * boot id: UCX's shared-memory transports (sm: posix, sysv, cma; in the default --ucx_tls)
#    take two processes with the same /proc/sys/kernel/random/boot_id for one host and move the
#    KV through shared memory, never over the link (TANDEM_MULTIHOST_SHARED_BOOT_ID=1 shows that:
#    the KV bytes do not cross the veth and the rate limit does not slow them).
start() {
  local k=$1 log=$2 pre=""; shift 2
  [[ "${TANDEM_MULTIHOST_HOST_SYSFS:-0}" == 1 ]] || pre+='mount -t sysfs -o ro sysfs /sys && '
  if [[ "${TANDEM_MULTIHOST_SHARED_BOOT_ID:-0}" != 1 ]]; then
    [[ -f "$T/boot_id.$k" ]] || cat /proc/sys/kernel/random/uuid > "$T/boot_id.$k"
    pre+="mount --bind '$T/boot_id.$k' /proc/sys/kernel/random/boot_id && "
  fi
  nsenter --net="/run/netns/$(ns_of "$k")" unshare --uts --mount --propagation private \
    bash -c "$pre"'hostname "$0" && exec "$@"' "tmh-${NAME[$k]}" "$@" > "$T/$log.log" 2>&1 &
  last_pid=$!
  pids+=("$last_pid")
}
PORT=7000 IPORT=7001 WPORT=7100

# ---- certificates: CA, one per role, SANs = the namespaces' addresses; an API key -------------
CERTS=$T/certs
"$MAKE_CERTS" "$CERTS" --hosts="$net.10,$net.11,$net.12,$net.13" --api_key \
  --worker=mixed0:mixed --worker=prefill0:prefill --worker=decode0:decode > "$T/make_certs.log" 2>&1 ||
  abort "make_certs.sh failed: $(cat "$T/make_certs.log")"
san_missing=()
for r in router prefill0 decode0 mixed0; do
  for k in r p d m; do
    openssl x509 -in "$CERTS/$r.pem" -noout -checkip "${ADDR[$k]}" | grep -q 'does match' ||
      san_missing+=("$r:${ADDR[$k]}")
  done
done
(( ${#san_missing[@]} == 0 )) && ok "certificates (make_certs.sh): router/prefill0/decode0/mixed0 SANs cover ${ADDR[*]}" ||
  abort "certificate SANs missing: ${san_missing[*]}"
tls() { echo --tls_cert="$CERTS/$1.pem" --tls_key="$CERTS/$1.key" --tls_ca="$CERTS/ca.pem"; }  # (no spaces in $T)
# tandem_cli on the public port: TLS with the CA + the API key (from the environment); on a
# worker: an admin certificate.
export TANDEM_API_KEY
TANDEM_API_KEY=$(cat "$CERTS/admin_api_key")  # the operator's: it also lists workers
PUB_CLI=("$CLI" --tls_ca="$CERTS/ca.pem")
ADMIN_CLI=("$CLI" $(tls admin))
read -r -a EXTRA <<< "${TANDEM_MULTIHOST_UCX_FLAGS:-}"
MODEL=(--backend=cpu --load_format=dummy --dummy_config=tiny --dummy_seed=0 --num_threads=1)

# ---- prompts, token helpers -------------------------------------------------------------------
P1=1,2,3
P2=1,17,42,99,7,250,3,8,64,128,5
P3=$(python3 -c "print(','.join(str(3 + (i * 37) % 250) for i in range(100)))")
PLONG=$(python3 -c "print(','.join(str(3 + (i * 131 + i // 7) % 250) for i in range(1500)))")
PROMPTS=(P1 P2 P3 PLONG)
gen_tokens() {  # gen_tokens ROUTER PROMPT MAX OUT: tokens (comma list) in OUT, JSON in OUT.json
  timeout 60 "${PUB_CLI[@]}" generate --router="$1" --prompt_ids="$2" --max_tokens="$3" --ignore_eos --json \
    --timeout_ms=50000 > "$4.json" 2> "$4.err" || return 1
  python3 - "$4.json" "$3" "$4" <<'PY'
import json, sys
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
toks = j.get("tokens", [])
if len(toks) != int(sys.argv[2]):
    sys.exit("expected %s tokens, got %s" % (sys.argv[2], j))
open(sys.argv[3], "w").write(",".join(map(str, toks)))
PY
}
stats() {  # stats WORKER_ADDR FIELD: one numeric WorkerStats field (proto JSON prints uint64 as strings)
  timeout 15 "${ADMIN_CLI[@]}" stats --worker="$1" --json --timeout_ms=10000 2> /dev/null |
    python3 -c "import json,sys; print(int(json.load(sys.stdin).get('$2', 0)))"
}
workers_json() { timeout 15 "${PUB_CLI[@]}" workers --router="$1" --json --timeout_ms=10000 2> /dev/null; }

# ---- reference: one mixed worker (own router) in the "mixed" namespace ------------------------
REF_ROUTER=${ADDR[m]}:$PORT
start m ref_router "$ROUTER_BIN" --listen="$REF_ROUTER" --internal_listen="${ADDR[m]}:$IPORT" \
  $(tls router) --api_key_file="$CERTS/api_keys"
start m mixed "$WORKER_BIN" $(tls mixed0) --role=mixed --worker_id=mixed0 --listen="${ADDR[m]}:$WPORT" \
  --router="${ADDR[m]}:$IPORT" --metrics_listen="${ADDR[m]}:0" "${MODEL[@]}" "${EXTRA[@]}"
ref_ready() { workers_json "$REF_ROUTER" | grep -q '"role":"mixed".*"healthy":true'; }
wait_until 40 ref_ready || abort "the reference mixed worker did not become healthy: $(workers_json "$REF_ROUTER")"
for p in "${PROMPTS[@]}"; do
  gen_tokens "$REF_ROUTER" "${!p}" 16 "$T/ref.$p" ||
    abort "reference generate ($p) failed: $(cat "$T/ref.$p.err" "$T/ref.$p.json" 2>/dev/null | head -c 400)"
done
ok "reference (mixed worker, ${#PROMPTS[@]} prompts, 16 greedy tokens each; $P1 -> $(cat "$T/ref.P1"))"
# Stop it: 2 cores are all there is.
for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
pids=()

# ---- the disaggregated cluster: router, prefill, decode on three "hosts" ----------------------
ROUTER=${ADDR[r]}:$PORT ROUTER_INTERNAL=${ADDR[r]}:$IPORT
PREFILL=${ADDR[p]}:$WPORT DECODE=${ADDR[d]}:$WPORT
start r router "$ROUTER_BIN" --listen="$ROUTER" --internal_listen="$ROUTER_INTERNAL" $(tls router) \
  --api_key_file="$CERTS/api_keys"
router_pid=$last_pid
router_up() { timeout 5 "${PUB_CLI[@]}" workers --router="$ROUTER" --timeout_ms=3000 > /dev/null 2>&1; }
wait_until 20 router_up || abort "router did not come up at $ROUTER"
# prefill: wildcard --listen + --advertise_address; decode: its own address. Both register on the
# router's internal (mTLS) port.
start p prefill "$WORKER_BIN" $(tls prefill0) --role=prefill --worker_id=prefill0 --listen="0.0.0.0:$WPORT" \
  --advertise_address="${ADDR[p]}" --router="$ROUTER_INTERNAL" --metrics_listen="${ADDR[p]}:0" \
  "${MODEL[@]}" "${EXTRA[@]}"
start d decode "$WORKER_BIN" $(tls decode0) --role=decode --worker_id=decode0 --listen="$DECODE" \
  --router="$ROUTER_INTERNAL" --metrics_listen="${ADDR[d]}:0" "${MODEL[@]}" "${EXTRA[@]}"
decode_pid=$last_pid
both_healthy() {
  local j
  j=$(workers_json "$ROUTER") || return 1
  python3 - "$j" "$PREFILL" "$DECODE" <<'PY'
import json, sys
ws = {w["role"]: w for w in json.loads(sys.argv[1])["workers"]}
ok = ws.get("prefill", {}).get("healthy") and ws.get("decode", {}).get("healthy")
sys.exit(0 if ok else 1)
PY
}
t0=$(now_ms)
if wait_until 40 both_healthy; then
  ok "router lists prefill and decode healthy ($(( $(now_ms) - t0 )) ms after start)"
else
  abort "workers not healthy within 40 s: $(workers_json "$ROUTER")"
fi
wj=$(workers_json "$ROUTER")
python3 - "$wj" "$PREFILL" "$DECODE" <<'PY' && ok "advertised addresses: prefill $PREFILL (from --listen=0.0.0.0 + --advertise_address), decode $DECODE" || bad "advertised addresses wrong: $wj"
import json, sys
ws = {w["role"]: w["address"] for w in json.loads(sys.argv[1])["workers"]}
print("  workers:", ws)
sys.exit(0 if ws.get("prefill") == sys.argv[2] and ws.get("decode") == sys.argv[3] else 1)
PY

# ---- the planes refuse what they must ----------------------------------------------------------
out=$(timeout 10 "$CLI" --insecure workers --router="$ROUTER" --timeout_ms=5000 2>&1) &&
  bad "plain text accepted on the router's public port: $out" || ok "router's public port refuses plain text"
out=$(timeout 10 "$CLI" --tls_ca="$CERTS/ca.pem" stats --worker="$DECODE" --timeout_ms=5000 2>&1) &&
  bad "decode worker answered a client without a certificate: $out" ||
  ok "decode worker refuses a client without a certificate ($(head -c 80 <<< "$out"))"
out=$(timeout 10 "$CLI" $(tls client) stats --worker="$DECODE" --timeout_ms=5000 2>&1)
[[ $? != 0 && "$out" == *PERMISSION_DENIED* ]] && ok "decode worker: a 'client' certificate gets PERMISSION_DENIED for Stats" ||
  bad "decode worker, 'client' certificate: $out"
no_tls=()
for f in router prefill decode; do grep -q 'mutual TLS with the cluster CA' "$T/$f.log" || no_tls+=("$f"); done
(( ${#no_tls[@]} == 0 )) && ok "router, prefill and decode run mutual TLS (their logs)" || bad "no 'mutual TLS' in the logs of ${no_tls[*]}"

# ---- P -> D tokens equal the mixed worker's; the decode worker loaded the KV ------------------
veth_tx() { cat "/sys/class/net/$(hveth d)/statistics/tx_bytes"; }   # bytes sent INTO decode
compare_all() {  # compare_all TAG: every prompt through the router vs the reference
  local tag=$1 p n_ok=0 msgs=()
  for p in "${PROMPTS[@]}"; do
    if ! gen_tokens "$ROUTER" "${!p}" 16 "$T/$tag.$p"; then
      msgs+=("$p: generate failed: $(cat "$T/$tag.$p.err" "$T/$tag.$p.json" 2>/dev/null | head -c 300)")
    elif [[ "$(cat "$T/$tag.$p")" != "$(cat "$T/ref.$p")" ]]; then
      msgs+=("$p: tokens $(cat "$T/$tag.$p") != mixed $(cat "$T/ref.$p")")
    else n_ok=$((n_ok + 1)); fi
  done
  if (( n_ok == ${#PROMPTS[@]} )); then ok "$tag: greedy tokens P->D == mixed for all ${#PROMPTS[@]} prompts (3, 11, 100, 1500 tokens)"
  else bad "$tag: ${msgs[*]}"; fi
}
long_kv() {  # long_kv TAG SEED: a fresh 1500-token prompt alone; KV bytes, load time, bandwidth, veth bytes
  local tag=$1 b0 u0 c0 f0 v0 b1 u1 c1 f1 v1
  b0=$(stats "$DECODE" kv_bytes_received) u0=$(stats "$DECODE" kv_load_micros)
  c0=$(stats "$DECODE" kv_loads_completed) f0=$(stats "$DECODE" kv_load_failures) v0=$(veth_tx)
  # A prompt of its own (no prefix-cache hit on the decode side: the whole KV moves).
  local prompt
  prompt=$(python3 -c "print(','.join(str(3 + (i * 97 + $2) % 250) for i in range(1500)))")
  if ! gen_tokens "$ROUTER" "$prompt" 2 "$T/$tag.long2"; then
    bad "$tag: long prompt failed: $(cat "$T/$tag.long2.err" 2>/dev/null | head -c 300)"; return
  fi
  b1=$(stats "$DECODE" kv_bytes_received) u1=$(stats "$DECODE" kv_load_micros)
  c1=$(stats "$DECODE" kv_loads_completed) f1=$(stats "$DECODE" kv_load_failures) v1=$(veth_tx)
  local db=$((b1 - b0)) du=$((u1 - u0)) dc=$((c1 - c0)) dv=$((v1 - v0))
  if (( db > 0 && dc == 1 && f1 == f0 )); then
    ok "$tag: 1500-token prompt: KV $db bytes loaded in $du us over the decode's link ($dv bytes crossed its veth) -> $(python3 -c "print('%.1f MB/s' % ($db / max($du, 1)))")"
  else bad "$tag: 1500-token prompt: kv_bytes_received +$db, kv_loads_completed +$dc, kv_load_failures $f0 -> $f1"; fi
  (( db > 0 && dv >= db )) && ok "$tag: the KV crossed the decode's veth ($dv >= $db bytes): not shared memory" ||
    bad "$tag: only $dv bytes crossed the decode's veth for $db KV bytes: the KV did not go over the link"
  LAST_KV_US=$du LAST_KV_BYTES=$db
}
compare_all pd
kvb=$(stats "$DECODE" kv_bytes_received) kvf=$(stats "$DECODE" kv_load_failures)
kvc=$(stats "$DECODE" kv_loads_completed)
if [[ -n "$kvb" && -n "$kvf" ]] && (( kvb > 0 && kvf == 0 && kvc >= ${#PROMPTS[@]} )); then
  ok "decode stats: kv_bytes_received=$kvb kv_loads_completed=$kvc kv_load_failures=$kvf (no recompute fallback)"
else
  bad "decode stats: kv_bytes_received=$kvb kv_loads_completed=$kvc kv_load_failures=$kvf ($(timeout 10 "${ADMIN_CLI[@]}" stats --worker="$DECODE" --json 2>&1 | head -c 600))"
fi
long_kv pd 1
fast_us=${LAST_KV_US:-0}

# ---- rate-limited link (tbf 20 mbit both ways) -----------------------------------------------
if tc qdisc add dev "$(hveth d)" root tbf rate 20mbit burst 32kbit latency 400ms &&
   ip netns exec "$(ns_of d)" tc qdisc add dev "$(nveth d)" root tbf rate 20mbit burst 32kbit latency 400ms; then
  compare_all tbf20mbit
  long_kv tbf20mbit 2
  # 20 mbit/s moves the 770 KB in ~0.31 s: the load must take at least half of that.
  min_us=$(( ${LAST_KV_BYTES:-0} * 8 / 20 / 2 ))
  (( ${LAST_KV_US:-0} >= min_us && min_us > 0 )) &&
    ok "tbf20mbit: the KV load is rate-limited ($fast_us -> $LAST_KV_US us; >= $min_us us expected)" ||
    bad "tbf20mbit: the KV load is not rate-limited ($fast_us -> ${LAST_KV_US:-?} us; >= $min_us us expected)"
  tc qdisc del dev "$(hveth d)" root 2>/dev/null
  ip netns exec "$(ns_of d)" tc qdisc del dev "$(nveth d)" root 2>/dev/null
else
  bad "tc qdisc tbf could not be added"
fi

# ---- link down mid-stream ---------------------------------------------------------------------
ntok() { tr -s ' \n' '\n\n' < "$1" | grep -c '^[0-9]'; }
stream_out=$T/stream.out stream_err=$T/stream.err
timeout 120 "${PUB_CLI[@]}" generate --router="$ROUTER" --prompt_ids="$P1" --max_tokens=2000 --ignore_eos \
  --timeout_ms=110000 > "$stream_out" 2> "$stream_err" &
cli_pid=$!
pids+=("$cli_pid")
# Unthrottled, 2000 tokens of the tiny model stream in ~0.2 s: the decode's outgoing traffic (the
# token stream to the router) is throttled so that the stream lasts long enough to cut the link
# in the middle of it. (The qdisc is removed again while the link is down.)
ip netns exec "$(ns_of d)" tc qdisc add dev "$(nveth d)" root tbf rate "${TANDEM_MULTIHOST_STREAM_RATE:-300kbit}" burst 32kbit latency 400ms
streaming() { (( $(ntok "$stream_out") >= 20 )) || ! kill -0 "$cli_pid" 2>/dev/null; }
wait_until 30 streaming
n_before=$(ntok "$stream_out")
if ! kill -0 "$cli_pid" 2>/dev/null; then
  wait "$cli_pid"; rc=$?
  ip netns exec "$(ns_of d)" tc qdisc del dev "$(nveth d)" root 2>/dev/null
  bad "link down: the stream ended before the link could be taken down (rc $rc, $n_before tokens): $(head -c 300 "$stream_err")"
else
  t_down=$(now_ms)
  ip link set "$(hveth d)" down
  say "decode link $(hveth d) DOWN after $n_before streamed tokens"
  ip netns exec "$(ns_of d)" tc qdisc del dev "$(nveth d)" root 2>/dev/null
  deadline=$((SECONDS + 45))
  while kill -0 "$cli_pid" 2>/dev/null && (( SECONDS < deadline )); do sleep 0.1; done
  t_err=$(( $(now_ms) - t_down ))
  if kill -0 "$cli_pid" 2>/dev/null; then
    bad "link down: the client still has no answer ${t_err} ms after the link went down (hangs; $(ntok "$stream_out") tokens)"
    kill "$cli_pid" 2>/dev/null
    wait "$cli_pid" 2>/dev/null
  else
    wait "$cli_pid"; rc=$?
    n_after=$(ntok "$stream_out")
    err=$(tr '\n' ' ' < "$stream_err" | head -c 400)
    if (( rc != 0 && t_err <= 30000 )); then
      ok "link down: client error after ${t_err} ms (rc $rc, $n_after tokens streamed): $err"
    elif (( rc != 0 )); then
      bad "link down: client error only after ${t_err} ms (> 30 s; rc $rc): $err"
    else
      bad "link down: the client got success (rc 0, $n_after/2000 tokens) ${t_err} ms after the link went down: $err"
    fi
  fi
  wj=$(workers_json "$ROUTER")
  say "  router's view with the link down: $(python3 -c "import json,sys; print([(w['worker_id'], w['healthy'], w['status']) for w in json.loads(sys.argv[1])['workers']])" "$wj" 2>&1)"
  t_up=$(now_ms)
  ip link set "$(hveth d)" up
  say "decode link UP"
  serves() { both_healthy && gen_tokens "$ROUTER" "$P2" 16 "$T/after_up.P2"; }
  if wait_until 60 serves; then
    t_srv=$(( $(now_ms) - t_up ))
    [[ "$(cat "$T/after_up.P2")" == "$(cat "$T/ref.P2")" ]] &&
      ok "link up: decode healthy again and a new request succeeds (same tokens) ${t_srv} ms after the link came up" ||
      bad "link up: request succeeds but tokens differ: $(cat "$T/after_up.P2") != $(cat "$T/ref.P2")"
  else
    bad "link up: no successful request within 60 s: $(workers_json "$ROUTER") $(cat "$T/after_up.P2.err" 2>/dev/null | head -c 300)"
  fi
  kvf2=$(stats "$DECODE" kv_load_failures)
  say "  decode after recovery: kv_load_failures=$kvf2 kv_loads_completed=$(stats "$DECODE" kv_loads_completed)"
fi
kill -0 "$router_pid" 2>/dev/null && kill -0 "$decode_pid" 2>/dev/null && ok "router and decode worker still running" ||
  bad "a process died: router $(kill -0 "$router_pid" 2>/dev/null && echo up || echo DEAD), decode $(kill -0 "$decode_pid" 2>/dev/null && echo up || echo DEAD)"

# ---- teardown ---------------------------------------------------------------------------------
(( failed )) && show_logs
cleanup
left=()
ip netns list 2>/dev/null | grep -q "^tmh${sfx}" && left+=("netns tmh${sfx}*")
ip link show "tmhbr$sfx" > /dev/null 2>&1 && left+=("bridge tmhbr$sfx")
(( ${#left[@]} == 0 )) && ok "cleanup: processes, namespaces, veths, bridge removed" || bad "left after cleanup: ${left[*]}"
finish
