#!/usr/bin/env bash
# One command for rigd's performance figures, side by side with the anchors on the same machine:
#   tests/bench/run.sh           full run (about 30 minutes with the fleet sweep and the video section)
#   tests/bench/run.sh --quick   smoke run for CI (small counts; no figure is meaningful)
# The broker: the one on PULSAR_PORT / PULSAR_HTTP_PORT (6650 / 8080) with data in PULSAR_DATA, started
# (and stopped at the end) if it is not running. Sections stop, restart and shape it (tc), so give a
# run ports of its own beside a broker somebody else uses: PULSAR_PORT=6960 PULSAR_HTTP_PORT=6961
# PULSAR_BOOKIE_PORT=6962 PULSAR_DATA=target/pulsar-data-bench tests/bench/run.sh --quick
# Prints one markdown table per section; docs/PERFORMANCE.md holds a full run's output.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
QUICK=0
[ "${1:-}" = "--quick" ] && QUICK=1

tests/setup.sh
export PULSAR_DATA=${PULSAR_DATA:-$ROOT/target/pulsar-data}
PORT=${PULSAR_PORT:-6650} HTTP_PORT=${PULSAR_HTTP_PORT:-8080}
export PULSAR_URL=pulsar://127.0.0.1:$PORT PULSAR_ADMIN_URL=http://127.0.0.1:$HTTP_PORT
URL=$PULSAR_URL ADMIN_URL=$PULSAR_ADMIN_URL
LIB=$(tests/pulsar/broker.sh fetch)
# The broker starts beside the builds (its start is ~10 s, mostly waiting on its JVM).
started=0 broker_start=
if ! tests/pulsar/broker.sh status >/dev/null 2>&1; then
  tests/pulsar/broker.sh start >/dev/null & broker_start=$!
  started=1
fi
stop_broker() {
  if [ "$started" = 1 ]; then
    wait "$broker_start" 2>/dev/null || true
    tests/pulsar/broker.sh stop >&2 || true
  fi
}
trap stop_broker EXIT
# The raw-camera rig profile also runs on the pure-Rust JPEG fallback: rigd built without the
# `turbojpeg` feature, first, so that the default build after it leaves target/release/rigd as shipped.
# Not in the smoke run (two more builds of rigd for no meaningful figure).
fallback=()
if [ $QUICK = 0 ]; then
  cargo build --release --locked -p rigd --no-default-features --features hardware >&2
  mkdir -p target/bench && cp target/release/rigd target/bench/rigd-without-turbojpeg
  fallback=(--rigd-without-turbojpeg target/bench/rigd-without-turbojpeg)
fi
# The smoke run reuses .ci/run's build as it is: the workspace's with every target (its features
# unified over every crate and the dev-dependencies), where `-p rigd` alone, or the workspace without
# its tests, is another feature set and so another build of rigd and its dependencies (~90-115 s),
# and the bench targets only (`--benches`), not the library's test harness in bench mode (~110 s).
scope=(-p rigd) build=()
if [ $QUICK = 1 ]; then scope=(--workspace) build=(--all-targets); fi
cargo build --release --locked "${scope[@]}" "${build[@]}" >&2
cargo bench --locked "${scope[@]}" --benches --no-run >&2 2>/dev/null || cargo bench --locked "${scope[@]}" --benches --no-run
# Each bench binary's path, resolved once: the sections run them directly (no cargo start per row).
bench_bin() {
  cargo bench --locked -q "${scope[@]}" --bench "$1" --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys; print([m["executable"] for m in map(json.loads, sys.stdin) if m.get("executable") and m["target"]["name"] == sys.argv[1]][-1])' "$1"
}
UPLINK_BENCH=$(bench_bin uplink)
SPOOL_BENCH=$(bench_bin spool)
FLEET_BENCH=$(bench_bin fleet)
JAVA_HOME=${JAVA_HOME:-/usr/lib/jvm/java-17-openjdk-amd64}
mkdir -p target/bench-java
"$JAVA_HOME/bin/javac" -d target/bench-java -cp "$LIB/*" tests/bench/java/JavaProducer.java
if [ -n "$broker_start" ]; then wait "$broker_start"; broker_start=; fi
run_id=$(date +%s)
# Each section's wall time on stderr and, under .ci/run, in its phase list ($RIGD_PHASES).
# A section that needs root: runs "$@", or says why it is skipped ($1).
as_root() {
  local why=$1
  shift
  if [ "$(id -u)" = 0 ]; then "$@"; else echo "(skipped: $why)"; fi
}
section_name=prepare section_t0=0 # setup, builds, the broker, javac: from the start
section() {
  if [ -n "$section_name" ]; then
    echo "bench: $section_name took $((SECONDS - section_t0)) s" >&2
    if [ -n "${RIGD_PHASES:-}" ]; then echo "  bench/$section_name $((SECONDS - section_t0)) s" >>"$RIGD_PHASES"; fi
  fi
  section_name=$1 section_t0=$SECONDS
}

section machine
echo "## Machine"
echo
echo "$(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -r), $(date -u +%Y-%m-%dT%H:%MZ)"
echo

section uplink
echo "## Uplink publish: rigd vs the official Java client (same broker, same run)"
echo
echo "Batching: both sides with the Java defaults (1000 messages, 128 KiB, 1 ms), or both off."
echo
if [ $QUICK = 1 ]; then
  # one row per path: small unbatched and batched, 1 MiB, 20 MiB chunked; one round
  plan="100:1000:false 4096:1000:true 1048576:20:false 20971520:2:false" rounds=1
else
  plan="100:200000:false 100:500000:true 4096:100000:false 4096:200000:true 1048576:1000:false 20971520:40:false"
  rounds=3
fi
echo "Medians of $rounds rounds with the spread (min-max); rigd and Java take turns going first, round by round."
echo
echo "| size | batching | rigd msg/s | rigd MB/s | rigd p50/p99 ms | Java msg/s | Java MB/s | Java p50/p99 ms | rigd / Java |"
echo "|---|---|---|---|---|---|---|---|---|"
uplink_rows=$(mktemp)
rigd_round() {
  for p in $plan; do
    IFS=: read -r size count batching <<<"$p"
    echo "rigd $1 $("$UPLINK_BENCH" "$URL" "persistent://public/default/bench-rigd-$run_id-$1-$size-$batching" "$size" "$count" 500 "$batching" 2>/dev/null | grep '^{')"
  done >>"$uplink_rows"
}
java_round() {
  # every row in one JVM (a JVM and client start per row cost more than the smoke's rows)
  # shellcheck disable=SC2086 # $plan: one argument per row
  "$JAVA_HOME/bin/java" -Xmx1g -cp "target/bench-java:$LIB/*" JavaProducer "$URL" \
    "persistent://public/default/bench-java-$run_id-$1" 500 $plan 2>/dev/null | grep '^{' | sed "s/^/java $1 /" >>"$uplink_rows"
}
for round in $(seq 1 "$rounds"); do
  if [ $((round % 2)) = 1 ]; then rigd_round "$round"; java_round "$round"; else java_round "$round"; rigd_round "$round"; fi
done
python3 - "$uplink_rows" "$plan" <<'PY'
import json, statistics, sys
plan = sys.argv[2].split()
runs = {"rigd": {}, "java": {}}
for line in open(sys.argv[1]):
    client, rnd, js = line.split(" ", 2)
    runs[client].setdefault(rnd, []).append(json.loads(js))
def cell(rows, key, fmt):
    v = [r[key] for r in rows]
    m = statistics.median(v)
    return f"{m:{fmt}} ({min(v):{fmt}}-{max(v):{fmt}})" if len(v) > 1 else f"{m:{fmt}}"
for i, row in enumerate(plan):
    size = int(row.split(":")[0])
    label = f"{size} B" if size < 1024 else (f"{size // 1024} KiB" if size < 1 << 20 else f"{size >> 20} MiB")
    batching = "on" if row.endswith(":true") else "off"
    r = [rows[i] for rows in runs["rigd"].values()]
    j = [rows[i] for rows in runs["java"].values()]
    med = lambda rows, k: statistics.median(x[k] for x in rows)
    print(f"| {label} | {batching} | {cell(r, 'msg_per_s', '.0f')} | {med(r, 'mb_per_s'):.1f} | "
          f"{med(r, 'p50_ms'):.1f} / {med(r, 'p99_ms'):.1f} | {cell(j, 'msg_per_s', '.0f')} | {med(j, 'mb_per_s'):.1f} | "
          f"{med(j, 'p50_ms'):.1f} / {med(j, 'p99_ms'):.1f} | {med(r, 'msg_per_s') / med(j, 'msg_per_s'):.2f}x |")
PY
rm -f "$uplink_rows"
echo

section encryption
# the smoke: one round of 20 frames each way, no warm-up (the path runs; its figure means nothing)
rounds=5 count=1000; [ $QUICK = 1 ] && rounds=1 count=20
echo "## End-to-end encryption cost: rigd's uplink at 1 MiB frames, encryption off and on (same run, alternating after a warm-up; median of $rounds)"
echo
keydir=$(mktemp -d); openssl genrsa -out "$keydir/fleet.key.pem" 2048 2>/dev/null
openssl rsa -in "$keydir/fleet.key.pem" -pubout -out "$keydir/fleet.pem" 2>/dev/null
runs=()
if [ $QUICK = 0 ]; then
  "$UPLINK_BENCH" "$URL" "persistent://public/default/bench-enc-$run_id-warmup" 1048576 "$count" 500 false >/dev/null 2>&1
fi
for round in $(seq "$rounds"); do
  for enc in off on; do
    key=(); [ $enc = on ] && key=("$keydir/fleet.pem")
    runs+=("$enc $("$UPLINK_BENCH" "$URL" "persistent://public/default/bench-enc-$run_id-$round-$enc" 1048576 "$count" 500 false "${key[@]}" 2>/dev/null | grep '^{')")
  done
done
rm -rf "$keydir"
python3 - "$rounds" "${runs[@]}" <<'PY'
import json, statistics, sys
rows = {"off": [], "on": []}
for r in sys.argv[2:]:
    enc, js = r.split(" ", 1)
    rows[enc].append(json.loads(js))
med = {k: statistics.median(x["mb_per_s"] for x in v) for k, v in rows.items()}
p99 = {k: statistics.median(x["p99_ms"] for x in v) for k, v in rows.items()}
print(f"| encryption | MB/s (median of {sys.argv[1]}) | p99 ms | cost |")
print("|---|---|---|---|")
print(f"| off | {med['off']:.1f} | {p99['off']:.1f} | |")
print(f"| on (AES-256-GCM, RSA-2048 data key) | {med['on']:.1f} | {p99['on']:.1f} | {100 * (1 - med['on'] / med['off']):.1f} % |")
PY
echo

section spool
echo "## Spool write and drain vs raw sequential write with fdatasync (group commit 50 ms; medians of 3 rounds, raw and spool in turns)"
echo
echo "| frame | raw MB/s | spool MB/s | spool / raw | frames/s | disk bytes per byte | drain MB/s | left after drain |"
echo "|---|---|---|---|---|---|---|---|"
if [ $QUICK = 1 ]; then plan="4096:33554432 1048576:67108864"; else plan="4096:536870912 1048576:1073741824"; fi
for p in $plan; do
  size=${p%%:*}; total=${p##*:}
  out=$("$SPOOL_BENCH" "$ROOT/target/bench-spool" "$size" "$total" 50 2>/dev/null | grep '^{')
  python3 - "$out" <<'PY'
import json, sys
rows = {json.loads(l)["what"]: json.loads(l) for l in sys.argv[1].splitlines()}
raw, w, d = rows["raw-write"], rows["spool-write"], rows["spool-drain"]
size = w["frame_bytes"]
label = f"{size // 1024} KiB" if size < 1 << 20 else f"{size >> 20} MiB"
print(f"| {label} | {raw['mb_per_s']:.0f} | {w['mb_per_s']:.0f} | {w['ratio_to_raw']:.2f} | {w['frames_per_s']:.0f} | "
      f"{w['disk_bytes_per_byte']:.3f} | {d['mb_per_s']:.0f} | {d['disk_bytes_left'] / 1e6:.1f} MB |")
PY
done
echo

section rig-profile
echo "## Full rig profile: 1080p camera 30 fps (MJPEG, then raw YUYV encoded by rigd) + 48 kHz stereo + 100 Hz serial, publishing live; with MJPEG then a broker outage and the drain"
echo
secs=60; outage=30; formats=mjpeg,mjpeg+encrypted,yuyv
# the smoke: the encrypted path runs in the encryption section already
[ $QUICK = 1 ] && secs=2 && outage=2 && formats=mjpeg,yuyv
# the outage stops the broker: only this run's own (never one somebody else is using)
if [ "$started" = 0 ]; then outage=0; echo "(no outage rows: the broker is not this run's)"; echo; fi
python3 tests/bench/rig_profile.py --secs "$secs" --outage-secs "$outage" --url "$URL" \
  --formats "$formats" "${fallback[@]}"
echo

section proxy-rig
echo "## Four cameras with proxies (issue 49): four 1080p30 H.264 cameras held on request, each with its 854x480 proxy live, + audio + serial; then the same without proxies; capture threads' CPU per picture"
echo
secs=30; [ $QUICK = 1 ] && secs=2
python3 tests/bench/rig_profile.py --secs "$secs" --outage-secs 0 --url "$URL" --formats proxy4,h264x4
echo

section live-view
echo "## Live view cost: one Foxglove client on every channel of the rig profile (added CPU, capture-to-client latency on loopback)"
echo
# alternating rounds without and with the client, medians and spread (the smoke: one round of 2 s)
if [ $QUICK = 1 ]; then
  python3 tests/bench/live_view.py --quick --url "$URL"
else
  python3 tests/bench/live_view.py --rounds 5 --secs 20 --url "$URL"
fi
echo

section recall
echo "## Recall: a range uploaded on request against replay --pulsar of the same range (issue 27)"
echo
# the smoke: 30 s of the camera's frames (captured in 3 s)
if [ $QUICK = 1 ]; then
  python3 tests/bench/recall.py --minutes 0.5 --speedup 10 --url "$URL"
else
  python3 tests/bench/recall.py --minutes 10 --speedup 10 --url "$URL"
fi
echo

section jpeg
echo "## YUYV and NV12 to JPEG, every encoder side by side (ms per frame, one core)"
echo
if [ $QUICK = 1 ]; then tests/bench/jpeg.sh --quick; else tests/bench/jpeg.sh; fi
echo

section video
echo "## Video (H.264): MJPEG against H.264 at equal quality, OpenH264 against libx264, the rig profile with an H.264 camera (issue 48)"
echo
# the smoke: 10 small frames, two bitrates, libx264 ultrafast, the passthrough profile for 1 s
if [ $QUICK = 1 ]; then tests/bench/video.sh --quick; else tests/bench/video.sh; fi
echo

section can
echo "## CAN: rigd's cost at 2,000 and 8,000 frames/s (issue 52)"
echo
python3 tests/bench/can.py --url "$URL" $([ $QUICK = 1 ] && echo --quick)
echo

section thin-link
echo "## Thin link: a bandwidth budget through a shaped 2 Mbit/s link, an outage, live-first drain"
echo
as_root "tc needs root" python3 tests/bench/thin_link.py $([ $QUICK = 1 ] && echo --quick)
echo

section links-trace
echo "## Several links under traces (steps, a ramp, an LTE-like trace with outages): one link and two, auto and fixed caps"
echo
as_root "namespaces and tc need root" python3 tests/bench/links_trace.py $([ $QUICK = 1 ] && echo --quick)
echo

section outage-return
echo "## Back after an outage: broker answering again to the first receipt (a silent link cut by tc, and the broker stopped and started)"
echo
if [ "$(id -u)" != 0 ]; then
  echo "(skipped: tc needs root)"
elif [ $QUICK = 1 ]; then
  # the smoke: one silent 5 s cut of this run's own broker (never one somebody else started)
  if [ "$started" = 1 ]; then python3 tests/bench/outage_return.py --quick --port "$PORT"; else echo "(skipped: the broker is not this run's)"; fi
else
  python3 tests/bench/outage_return.py --outages 40,120 --rounds 3
fi
echo

section startup
echo "## Startup to READY (sd_notify), empty spool and a large one"
echo
spool_bytes=$((10 << 30)); [ $QUICK = 1 ] && spool_bytes=$((256 << 20))
python3 tests/bench/startup.py --spool-bytes "$spool_bytes" --rigd target/release/rigd --filler "$SPOOL_BENCH"
echo

section fleet
echo "## Fleet: rigs x 4 sources (camera, audio, gps, imu at 1/30 of a rig's rates), one rigd producer and connection each, namespace unloads mid-run; judged by the official client"
echo
# Against the standalone broker of this run; a sweep in the full run shows where it bends.
PULSAR_BROKER_PID=$(tests/pulsar/broker.sh env | sed -n 's/^PULSAR_BROKER_PID=//p'); export PULSAR_BROKER_PID
if [ $QUICK = 1 ]; then
  python3 tests/bench/fleet.py --bench "$FLEET_BENCH" --quick --url "$URL" --admin-url "$ADMIN_URL"
else
  # where it bends: 1,000 and 2,000 producers at 1/300 of a rig's rates, two namespace unloads
  python3 tests/bench/fleet.py --bench "$FLEET_BENCH" --url "$URL" --admin-url "$ADMIN_URL" \
    --rigs 250 --rigs 500 --rate-scale 0.003333 --secs 60 --unload-at 15,40 --json target/bench/fleet-standalone.json
  echo
  echo "One bundle of 16 unloaded (what a load-balancer move does), and 1/30 of the rig rates (26 MB/s)"
  echo
  python3 tests/bench/fleet.py --bench "$FLEET_BENCH" --url "$URL" --admin-url "$ADMIN_URL" \
    --rigs 250 --bundles 16 --unload-scope bundle --rate-scale 0.003333 --secs 45 --unload-at 15,30 \
    --json target/bench/fleet-bundle.json | tail -n 1
  python3 tests/bench/fleet.py --bench "$FLEET_BENCH" --url "$URL" --admin-url "$ADMIN_URL" --rigs 250 --secs 30 --unload-at 5 \
    --drain-secs 30 --json target/bench/fleet-rates.json | tail -n 1
  # And on the multi-broker cluster when the harness is there: a broker kill -9 mid-run.
  if [ -x tests/pulsar/cluster.sh ]; then
    cluster_started=0
    if ! tests/pulsar/cluster.sh status >/dev/null 2>&1; then tests/pulsar/cluster.sh start >/dev/null; cluster_started=1; fi
    eval "$(tests/pulsar/cluster.sh env)"
    # kill -9 only a cluster this run started (never one somebody else is using)
    kill_args=()
    if [ "$cluster_started" = 1 ]; then
      kill_args=(--kill-broker-at 40)
    fi
    echo
    echo "On the cluster ($PULSAR_CLUSTER_URL): a namespace unload at +20 s${kill_args:+, kill -9 of the broker owning most bundles at +40 s}"
    echo
    PULSAR_BROKER_PID= python3 tests/bench/fleet.py --bench "$FLEET_BENCH" --url "$PULSAR_CLUSTER_URL" --admin-url "$PULSAR_CLUSTER_ADMIN_URLS" \
      --rigs 250 --rate-scale 0.003333 --secs 60 --unload-at 20 "${kill_args[@]}" \
      --json target/bench/fleet-cluster.json || true
    if [ "$cluster_started" = 1 ]; then
      echo
      echo "On the cluster: a rolling restart of both brokers from +10 s (SIGTERM, start, next)"
      echo
      PULSAR_BROKER_PID= python3 tests/bench/fleet.py --bench "$FLEET_BENCH" --url "$PULSAR_CLUSTER_URL" --admin-url "$PULSAR_CLUSTER_ADMIN_URLS" \
        --rigs 250 --rate-scale 0.003333 --secs 60 --unload-at "" --rolling-restart-at 10 \
        --json target/bench/fleet-cluster-rolling.json | tail -n 1 || true
    fi
    if [ "$cluster_started" = 1 ]; then tests/pulsar/cluster.sh stop >&2 || true; fi
  fi
fi
section end
