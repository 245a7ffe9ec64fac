#!/usr/bin/env bash
# Runs check_fixtures.py on the fixtures beside it (Bazel runfiles keep the tests/golden/ layout).
set -euo pipefail
CHECK=$1
exec python3 "$CHECK" "$(dirname "$CHECK")/fixtures"
