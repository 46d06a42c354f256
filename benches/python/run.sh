#!/usr/bin/env bash
# One Python process on hasync's PutStream next to Redis SET + WAIT 1 from 16 Python processes
# (docs/benchmarks.md). Python grpcio stubs generated from proto/ and redis-py in a venv (PyPI),
# a release build of hasync, Debian's redis-server for the comparison. Not run by CI.
# Usage: bash benches/python/run.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=.ci/venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check 'grpcio>=1.60' 'grpcio-tools>=1.60' 'redis>=5'
stubs=$(mktemp -d)
trap 'rm -rf "$stubs"' EXIT
"$venv/bin/python" -m grpc_tools.protoc -Iproto --python_out="$stubs" --grpc_python_out="$stubs" \
  proto/hasync/v1/*.proto
touch "$stubs/hasync/__init__.py" "$stubs/hasync/v1/__init__.py"
cargo build --release --locked --bin hasync
"$venv/bin/python" benches/python/stream_vs_redis.py "${CARGO_TARGET_DIR:-target}/release/hasync" "$stubs" "${1:-3}"
