#!/usr/bin/env bash
# The README's main-job command: from a fresh Debian 12 machine to a streamed generation through
# router -> prefill worker -> decode worker, all on this machine's CPU.
#
#   deploy/quickstart.sh [BAZEL_FLAGS...]
#
# Installs the dependencies, builds the four binaries the demo runs (CPU only: no CUDA kernel,
# no test; `bazel build //...` builds the rest), writes a ~100M-parameter random-weight Llama in
# Hugging Face format (no download), brings up 1 router + 1 prefill + 1 decode worker on
# localhost (deploy/local/up.sh; KV moves from P to D over UCX), streams one request through the
# router with tandem_cli, prints the same request as JSON with TTFT / inter-token latency, and
# stops the cluster again.
# Set TANDEM_KEEP_UP=1 to leave the cluster running (stop it with deploy/local/down.sh out/local).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
deploy/install_deps.sh
# Exactly what the demo runs (deploy/quickstart_test.sh checks this list against the script and
# up.sh). --config=cpu: a CPU demo, so no CUDA kernel is compiled even where a toolkit is installed.
DEMO_TARGETS=(//runtime:tandem_worker //router:tandem_router //router:tandem_cli
  //runtime/model:make_dummy_model)
BAZEL_FLAGS=(-c opt --config=cpu "$@")
build_start=$SECONDS
bazel build --noshow_progress "${BAZEL_FLAGS[@]}" "${DEMO_TARGETS[@]}"
echo "quickstart: built ${#DEMO_TARGETS[@]} binaries in $((SECONDS - build_start)) s"
BIN=$(bazel info "${BAZEL_FLAGS[@]}" bazel-bin 2>/dev/null)
MODEL=${TANDEM_DEMO_MODEL:-$ROOT/out/demo-llama-100m}
RUN_DIR=$ROOT/out/local
if [[ ! -f $MODEL/config.json ]]; then
  echo "quickstart: writing a ~100M-parameter random-weight Llama to $MODEL"
  "$BIN/runtime/model/make_dummy_model" --config=llama-100m --out="$MODEL" --seed=1
fi
deploy/local/down.sh "$RUN_DIR" >/dev/null 2>&1 || true
echo "quickstart: starting router + 1 prefill + 1 decode worker (CPU backend)"
UP=$(deploy/local/up.sh --prefill=1 --decode=1 --backend=cpu --model="$MODEL" \
  --run_dir="$RUN_DIR" --bin_dir="$BIN")
echo "$UP"
ROUTER=$(sed -n 's/^router: //p' <<<"$UP")
# TLS with an API key (up.sh made the CA, the certificates and the key under $RUN_DIR/certs).
TLS_CA=$(sed -n 's/^tls_ca: //p' <<<"$UP")
TANDEM_API_KEY=$(cat "$(sed -n 's/^api_key_file: //p' <<<"$UP")")
export TANDEM_API_KEY
cli() { "$BIN/router/tandem_cli" "$@" --tls_ca="$TLS_CA"; }
if [[ -z ${TANDEM_KEEP_UP:-} ]]; then
  trap 'deploy/local/down.sh "$RUN_DIR" >/dev/null' EXIT
fi
# Listing workers (addresses, epochs) is the operator's: the admin key; the rest the client key.
cli workers --router="$ROUTER" --api_key="$(cat "$(sed -n 's/^admin_api_key_file: //p' <<<"$UP")")"
echo "quickstart: streaming 24 tokens (greedy) through $ROUTER"
cli generate --router="$ROUTER" --prompt_ids=1,450,4996,17354,29871 \
  --max_tokens=24 --ignore_eos
echo "quickstart: the same request as JSON (first token from P, the rest from D)"
cli generate --router="$ROUTER" --prompt_ids=1,450,4996,17354,29871 \
  --max_tokens=24 --ignore_eos --json

# Text in, text out: the OpenAI-compatible HTTP API on the router, over a model directory with a
# real tokenizer and chat template (Qwen2.5's, from PyPI) and random weights (words, not sense).
TEXT_MODEL=$ROOT/out/demo-text
TEXT_RUN=$ROOT/out/local-text
deploy/local/make_text_model.sh "$TEXT_MODEL"
deploy/local/down.sh "$TEXT_RUN" >/dev/null 2>&1 || true
UP=$(deploy/local/up.sh --prefill=1 --decode=1 --load_format=dummy --dummy_config="$TEXT_MODEL" \
  --http_port=0 --http_model="$TEXT_MODEL" --run_dir="$TEXT_RUN" --bin_dir="$BIN")
echo "$UP"
HTTP=$(sed -n 's/^http: //p' <<<"$UP")  # https://HOST:PORT (the router's certificate)
HTTP_CA=$(sed -n 's/^tls_ca: //p' <<<"$UP")
HTTP_KEY=$(cat "$(sed -n 's/^api_key_file: //p' <<<"$UP")")
if [[ -z ${TANDEM_KEEP_UP:-} ]]; then
  trap 'deploy/local/down.sh "$RUN_DIR" >/dev/null; deploy/local/down.sh "$TEXT_RUN" >/dev/null' EXIT
fi
echo "quickstart: streaming a chat completion as text from $HTTP/v1/chat/completions"
curl -sN --cacert "$HTTP_CA" "$HTTP/v1/chat/completions" -H 'Content-Type: application/json' \
  -H "Authorization: Bearer $HTTP_KEY" -d \
  '{"model": "demo-text", "stream": true, "max_tokens": 24,
    "messages": [{"role": "user", "content": "Tell me about Paris."}]}' |
  python3 -c '
import json, sys
for line in sys.stdin:
    if line.startswith("data: {"):
        for c in json.loads(line[6:])["choices"]:
            sys.stdout.write(c["delta"].get("content", ""))
            sys.stdout.flush()
print()'
generate="bazel build ${BAZEL_FLAGS[*]} //runtime:generate && $BIN/runtime/generate"
echo "quickstart: done. Single-process engine: $generate --model=$MODEL --prompt_ids=1,2,3"
echo "quickstart: the HTTP API works with the openai client: base_url=$HTTP/v1, model demo-text," \
  "api_key=$HTTP_KEY, http_client=openai.DefaultHttpxClient(verify=ssl.create_default_context(" \
  "cafile='$HTTP_CA'))"
