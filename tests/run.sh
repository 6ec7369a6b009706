#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what it needs, builds once, runs the unit tests,
# starts one real Pulsar broker shared by every end-to-end test, runs them, stops the broker.
#   tests/run.sh            everything
#   tests/run.sh -k publish pytest arguments are passed through
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

tests/setup.sh

echo "== build" >&2
cargo build --release --locked --workspace
export RIGD_BIN="$ROOT/target/release/rigd"

echo "== unit and integration tests (cargo)" >&2
cargo test --release --locked --workspace

echo "== end-to-end tests (real broker, official Python client)" >&2
export PULSAR_DATA="${PULSAR_DATA:-$ROOT/target/pulsar-data}"
started_broker=0
if ! tests/pulsar/broker.sh status >/dev/null 2>&1; then
  tests/pulsar/broker.sh start >/dev/null
  started_broker=1
fi
cleanup() {
  if [ "$started_broker" = 1 ]; then tests/pulsar/broker.sh stop >&2 || true; fi
}
trap cleanup EXIT

mkdir -p tests/artifacts
python3 -m pytest tests/e2e -v -rs --durations=15 -p no:cacheprovider "$@"
