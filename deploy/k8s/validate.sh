#!/usr/bin/env bash
# Validates the Kubernetes manifests offline (no cluster): for every overlay,
#   1. renders it with `kubectl kustomize` (target: Debian's kubernetes-client 1.20, kustomize
#      v2.0.3);
#   2. validates the output against the Kubernetes JSON schemas (PyPI kubernetes-validate,
#      strict: unknown fields fail; a kind without a schema fails too);
#   3. cross-checks it against the real binaries (check_manifests.py: every container's flags
#      parse, ports, probes, Services, drain vs terminationGracePeriodSeconds, GPUs vs --tp) and
#      against the Secrets make_secrets.sh writes for its namespace (schema-validated too): TLS
#      flags point into read-only Secret mounts, certificate role / key / CA / SANs, no --insecure,
#      the router's internal port only behind a ClusterIP Service;
# then checks the Dockerfile's COPY sources against a build (check_manifests.py dockerfile).
#
#   deploy/k8s/validate.sh [BIN_DIR]      BIN_DIR: the Bazel output with runtime/tandem_worker,
#                                         router/tandem_router, router/tandem_cli (bazel-bin)
# Environment (missing tools are installed there, as the current user, unless
# TANDEM_K8S_NO_INSTALL=1, where the script fails saying how to install them):
#   KUBECTL              kubectl to render with (default: Debian 12's kubernetes-client 1.20
#                        unpacked under $HOME/.cache/tandem/kubernetes-client, else kubectl on
#                        PATH). Unpacked, not installed: its /usr/bin/kubectl conflicts with
#                        other kubectl packages (e.g. Google Cloud SDK's).
#   TANDEM_PYENV         venv holding kubernetes-validate + PyYAML
#                        (default: $HOME/.cache/tandem/k8s-venv)
#   K8S_SCHEMA_VERSIONS  schema versions (default "1.21.0 1.24.0": 1.21 is the first with
#                        policy/v1 PodDisruptionBudget; 1.24 the newest kubernetes-validate
#                        1.24.1 ships)
# Ends with "N passed, N failed"; exits non-zero on any failure.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=${TANDEM_REPO_ROOT:-$(cd "$HERE/../.." && pwd)}
BIN_DIR=$(cd "${1:-$ROOT/bazel-bin}" && pwd)
PYENV=${TANDEM_PYENV:-$HOME/.cache/tandem/k8s-venv}
KV_PIN=kubernetes-validate==1.24.1
SCHEMAS=${K8S_SCHEMA_VERSIONS:-1.21.0 1.24.0}

missing() {
  echo "validate.sh: $1 is missing. Install it with: $2" >&2
  echo "0 passed, 1 failed"
  exit 1
}

# kubectl (kustomize built in).
KC_DIR=$HOME/.cache/tandem/kubernetes-client
if [[ -z "${KUBECTL:-}" ]]; then
  if [[ -x "$KC_DIR/usr/bin/kubectl" ]]; then KUBECTL=$KC_DIR/usr/bin/kubectl
  else KUBECTL=$(command -v kubectl || true); fi
fi
if [[ -z "$KUBECTL" ]]; then
  fetch="mkdir -p $KC_DIR && cd $KC_DIR && apt-get download kubernetes-client && dpkg -x kubernetes-client_*.deb ."
  [[ ${TANDEM_K8S_NO_INSTALL:-0} == 1 ]] && missing kubectl "$fetch"
  (eval "$fetch") >/dev/null 2>&1 || missing kubectl "$fetch"
  KUBECTL=$KC_DIR/usr/bin/kubectl
fi
# kubernetes-validate (+ PyYAML) in a venv.
if [[ ! -x "$PYENV/bin/kubernetes-validate" ]]; then
  [[ ${TANDEM_K8S_NO_INSTALL:-0} == 1 ]] && missing "$PYENV/bin/kubernetes-validate" \
    "python3 -m venv $PYENV && $PYENV/bin/pip install $KV_PIN"
  python3 -m venv "$PYENV"
  "$PYENV/bin/pip" install -q "$KV_PIN"
fi
for b in runtime/tandem_worker router/tandem_router router/tandem_cli; do
  [[ -x "$BIN_DIR/$b" ]] || missing "$BIN_DIR/$b" \
    "bazel build //runtime:tandem_worker //router:tandem_router //router:tandem_cli"
done
kc_version=$("$KUBECTL" version --client --short 2>/dev/null || "$KUBECTL" version --client | head -1)
echo "kubectl: $KUBECTL: $kc_version"
[[ $kc_version == *v1.20.* ]] ||
  echo "validate.sh: warning: not kubectl 1.20 (kustomize v2.0.3), the oldest the manifests target"
echo "kubernetes-validate: $("$PYENV/bin/kubernetes-validate" --version), schemas: $SCHEMAS"

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
passed=0 failed=0
pass() { passed=$((passed + 1)); echo "PASS $*"; }
fail() { failed=$((failed + 1)); echo "FAIL $*"; }
# Runs check_manifests.py and counts its PASS / FAIL lines.
cross_check() {
  local out
  out=$("$PYENV/bin/python" "$HERE/check_manifests.py" "$@" 2>&1) || true
  echo "$out"
  passed=$((passed + $(grep -c '^PASS ' <<<"$out" || true)))
  failed=$((failed + $(grep -c '^FAIL ' <<<"$out" || true)))
  if ! grep -q '^\(PASS\|FAIL\) ' <<<"$out"; then failed=$((failed + 1)); fi
}

# The Secrets, as a user makes them (make_secrets.sh; one CA shared by all namespaces); a second
# run must change nothing (the CA and the leaves are kept).
secrets_for() {  # secrets_for NAMESPACE: make_secrets.sh's secrets.yaml for it in $secrets_yaml
  local d="$TMP/secrets/$1"
  secrets_yaml=""
  if [[ ! -s "$d/secrets.yaml" ]]; then
    if ! "$HERE/make_secrets.sh" "$d" --namespace="$1" --certs_dir="$TMP/secrets/certs" > "$TMP/ms.log" 2>&1; then
      fail "make_secrets.sh --namespace=$1: $(cat "$TMP/ms.log")"; return 1
    fi
    cp "$d/secrets.yaml" "$TMP/first.yaml"
    "$HERE/make_secrets.sh" "$d" --namespace="$1" --certs_dir="$TMP/secrets/certs" > /dev/null 2>&1 &&
      cmp -s "$d/secrets.yaml" "$TMP/first.yaml" && pass "make_secrets.sh --namespace=$1: rerun changes nothing" ||
      fail "make_secrets.sh --namespace=$1: a second run changed secrets.yaml"
    for v in $SCHEMAS; do
      if "$PYENV/bin/kubernetes-validate" --strict --quiet -k "$v" "$d/secrets.yaml" > "$TMP/kv" 2>&1 &&
         ! grep -q . "$TMP/kv"; then
        pass "make_secrets.sh Secrets ($1): schema $v"
      else
        fail "make_secrets.sh Secrets ($1): schema $v: $(cat "$TMP/kv")"
      fi
    done
  fi
  secrets_yaml=$d/secrets.yaml
}

rendered=()
for dir in "$HERE"/overlays/*/; do
  name=$(basename "$dir")
  echo "=== overlay $name"
  out="$TMP/$name.yaml"
  if ! "$KUBECTL" kustomize "$dir" > "$out" 2> "$TMP/err"; then
    fail "$name: kubectl kustomize: $(cat "$TMP/err")"
    continue
  fi
  pass "$name: rendered ($(grep -c '^kind:' "$out") objects)"
  rendered+=("$out")
  for v in $SCHEMAS; do
    # Strict schemas; "Couldn't find schema" is only a warning there, so it fails here.
    if "$PYENV/bin/kubernetes-validate" --strict --quiet -k "$v" "$out" > "$TMP/kv" 2>&1 &&
       ! grep -q . "$TMP/kv"; then
      pass "$name: schema $v"
    else
      fail "$name: schema $v: $(cat "$TMP/kv")"
    fi
  done
  ns=$(sed -n 's/^  namespace: //p' "$out" | sort -u)
  if [[ $(wc -l <<< "$ns") != 1 || -z "$ns" ]]; then
    fail "$name: one namespace expected, got: $(echo $ns)"
    cross_check manifests "$out" "$BIN_DIR"
  else
    secrets_for "$ns" || true
    cross_check manifests "$out" "$BIN_DIR" ${secrets_yaml:+"$secrets_yaml"}
  fi
done
[[ ${#rendered[@]} -gt 0 ]] || fail "no overlay rendered"

echo "=== Dockerfile"
cross_check dockerfile "$HERE/Dockerfile" "$ROOT" "$BIN_DIR" ${rendered[@]+"${rendered[@]}"}

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
