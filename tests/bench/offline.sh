#!/usr/bin/env bash
# Export speed of the offline tools on a spool of about 1 GiB (docs/OFFLINE.md holds a run's output):
#   tests/bench/offline.sh [SIZE_MIB]     default 1024
# Makes the spool with a real rigd run (synthetic 512 KiB camera frames at 60 fps, a microphone and a
# GPS, no broker, so everything spools), then times `rigd replay --out` and `--mcap` (protobuf+zstd, lz4, none, and JSON) on it, each with a
# cold page cache (when run as root) and a warm one. MB/s = spool bytes read / wall time.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
SIZE_MIB=${1:-1024}
RIGD=${RIGD_BIN:-$ROOT/target/release/rigd}
[ -x "$RIGD" ] || cargo build --release --locked -p rigd >&2
WORK=$(mktemp -d "${TMPDIR:-/tmp}/rigd-offline-bench.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat > "$WORK/rig.toml" <<EOF
[rig]
id = "bench"
[[source]]
id = "cam"
kind = "synthetic-camera"
width = 640
height = 480
fps = 60
frame-bytes = 524288
[[source]]
id = "mic"
kind = "synthetic-audio"
[[source]]
id = "gps"
kind = "synthetic-serial"
rate-hz = 50
[spool]
path = "$WORK/spool"
max-bytes = "16GiB"
[web]
bind = "127.0.0.1:$port"
EOF
echo "== filling a ${SIZE_MIB} MiB spool" >&2
"$RIGD" run --config "$WORK/rig.toml" >"$WORK/rigd.log" 2>&1 &
pid=$!
while :; do
  sleep 2
  bytes=$(du -sb "$WORK/spool/segments" 2>/dev/null | cut -f1)
  [ "${bytes:-0}" -ge $((SIZE_MIB << 20)) ] && break
  kill -0 $pid 2>/dev/null || { cat "$WORK/rigd.log" >&2; exit 1; }
done
kill -TERM $pid
wait $pid

cold() { if [ "$(id -u)" = 0 ]; then sync; echo 3 > /proc/sys/vm/drop_caches; echo cold; else echo warm; fi; }

echo "## Offline export speed"
echo
echo "$(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -r), $(date -u +%Y-%m-%dT%H:%MZ)"
echo
"$RIGD" spool stat --spool "$WORK/spool"
echo
echo "| export | cache | records | spool MB | output MB | seconds | MB/s |"
echo "|---|---|---|---|---|---|---|"
# --mcap variants: the default (protobuf + zstd), lz4, uncompressed, and JSON without compression
# (what --mcap wrote before issue 28).
variants=("out" "mcap" "mcap --compression lz4" "mcap --compression none" "mcap --encoding json --compression none")
for variant in "${variants[@]}"; do
  read -r kind extra <<<"$variant"
  for pass in 1 2; do
    cache=$([ $pass = 1 ] && cold || echo warm)
    rm -rf "$WORK/export" "$WORK/spool.mcap"
    target=$([ $kind = out ] && echo "$WORK/export" || echo "$WORK/spool.mcap")
    # shellcheck disable=SC2086
    "$RIGD" replay --spool "$WORK/spool" --$kind "$target" $extra --json >"$WORK/summary.json" 2>/dev/null
    sync
    out_mb=$(du -sb "$target" | awk '{printf "%.0f", $1/1e6}')
    python3 - "$WORK/summary.json" "--$variant" "$cache" "$out_mb" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"| {sys.argv[2]} | {sys.argv[3]} | {s['records']} | {s['bytes']/1e6:.0f} | {sys.argv[4]} | {s['seconds']:.1f} | {s['mb_per_s']:.0f} |")
PY
  done
done
