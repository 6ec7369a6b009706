#!/usr/bin/env bash
# Video (issue 48's benchmark; docs/PERFORMANCE.md "Video (H.264)"): MJPEG against H.264 at equal
# quality on the same 1080p30 frames (the synthetic camera's textured, noisy pan), OpenH264's CPU per
# frame against ffmpeg's libx264 at the same bitrate, and the rig profile with an H.264 passthrough
# camera, an encoded one and the MJPEG one (tests/bench/video.py says how each is measured).
#   tests/bench/video.sh           300 frames, a sweep of 6 bitrates, libx264 veryfast and medium,
#                                  60 s per rig profile (about 8 minutes here)
#   tests/bench/video.sh --quick   10 small frames, 2 bitrates, libx264 ultrafast, the passthrough
#                                  profile for 1 s (tests/bench/run.sh --quick; no figure means anything)
# Extra arguments go to video.py (e.g. --frames 150 --profile-secs 30 --keep target/bench/video).
# The rig profiles publish to the broker at PULSAR_URL (default pulsar://127.0.0.1:6650), started
# here (and stopped at the end) when none is running; they never stop it.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
# ffmpeg (Debian's, with libx264) decodes, measures SSIM and is the anchor.
if ! command -v ffmpeg >/dev/null; then
  echo "video: installing ffmpeg" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends ffmpeg >&2
fi
# The workspace build CI makes (.ci/run, tests/bench/run.sh --quick): its features unified over every
# crate give rigd-drivers `h264` and `turbojpeg`, and it builds the example and target/release/rigd.
cargo build --release --locked --workspace --all-targets >&2
export RIGD_BIN=${RIGD_BIN:-$ROOT/target/release/rigd}
export PULSAR_URL=${PULSAR_URL:-pulsar://127.0.0.1:${PULSAR_PORT:-6650}}
started=0
if ! tests/pulsar/broker.sh status >/dev/null 2>&1; then
  tests/pulsar/broker.sh start >/dev/null
  started=1
fi
stop_broker() { if [ "$started" = 1 ]; then tests/pulsar/broker.sh stop >&2 || true; fi; }
trap stop_broker EXIT
quick=()
if [ "${1:-}" = "--quick" ]; then quick=(--quick); shift; fi
python3 tests/bench/video.py --bench target/release/examples/video_bench --url "$PULSAR_URL" "${quick[@]}" "$@"
