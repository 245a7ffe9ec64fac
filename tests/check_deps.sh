#!/usr/bin/env bash
# The cores have no dependency path to gRPC (gRPC types only at the edges, ARCHITECTURE.md):
# for each target below, `bazel query somepath(target, grpc++)` must be empty; the CPU and CUDA
# backends (runtime/cpu/, runtime/cuda/) do not reach each other; no library of comm/ reaches
# kernels/. Run by tests/run.sh (a failing path is printed).
#
#   tests/check_deps.sh [BAZEL_FLAGS...]
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BAZEL=${BAZEL:-bazel}
CORES=(
  //runtime/worker:worker        # the worker core (worker.h): its gRPC edge is worker_service
  //runtime/worker:engine_loop
  //runtime/engine:engine
  //kvtransfer:connector
  //kvtransfer:pull_connector
  //kvtransfer:kv_handle
  //kvtransfer:lease_table
  //kvtransfer:source_leases     # the KV source's lease decisions: its gRPC edge is kv_transfer_service
  # the router core (router/core/): its gRPC edge is router/grpc/
  //router/core:validation
  //router/core:prefix_index
  //router/core:routing_policy
  //router/core:worker_client
  //router/core:worker_registry
  //router/core:request_table
  //router/core:router_metrics
  //router/core:executor
  //router/core:orchestrator
  //router/testing:fake_worker_client
  //router/testing:manual_clock
)
rc=0
for t in "${CORES[@]}"; do
  path=$("$BAZEL" query --noshow_progress "somepath($t, \"@system//:grpc++\")" 2>/dev/null)
  if [[ -n $path ]]; then
    echo "check_deps: $t reaches gRPC:" >&2
    sed 's/^/  /' <<<"$path" >&2
    rc=1
  fi
done
[[ $rc -eq 0 ]] && echo "check_deps: ${#CORES[@]} core targets have no path to gRPC"
# The two backends are siblings (issue 36): no library of runtime/cpu/ reaches runtime/cuda/ and
# none of runtime/cuda/ reaches runtime/cpu/ (tests may use both, e.g. through backend_factory;
# so may their testonly support libraries, e.g. runtime/cuda:cuda_engine_test_util running an
# Engine).
SIBLINGS=(
  "//runtime/cpu/..." "//runtime/cuda/..."
  "//runtime/cuda/..." "//runtime/cpu/..."
)
for ((i = 0; i < ${#SIBLINGS[@]}; i += 2)); do
  from=${SIBLINGS[i]} to=${SIBLINGS[i + 1]}
  libs="kind(\"cc_library\", $from) except attr(\"testonly\", 1, $from)"
  path=$("$BAZEL" query --noshow_progress "somepath($libs, $to)" 2>/dev/null)
  if [[ -n $path ]]; then
    echo "check_deps: $from reaches $to:" >&2
    sed 's/^/  /' <<<"$path" >&2
    rc=1
  fi
done
[[ $rc -eq 0 ]] && echo "check_deps: runtime/cpu and runtime/cuda libraries do not reach each other"
# comm/ sits below kernels/ (issue 36): no library of comm/ reaches kernels/; the custom
# all-reduce's fused RMSNorm epilogue is comm's own code, and comm's tests may use the kernels
# as references.
path=$("$BAZEL" query --noshow_progress "somepath(kind(\"cc_library\", //comm/...), //kernels/...)" 2>/dev/null)
if [[ -n $path ]]; then
  echo "check_deps: a library of //comm/... reaches //kernels/...:" >&2
  sed 's/^/  /' <<<"$path" >&2
  rc=1
else
  echo "check_deps: no library of comm/ reaches kernels/"
fi
exit $rc
