#!/usr/bin/env bash
# The README's main-job command: from a fresh Debian 12 machine to a built Tandem.
#
#   deploy/quickstart.sh [BAZEL_FLAGS...]
#
# Today (Foundation stage) it installs the dependencies, builds every target (CUDA objects too
# where a toolkit is installed) and lists the binaries. The serving issue extends it to make a
# dummy model, bring up router + 1 prefill + 1 decode worker on the CPU backend and stream a
# demo request through them.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
deploy/install_deps.sh
bazel build --noshow_progress "$@" //...
echo "quickstart: built. Binaries:"
bazel cquery --noshow_progress "$@" 'kind("cc_binary", //...)' 2>/dev/null | awk '{print "  " $1}'
echo "quickstart: GPU bundle (for a machine with an NVIDIA driver): tests/gpu/bundle.sh OUT_DIR"
