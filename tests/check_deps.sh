#!/usr/bin/env bash
# The cores have no dependency path to gRPC (gRPC types only at the edges, ARCHITECTURE.md):
# for each target below, `bazel query somepath(target, grpc++)` must be empty. Run by
# tests/run.sh (a failing path is printed).
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
exit $rc
