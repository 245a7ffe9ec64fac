#!/usr/bin/env bash
# The runs that need several GPUs of one host, in one call (issue 16's NCCL checks; the
# multi-GPU issue's correctness runs): every NCCL-backed GPU test, the serving smoke test with
# its 2-GPU (P -> D over NCCL) and >= 3-GPU (heterogeneous TP over NCCL) sections, the TP and DCP
# CUDA golden checks with one GPU per rank (collectives over NCCL), and the NCCL re-shard
# benchmark. Each part has its own time limit so one hang cannot eat the others.
#
#   tests/gpu/multi_gpu_suite.sh BUNDLE_DIR LOG_DIR [PARTS]
#
# PARTS: a comma list of unit,serve,tp,dcp,bench (default: all). BUNDLE_DIR: tests/gpu/bundle.sh
# with tool//runtime:tandem_worker tool//router:tandem_router tool//router:tandem_cli
# tool//runtime:generate tool//runtime/model:make_dummy_model. Run from the repository root.
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0), as the shared machines require.
set -uo pipefail
B=$(cd "${1:?bundle dir}" && pwd)
LOG=${2:?log dir}
PARTS=${3:-unit,serve,tp,dcp,bench}
mkdir -p "$LOG"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
D=$(dirname "${BASH_SOURCE[0]}")
nvidia-smi -L | tee "$LOG/gpus.txt"
nvidia-smi topo -m > "$LOG/topo.txt" 2>&1
NGPU=$(nvidia-smi -L | grep -c '^GPU')
# 4-rank golden cases: one GPU per rank where there are 4, else the ranks share (over Gloo).
if [[ $NGPU -lt 4 ]]; then export TP4_FLAGS=--tp_share_device; fi
want() { [[ ",$PARTS," == *",$1,"* ]]; }
part() {  # NAME SECONDS COMMAND...: runs it under a time limit, keeps its summary line
  local name=$1 secs=$2; shift 2
  local t0=$SECONDS
  timeout -k 5 "$secs" "$@" > "$LOG/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc in $((SECONDS - t0)) s: $(grep -E '^[0-9]+ passed' "$LOG/$name.log" | tail -1)"
}
if want unit; then
  # NCCL agent (two processes, one GPU each), device communicators, DCP exchange.
  TANDEM_BUNDLE_SKIP_BENCH=1 part unit 150 "$B/run.sh" "$LOG/unit" \
    'comm/|kvtransfer/nccl/|runtime/cuda/cuda_engine'
fi
want serve && part serve 150 "$D/serve_cuda_smoke.sh" "$B" "$LOG/serve"
# Rank r on GPU r: the group's collectives over NCCL (the logs say which backend each run used).
want tp && SHARE="" part tp 90 "$D/tp_cuda_golden.sh" "$B" "$LOG/tp"
want dcp && SHARE="" part dcp 90 "$D/dcp_cuda_golden.sh" "$B" "$LOG/dcp"
for d in tp dcp; do
  [[ -d $LOG/$d ]] && echo "   $d runs whose log names NCCL: $(grep -lis nccl "$LOG/$d"/*.err | wc -l)"
done
if want bench; then
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH part nccl_bench 120 \
    "$B/bin/kvtransfer/nccl/nccl_bench" --quick --reshard=2,4
  grep -E "NCCL INFO (Channel|Connected|comm .* nRanks)" "$LOG/nccl_bench.log" | head -8
fi
exit 0
