#!/usr/bin/env bash
# Generates a Tandem cluster CA and one certificate per daemon role with openssl.
#
#   deploy/certs/make_certs.sh OUT_DIR [--hosts=HOST,...] [--days=825]
#                              [--cert=NAME:ROLE ...] [--worker=ID:ROLE ...] [--api_key]
#
# OUT_DIR receives (keys mode 0600):
#   ca.pem ca.key                  the cluster CA (EC P-256); every internal peer trusts it
#   router.{pem,key}               role router   (serves the public + internal ports, calls workers)
#   prefill.{pem,key} decode.{pem,key} mixed.{pem,key}   worker roles
#   admin.{pem,key}                role admin    (tandem_cli: ListWorkers, worker Stats)
#   client.{pem,key}               role client   (a public client, when the public port asks for
#                                                 client certificates)
#   NAME.{pem,key}                 one more per --cert=NAME:ROLE (e.g. --cert=prefill-1:prefill)
#   ID.{pem,key}                   one per --worker=ID:ROLE: a worker daemon's own certificate,
#                                  naming the worker (--worker_id=ID) as well as its role. Worker
#                                  daemons with TLS need one (a KV lease is bound to the decode
#                                  worker it was handed to, which proves who it is with it).
#   api_keys                       with --api_key: the router's --api_key_file, two random keys:
#                                  "client" (generate, health, abort) and "operator" (admin: also
#                                  ListWorkers, which shows worker addresses and epochs)
#   api_key                        the bare client key: what users get (--api_key / TANDEM_API_KEY)
#   admin_api_key                  the bare operator key: keep it to operators (tandem_cli workers)
#
# prefill/decode/mixed.pem are role-only: they pass the internal port's role table but claim no
# worker id (the router registers and heartbeats a worker only with a certificate naming it:
# --worker), and use no KV lease.
#
# The role is encoded twice, as common/security reads it: the URI SAN
# spiffe://tandem/role/ROLE (authoritative; spiffe://tandem/role/ROLE/worker/ID for --worker)
# and the subject's OU. SANs of every leaf: DNS localhost, IP 127.0.0.1, IP ::1, plus each
# --hosts entry (IP or DNS name). Leaves are valid for both serverAuth and clientAuth (daemons
# are servers on one plane and clients on another).
#
# Idempotent: an existing CA is kept; an existing leaf is kept when it verifies against the CA,
# has the requested role and hosts (a stamp file records them) and is valid for another 30 days;
# otherwise it is re-issued. Deleting OUT_DIR starts over.
set -euo pipefail

usage() { sed -n '2,36p' "$0"; }
[[ $# -ge 1 ]] || { usage >&2; exit 2; }
[[ "$1" == -h || "$1" == --help ]] && { usage; exit 0; }
out="$1"; shift
hosts="" days=825 api_key=0
certs=(router:router prefill:prefill decode:decode mixed:mixed admin:admin client:client)
while [[ $# -gt 0 ]]; do
  case "$1" in
    --hosts=*) hosts="${1#*=}" ;;
    --days=*) days="${1#*=}" ;;
    --cert=*) certs+=("${1#*=}") ;;
    --worker=*) certs+=("${1#*=}:worker") ;;
    --api_key) api_key=1 ;;
    *) echo "make_certs.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
command -v openssl >/dev/null || { echo "make_certs.sh: openssl not found" >&2; exit 1; }
[[ "$days" =~ ^[0-9]+$ && "$days" -ge 31 ]] || { echo "make_certs.sh: --days must be >= 31" >&2; exit 2; }

mkdir -p "$out"
umask 077
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

if [[ ! -s "$out/ca.pem" || ! -s "$out/ca.key" ]]; then
  openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -sha256 \
    -keyout "$out/ca.key" -out "$out/ca.pem" -days "$((days + 365))" \
    -subj "/O=tandem/CN=tandem cluster CA" \
    -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -addext "subjectKeyIdentifier=hash" 2>/dev/null
  chmod 644 "$out/ca.pem"
  echo "make_certs.sh: new CA $out/ca.pem"
fi

san="DNS:localhost,IP:127.0.0.1,IP:0:0:0:0:0:0:0:1"
IFS=',' read -r -a host_list <<< "$hosts"
for h in ${host_list[@]+"${host_list[@]}"}; do
  [[ -n "$h" ]] || continue
  if [[ "$h" =~ ^[0-9.]+$ || "$h" == *:* ]]; then san+=",IP:$h"; else san+=",DNS:$h"; fi
done

valid_roles=" router prefill decode mixed admin client "
issue() {  # issue NAME ROLE [worker]: with "worker", the URI also names worker NAME
  local name="$1" role="$2" stamp="$out/$1.stamp" uri="spiffe://tandem/role/$2"
  [[ "${3:-}" == worker ]] && uri+="/worker/$name"
  local want="role=$role san=URI:$uri,$san"
  if [[ -s "$out/$name.pem" && -s "$out/$name.key" && -s "$stamp" && "$(cat "$stamp")" == "$want" ]] &&
     openssl verify -CAfile "$out/ca.pem" "$out/$name.pem" >/dev/null 2>&1 &&
     openssl x509 -in "$out/$name.pem" -noout -checkend $((30 * 86400)) >/dev/null 2>&1; then
    return 0
  fi
  cat > "$tmp/$name.ext" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=URI:$uri,$san
authorityKeyIdentifier=keyid
subjectKeyIdentifier=hash
EXT
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -sha256 \
    -keyout "$out/$name.key" -out "$tmp/$name.csr" \
    -subj "/O=tandem/OU=$role/CN=$name" 2>/dev/null
  openssl x509 -req -in "$tmp/$name.csr" -CA "$out/ca.pem" -CAkey "$out/ca.key" \
    -set_serial "0x$(openssl rand -hex 16)" -days "$days" -sha256 \
    -extfile "$tmp/$name.ext" -out "$out/$name.pem" 2>/dev/null
  chmod 644 "$out/$name.pem"
  echo "$want" > "$stamp"
  echo "make_certs.sh: issued $out/$name.pem (role $role)"
}

for spec in "${certs[@]}"; do
  name="${spec%%:*}" role="${spec#*:}" kind=""
  [[ "$role" == *:worker ]] && { role="${role%:worker}"; kind=worker; }
  [[ "$name" =~ ^[A-Za-z0-9._-]+$ && "$name" != ca && ${#name} -le 128 ]] ||
    { echo "make_certs.sh: bad certificate name '$name'" >&2; exit 2; }
  [[ "$valid_roles" == *" $role "* ]] ||
    { echo "make_certs.sh: role '$role' is not one of:$valid_roles" >&2; exit 2; }
  [[ -z "$kind" || " prefill decode mixed " == *" $role "* ]] ||
    { echo "make_certs.sh: --worker=$name:$role: workers are prefill, decode or mixed" >&2; exit 2; }
  issue "$name" "$role" $kind
done

# A directory from before the client/operator split (one admin key, handed to every client)
# gets both keys anew: the old key is dropped.
if [[ "$api_key" == 1 && ( ! -s "$out/api_keys" || ! -s "$out/admin_api_key" ) ]]; then
  client="tk-$(openssl rand -hex 24)" admin="tk-$(openssl rand -hex 24)"
  printf '# key name [admin]\n%s client\n%s operator admin\n' "$client" "$admin" > "$out/api_keys"
  printf '%s\n' "$client" > "$out/api_key"
  printf '%s\n' "$admin" > "$out/admin_api_key"
  echo "make_certs.sh: new API keys: $out/api_key (clients), $out/admin_api_key (operators)"
fi
