#!/usr/bin/env bash
# Installs exactly the Debian 12 packages Tandem's build and tests need. Idempotent: packages
# already present are not touched, and a second run installs nothing. Needs root (or sudo)
# only when something is missing. Reports whether a CUDA toolkit was found.
#
#   deploy/install_deps.sh [--check]     --check: report what is missing, install nothing
set -euo pipefail

PACKAGES=(
  bazel-bootstrap          # Bazel 4.2.3, works offline with the in-repo rule stand-ins
  default-jdk-headless     # Bazel's Java runtime
  g++ pkg-config python3   # compiler; link flags for @system; tests/run.sh's result parser
  protobuf-compiler libprotobuf-dev
  protobuf-compiler-grpc libgrpc++-dev
  libabsl-dev
  libgtest-dev libgmock-dev
  libucx-dev ucx-utils     # UCX transfer agent; ucx_perftest for the link-limit benchmark
  libgloo-dev              # CPU collectives
  libgoogle-glog-dev libgflags-dev
  nlohmann-json3-dev       # config.json and safetensors headers
  libssl-dev               # SHA-256 (prefix-cache block hashes)
  libpcre2-dev libicu-dev  # tokenizer: pre-tokenizer regexes, Unicode normalization
  libsentencepiece-dev     # tokenizer: SentencePiece .model files
  libboost-dev             # Boost.Beast (header-only): the HTTP server (common/http)
  clang-format             # tests/check_format.sh
  iproute2                 # ip, tc: real packet drops in a test's own network namespace (partition_test)
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [[ ${1:-} == --check ]]; then
  if [[ ${#missing[@]} -eq 0 ]]; then echo "install_deps: all ${#PACKAGES[@]} packages present"
  else echo "install_deps: missing: ${missing[*]}"; exit 1; fi
elif [[ ${#missing[@]} -eq 0 ]]; then
  echo "install_deps: all ${#PACKAGES[@]} packages already installed"
else
  echo "install_deps: installing ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
  echo "install_deps: installed ${#missing[@]} packages"
fi

cuda_home=${CUDA_HOME:-/usr/local/cuda}
if [[ -x $cuda_home/bin/nvcc ]]; then
  echo "install_deps: CUDA toolkit found at $cuda_home ($("$cuda_home/bin/nvcc" --version | grep -o 'release [0-9.]*'))" \
       "-> GPU targets are built (they run only where a GPU is)"
else
  echo "install_deps: no CUDA toolkit at $cuda_home -> CPU-only build (set CUDA_HOME to use one)"
fi
