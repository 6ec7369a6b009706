#!/usr/bin/env bash
# Raw camera frames to JPEG, every encoder side by side on this machine (docs/PERFORMANCE.md,
# "YUYV to JPEG"): the built-in jpeg-encoder (scalar, then with `jpeg-simd`), and libturbojpeg from
# Y'CbCr planes (accurate and fast DCT) when libturbojpeg.so.0 opens. 720p and 1080p, quality 80.
#   tests/bench/jpeg.sh           every encoder (two builds of the drivers' tests)
#   tests/bench/jpeg.sh --quick   2 frames a round, without the `jpeg-simd` build and its rows
#                                 (tests/bench/run.sh --quick; every encoder runs, no figure means anything)
set -euo pipefail
cd "$(dirname "$0")/../.."
echo "$(nproc) cores, $(uname -r), $(date -u +%Y-%m-%dT%H:%MZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo
# The workspace's lib tests with its own features (turbojpeg is on by default): the build
# `cargo test --release --workspace` made is reused; only the jpeg-simd rows need one more.
run() {
  cargo test --release --locked -q --workspace --lib "$@" -- \
    --ignored --nocapture --test-threads 1 bench_raw_to_jpeg 2>/dev/null | grep '^|'
}
if [ "${1:-}" = "--quick" ]; then RIGD_BENCH_QUICK=1 run; exit 0; fi
run
# jpeg-simd changes the built-in rows only; keep those.
run --features rigd-drivers/jpeg-simd | grep 'jpeg-simd'
