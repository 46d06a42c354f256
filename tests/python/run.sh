#!/usr/bin/env bash
# The independent-client check: Python grpcio stubs generated from proto/ in a venv, against a
# real `hasync serve`. Needs python3 (with venv) and the PyPI registry.
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=.ci/venv
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install -q --disable-pip-version-check \
  'grpcio>=1.60' 'grpcio-tools>=1.60' 'grpcio-health-checking>=1.60'
stubs=$(mktemp -d)
trap 'rm -rf "$stubs"' EXIT
"$venv/bin/python" -m grpc_tools.protoc -Iproto --python_out="$stubs" --grpc_python_out="$stubs" \
  proto/hasync/v1/*.proto
touch "$stubs/hasync/__init__.py" "$stubs/hasync/v1/__init__.py"
cargo build --locked --bin hasync
"$venv/bin/python" tests/python/check_api.py "${CARGO_TARGET_DIR:-target}/debug/hasync" "$stubs"
