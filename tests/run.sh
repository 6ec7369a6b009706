#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what it needs, builds once, runs the unit tests,
# starts one real Pulsar broker shared by every end-to-end test, runs them, stops the broker.
#   tests/run.sh            everything
#   tests/run.sh -k publish pytest arguments are passed through (to both passes below)
# The end-to-end tests run against Pulsar 3.0.x LTS (broker.sh's default), then the core uplink and
# spool tests run again against a second standalone broker of the 4.0.x LTS line (the version
# matrix; RIGD_MATRIX=0 leaves it out, RIGD_MATRIX_VERSION picks another version).
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

# The broker version matrix: chunking, dedup across kill -9, Key_Shared, TLS/token, compression
# (test_uplink), outages and power cuts with the spool (test_spool), the wire format (test_publish).
# Its own data dir and ports, so it never
# meets the first broker; the tests find it through PULSAR_URL / PULSAR_ADMIN_URL and restart it
# (outage tests) through broker.sh with the same environment.
MATRIX_VERSION=${RIGD_MATRIX_VERSION:-4.0.7}
MATRIX_TESTS=(tests/e2e/test_uplink.py tests/e2e/test_spool.py tests/e2e/test_publish.py)
matrix_selected=$(python3 -m pytest --collect-only -q -p no:cacheprovider "${MATRIX_TESTS[@]}" "$@" 2>/dev/null | grep -c '::' || true)
if [ "${RIGD_MATRIX:-1}" != 0 ] && [ "$matrix_selected" = 0 ]; then
  echo "== (no core test selected for the Pulsar $MATRIX_VERSION pass)" >&2
elif [ "${RIGD_MATRIX:-1}" != 0 ]; then
  if [ "$started_broker" = 1 ]; then
    tests/pulsar/broker.sh stop >&2 # two JVMs on 2 cores slow both; the first one is done
    started_broker=0
  fi
  echo "== end-to-end core tests against Pulsar $MATRIX_VERSION" >&2
  (
    export PULSAR_VERSION=$MATRIX_VERSION
    export PULSAR_DATA="$ROOT/target/pulsar-data-$MATRIX_VERSION"
    export PULSAR_PORT=${RIGD_MATRIX_PORT:-6670} PULSAR_HTTP_PORT=${RIGD_MATRIX_HTTP_PORT:-8095}
    export PULSAR_BOOKIE_PORT=${RIGD_MATRIX_BOOKIE_PORT:-3195}
    export PULSAR_URL="pulsar://127.0.0.1:$PULSAR_PORT" PULSAR_ADMIN_URL="http://127.0.0.1:$PULSAR_HTTP_PORT"
    matrix_started=0
    if ! tests/pulsar/broker.sh status >/dev/null 2>&1; then
      tests/pulsar/broker.sh start >/dev/null
      matrix_started=1
    fi
    trap '[ "$matrix_started" = 1 ] && tests/pulsar/broker.sh stop >&2 || true' EXIT
    rc=0
    python3 -m pytest "${MATRIX_TESTS[@]}" -v -rs --durations=5 -p no:cacheprovider "$@" || rc=$?
    # 5: the arguments (-k ...) selected none of these tests, which is not a failure
    if [ "$rc" = 5 ]; then echo "(no core test selected for Pulsar $MATRIX_VERSION)" >&2; rc=0; fi
    exit "$rc"
  )
fi
