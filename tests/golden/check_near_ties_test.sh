#!/usr/bin/env bash
# Runs check_near_ties.py on the MLA fixtures beside it (Bazel runfiles keep the tests/golden/ layout).
set -euo pipefail
CHECK=$1
exec python3 "$CHECK" "$(dirname "$CHECK")/fixtures_mla"
