#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what it needs, builds once, runs the unit tests,
# starts one real Pulsar broker shared by the end-to-end tests, runs them in lanes side by side
# (tests/lanes.py: the shared broker's tests on parallel workers; the tests that stop, freeze or
# shape a broker each on a broker of their worker's own; the QEMU guests one at a time; the cluster;
# the core tests again against Pulsar 4.0.x), stops the broker. docs/TESTING.md has the lanes and
# how to run one.
#   tests/run.sh            everything
#   tests/run.sh -k publish pytest arguments are passed through (to every lane)
#   RIGD_MATRIX=0 leaves the Pulsar 4.0.x lane out; RIGD_MATRIX_VERSION picks another version;
#   RIGD_LANES=shared,vm runs only those lanes.
#   RIGD_LANES=arm64 (alone or with others): the arm64 group, which CI leaves out: the cross build
#   of the arm64 .deb and the aarch64 vehicle guest (docs/TESTING.md).
# Each phase's wall time is printed at the end (and appended to $RIGD_PHASES when set: .ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export RIGD_PHASES=${RIGD_PHASES:-$(mktemp)}
# shellcheck source=phase.sh
source tests/phase.sh

phase setup tests/setup.sh
# --all-targets: the tests and benches too, in one cargo run (cargo test and the bench smoke reuse them)
phase build cargo build --release --locked --workspace --all-targets
export RIGD_BIN="$ROOT/target/release/rigd"
if [[ ,${RIGD_LANES:-}, == *,arm64,* ]]; then
  phase setup-arm64 tests/setup.sh --cross arm64
  phase build-arm64 cargo build --release --locked -p rigd --target aarch64-unknown-linux-gnu
fi
phase unit cargo test --release --locked --workspace

export PULSAR_DATA="${PULSAR_DATA:-$ROOT/target/pulsar-data}"
started_broker=0
cleanup() {
  if [ "$started_broker" = 1 ]; then tests/pulsar/broker.sh stop >&2 || true; fi
}
trap cleanup EXIT
shared_broker() {
  if ! tests/pulsar/broker.sh status >/dev/null 2>&1; then
    tests/pulsar/broker.sh start >/dev/null
    started_broker=1
  fi
}
phase broker shared_broker

mkdir -p tests/artifacts
rc=0
phase e2e python3 tests/lanes.py "$@" || rc=$?
echo "== phases" >&2
cat "$RIGD_PHASES" >&2
exit "$rc"
