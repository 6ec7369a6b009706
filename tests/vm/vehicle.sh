#!/usr/bin/env bash
# Vehicle in a box: a Debian guest with systemd as PID 1 under QEMU TCG (never KVM), the rigd .deb
# installed, the Pulsar broker on the host reached through QEMU user networking (10.0.2.2).
#   tests/vm/vehicle.sh            build/boot/check; exit 0 when every check passed
# The guest image is cached in $RIGD_VM_CACHE (default ~/.cache/rigd-vm); a second run reuses it.
# Status: see docs/SYSTEMD.md ("Vehicle in a box"). Not part of tests/run.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
CACHE=${RIGD_VM_CACHE:-$HOME/.cache/rigd-vm}
WORK=$ROOT/target/vm
mkdir -p "$CACHE" "$WORK"
log() { echo "vehicle: $*" >&2; }
t_begin=$(date +%s)

for tool in debootstrap qemu-system-x86_64 mkfs.ext4 socat; do
  command -v $tool >/dev/null || { log "missing $tool (apt-get install debootstrap qemu-system-x86 qemu-utils e2fsprogs socat)"; exit 1; }
done

# 1. Base image (cached): minimal Debian with systemd, a kernel and an initramfs.
BASE=$CACHE/base
if [ ! -f "$BASE/.done" ]; then
  # The mirror the host's apt uses (no host named here).
  MIRROR=$(grep -h '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep -v security | head -1)
  [ -n "$MIRROR" ] || MIRROR=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list)
  log "debootstrap bookworm from the host's mirror into $BASE"
  rm -rf "$BASE"
  debootstrap --variant=minbase \
    --include=systemd,systemd-sysv,udev,dbus,linux-image-amd64,initramfs-tools,init-system-helpers,libasound2,iproute2,procps,kmod,socat \
    bookworm "$BASE" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1
  echo vehicle > "$BASE/etc/hostname"
  # Network: DHCP on the virtio NIC (QEMU user networking).
  mkdir -p "$BASE/etc/systemd/network"
  printf '[Match]\nName=en*\n[Network]\nDHCP=yes\n' > "$BASE/etc/systemd/network/50-dhcp.network"
  chroot "$BASE" systemctl enable systemd-networkd >/dev/null 2>&1
  # A root shell on the second serial port: the host drives checks through it.
  mkdir -p "$BASE/etc/systemd/system/serial-getty@ttyS1.service.d"
  printf '[Service]\nExecStart=\nExecStart=-/sbin/agetty --autologin root --noclear %%I 115200 dumb\n' \
    > "$BASE/etc/systemd/system/serial-getty@ttyS1.service.d/autologin.conf"
  chroot "$BASE" systemctl enable serial-getty@ttyS1.service >/dev/null 2>&1
  printf '/dev/vda / ext4 defaults 0 1\n' > "$BASE/etc/fstab"
  touch "$BASE/.done"
fi
if [ ! -x "$BASE/usr/bin/socat" ]; then  # images cached before socat was in the list
  cp /etc/resolv.conf "$BASE/etc/resolv.conf"
  chroot "$BASE" apt-get install -y -qq --no-install-recommends socat >"$CACHE/socat.log" 2>&1
fi
# The broker advertises 127.0.0.1:6650 (its lookups name that address), so the guest relays its
# own 127.0.0.1:6650 to the host (10.0.2.2 in QEMU user networking).
if [ ! -f "$BASE/etc/systemd/system/broker-relay.service" ]; then
  cat > "$BASE/etc/systemd/system/broker-relay.service" <<'UNIT'
[Unit]
Description=relay 127.0.0.1:6650 to the host's Pulsar broker
Before=rigd.service
[Service]
ExecStart=/usr/bin/socat TCP-LISTEN:6650,bind=127.0.0.1,fork,reuseaddr TCP:10.0.2.2:6650
Restart=always
[Install]
WantedBy=multi-user.target
UNIT
  chroot "$BASE" systemctl enable broker-relay.service >/dev/null 2>&1
fi

# 2. This run's image: the base plus the package, as an ext4 file made without loop mounts.
DEB=$(ls -t "$ROOT"/target/debian/rigd_*.deb 2>/dev/null | head -1 || true)
if [ -z "$DEB" ] || [ "$ROOT/target/release/rigd" -nt "$DEB" ]; then
  log "building the package"
  (cd daemon && cargo deb -p rigd --no-build --fast --strip >&2)
  DEB=$(ls -t "$ROOT"/target/debian/rigd_*.deb | head -1)
fi
GUEST=$WORK/guest
rm -rf "$GUEST"; cp -a "$BASE" "$GUEST"
cp "$DEB" "$GUEST/tmp/rigd.deb"
chroot "$GUEST" dpkg -i /tmp/rigd.deb >"$WORK/dpkg.log" 2>&1 || { cat "$WORK/dpkg.log" >&2; exit 1; }
cp tests/vm/vehicle/rigd.toml "$GUEST/etc/rigd/rigd.toml"
chroot "$GUEST" rigd check --config /etc/rigd/rigd.toml
rm -f "$GUEST/tmp/rigd.deb"
KERNEL=$(ls "$GUEST"/boot/vmlinuz-* | head -1); INITRD=$(ls "$GUEST"/boot/initrd.img-* | head -1)
cp "$KERNEL" "$WORK/vmlinuz"; cp "$INITRD" "$WORK/initrd"
rm -f "$WORK/disk.img"
mkfs.ext4 -q -F -L root -d "$GUEST" "$WORK/disk.img" 3G

# The broker on the host (started here when not running, stopped again at the end).
started_broker=0
if ! (exec 3<>/dev/tcp/127.0.0.1/6650) 2>/dev/null; then
  log "starting the broker"; tests/pulsar/broker.sh start >/dev/null; started_broker=1
fi

# 3. Boot under TCG. Web UI forwarded to a host port; console log to a file; shell on a socket.
WEB_PORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
SHELL_SOCK=$WORK/shell.sock; rm -f "$SHELL_SOCK"
log "booting (TCG)"
t_boot=$(date +%s.%N)
timeout 900 qemu-system-x86_64 -accel tcg -machine q35 -cpu max -smp 2 -m 1536 -nographic \
  -kernel "$WORK/vmlinuz" -initrd "$WORK/initrd" \
  -append "root=/dev/vda rw console=ttyS0 net.ifnames=1 systemd.show_status=1" \
  -drive file="$WORK/disk.img",format=raw,if=virtio \
  -netdev user,id=n0,hostfwd=tcp:127.0.0.1:$WEB_PORT-:8088 -device virtio-net-pci,netdev=n0 \
  -serial file:"$WORK/console.log" -serial unix:"$SHELL_SOCK",server=on,wait=off \
  -monitor none -display none >"$WORK/qemu.log" 2>&1 &
QEMU=$!
cleanup() {
  kill $QEMU 2>/dev/null || true; wait $QEMU 2>/dev/null || true
  if [ "$started_broker" = 1 ]; then tests/pulsar/broker.sh stop >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

guest() { # runs a command in the guest's root shell, prints its output
  python3 "$ROOT/tests/vm/vehicle/shell.py" "$SHELL_SOCK" "$1" "${2:-60}"
}
fail=0
check() { if "$@"; then log "PASS: $CHECK"; else log "FAIL: $CHECK"; fail=1; fi; }

# Ready: the web UI answers through the forwarded port.
deadline=$(( $(date +%s) + 600 ))
until curl -sf "http://127.0.0.1:$WEB_PORT/healthz" >/dev/null; do
  if ! kill -0 $QEMU 2>/dev/null; then log "qemu exited"; tail -50 "$WORK/console.log" >&2; exit 1; fi
  [ "$(date +%s)" -lt $deadline ] || { log "guest not ready in 600 s"; tail -50 "$WORK/console.log" >&2; exit 1; }
  sleep 2
done
t_ready=$(date +%s.%N)
log "boot to web UI answering: $(python3 -c "print(round($t_ready-$t_boot,1))") s"

guest 'true' 60 >/dev/null 2>&1 || true   # the first line meets the autologin banner
CHECK="service active"
active=$(guest 'systemctl is-active rigd' 30 || true); log "systemctl is-active: $active"
check grep -q '^active' <<<"$active"
log "ready timing: $(guest 'systemd-analyze; systemctl show -p ExecMainStartTimestampMonotonic -p ActiveEnterTimestampMonotonic rigd' 30 || true)"
log "status: $(guest 'systemctl show -p StatusText rigd' 30 || true)"

CHECK="frames of all three sources published to the host's broker"
check python3 - "$WEB_PORT" <<'PY'
import json, sys, time, urllib.request
port = sys.argv[1]
deadline = time.time() + 120
while time.time() < deadline:
    s = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=5))
    pub = {x["id"]: x.get("published", 0) for x in s["sources"]}
    if s["uplink"]["connected"] and all(pub.get(k, 0) > 0 for k in ["front", "mic", "gps"]):
        print(pub, file=sys.stderr); sys.exit(0)
    time.sleep(2)
print(json.dumps(s)[:2000], file=sys.stderr); sys.exit(1)
PY

CHECK="watchdog restarts a SIGSTOPped daemon"
pid1=$(guest 'systemctl show -p MainPID --value rigd' 30 | tr -dc 0-9)
guest "kill -STOP $pid1" 10 >/dev/null
restarted=0
for _ in $(seq 1 60); do
  sleep 2
  pid2=$(guest 'systemctl show -p MainPID --value rigd' 30 | tr -dc 0-9 || true)
  state=$(guest 'systemctl is-active rigd' 30 || true)
  if [ -n "$pid2" ] && [ "$pid2" != 0 ] && [ "$pid2" != "$pid1" ] && grep -q '^active' <<<"$state"; then restarted=1; break; fi
done
log "watchdog: pid $pid1 -> ${pid2:-?}; $(guest 'journalctl -u rigd --no-pager | grep -i watchdog | tail -2' 30 || true)"
check test $restarted = 1

log "total $(( $(date +%s) - t_begin )) s"
[ $fail = 0 ] && log "all checks passed" || log "some checks failed"
exit $fail
