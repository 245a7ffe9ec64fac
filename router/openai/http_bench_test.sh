#!/usr/bin/env bash
# http_bench as a test (small): 300 concurrent HTTP chat streams, then 300 gRPC Generate streams,
# against fake workers in a child process; every stream must complete and the router process
# must stay at <= 64 threads (requests in flight must not cost a thread each). The full run
# (2000 streams) is in BENCHMARKS.md.
#
#   http_bench_test.sh HTTP_BENCH
set -euo pipefail
bench=$1
model="$TEST_TMPDIR/model"
mkdir -p "$model"
cp tokenizer/testdata/qwen2/tokenizer.json "$model/tokenizer.json"
cp tokenizer/chat/testdata/configs/qwen2.5_tokenizer_config.json "$model/tokenizer_config.json"
echo '{"max_position_embeddings": 4096}' > "$model/config.json"
exec "$bench" --streams=300 --tokens=8 --sequential=5 --model_dir="$model" --max_threads=64
