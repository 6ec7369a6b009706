#!/usr/bin/env bash
# The V4L2 camera driver on a real kernel driver: Debian's stock kernel with vivid, booted from a
# busybox initramfs under QEMU TCG (never KVM), runs the static `v4l_probe` example
# (drivers/examples/v4l_probe.rs) against /dev/video0, and its multi-planar checks against
# /dev/video1 (vivid's second device, loaded with multiplanar=2).
#   tests/vm/camera.sh        exit 0 when every guest check passed; prints the guest's
#                             `RIGD-VM-CAMERA ...` lines and `camera-vm: passed in N s`
# Cache: $RIGD_VM_CACHE (default ~/.cache/rigd-vm)/kernel-<abi>: the kernel package, unpacked and
# depmod'ed once. Work files: target/vm-camera. Needs qemu-system-x86 busybox-static cpio kmod
# (tests/setup.sh installs them) and the musl target (added with rustup when missing).
# RIGD_VM_TIMEOUT (default 150 s) bounds the guest.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
CACHE=${RIGD_VM_CACHE:-$HOME/.cache/rigd-vm}
WORK=$ROOT/target/vm-camera
TIMEOUT=${RIGD_VM_TIMEOUT:-150}
log() { echo "camera-vm: $*" >&2; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
t_begin=$(now)

for tool in qemu-system-x86_64 cpio depmod modprobe dpkg-deb; do
  command -v $tool >/dev/null || { log "missing $tool (apt-get install qemu-system-x86 busybox-static cpio kmod)"; exit 1; }
done
is_static() { { ldd "$1" 2>&1 || true; } | grep -qE 'not a dynamic executable|statically linked'; }
BUSYBOX=/bin/busybox
[ -x $BUSYBOX ] && is_static $BUSYBOX || { log "missing a static busybox (apt-get install busybox-static)"; exit 1; }

# 1. Kernel (cached): sets ABI, KROOT, VMLINUZ, SUDO.
. tests/vm/kernel.sh

# 1b. v4l2loopback (cached) for MJPEG passthrough: Debian's v4l2loopback-dkms source built against
# linux-headers-$ABI. Without the headers (and no way to install them) that check is skipped.
LOOP_KO=$CACHE/v4l2loopback-$ABI/v4l2loopback.ko
LOOP_SKIP=""
if [ ! -f "$LOOP_KO" ]; then
  HDR=/usr/src/linux-headers-$ABI
  if [ ! -d "$HDR" ]; then
    log "installing linux-headers-$ABI (to build v4l2loopback)"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "linux-headers-$ABI" >&2 2>&1 || true
  fi
  if [ -d "$HDR" ] && command -v make >/dev/null && command -v gcc >/dev/null; then
    LB=$CACHE/v4l2loopback-$ABI
    rm -rf "$LB"; mkdir -p "$LB/deb"
    (cd "$LB/deb" && apt-get download v4l2loopback-dkms 2>&1 | grep -v '^W: Download is performed unsandboxed' >&2) || true
    if ls "$LB"/deb/v4l2loopback-dkms_*.deb >/dev/null 2>&1; then
      dpkg-deb -x "$LB"/deb/v4l2loopback-dkms_*.deb "$LB/root"
      cp -r "$LB"/root/usr/src/v4l2loopback-* "$LB/build"
      make -C "$HDR" M="$LB/build" modules >"$LB/build.log" 2>&1 && cp "$LB/build/v4l2loopback.ko" "$LOOP_KO" \
        || LOOP_SKIP="v4l2loopback did not build (see $LB/build.log)"
    else
      LOOP_SKIP="apt-get download v4l2loopback-dkms failed"
    fi
  else
    LOOP_SKIP="no linux-headers-$ABI, make or gcc to build v4l2loopback"
  fi
fi
[ -z "$LOOP_SKIP" ] || log "MJPEG passthrough check skipped: $LOOP_SKIP"

# 2. The static test binary: musl when rustup has (or can add) the target, else glibc +crt-static.
TARGET=x86_64-unknown-linux-musl
if ! rustup target list --installed 2>/dev/null | grep -qx $TARGET; then
  rustup target add $TARGET >&2 2>&1 || TARGET=x86_64-unknown-linux-gnu
fi
log "building v4l_probe for $TARGET"
if [ $TARGET = x86_64-unknown-linux-gnu ]; then
  # With an explicit --target, RUSTFLAGS reach only target artifacts (no host rebuild).
  RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --locked -q -p rigd-drivers \
    --features v4l --example v4l_probe --target $TARGET >&2
else
  cargo build --release --locked -q -p rigd-drivers --features v4l --example v4l_probe --target $TARGET >&2
fi
PROBE=$ROOT/target/$TARGET/release/examples/v4l_probe
is_static "$PROBE" || { log "$PROBE is not statically linked"; exit 1; }

# 3. Initramfs: busybox, vivid and what it needs (in modprobe's order), the probe.
rm -rf "$WORK/initramfs"; mkdir -p "$WORK/initramfs"/{bin,dev,proc,sys,tmp,modules}
IR=$WORK/initramfs
cp "$BUSYBOX" "$IR/bin/busybox"
cp "$PROBE" "$IR/bin/v4l_probe"
: > "$IR/modules/order"
while read -r verb path _; do
  [ "$verb" = insmod ] || continue
  cp "$path" "$IR/modules/"
  basename "$path" >> "$IR/modules/order"
done < <(modprobe -d "$KROOT/root" -S "$ABI" --show-depends vivid)
grep -q '^vivid.ko$' "$IR/modules/order" || { log "vivid.ko not found in linux-image-$ABI"; exit 1; }
LOOP_ARG=""
if [ -f "$LOOP_KO" ]; then
  cp "$LOOP_KO" "$IR/modules/"; echo v4l2loopback.ko >> "$IR/modules/order"; LOOP_ARG=/dev/video10
fi
cat > "$IR/init" <<INIT
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in \$(cat /modules/order); do
  # One device, video capture node only: less to probe, faster boot.
  case \$m in
    # Two devices, video capture nodes only: /dev/video0 single-planar, /dev/video1 multi-planar.
    vivid.ko) args="n_devs=2 node_types=0x1,0x1 multiplanar=1,2";;
    v4l2loopback.ko) args="video_nr=10 card_label=rigd-loopback";;
    *) args="";;
  esac
  insmod /modules/\$m \$args || echo "RIGD-VM-CAMERA FAIL insmod \$m"
done
i=0; while [ ! -e /dev/video0 ] && [ \$i -lt 50 ]; do sleep 0.1; i=\$((i+1)); done
echo; echo "RIGD-VM-CAMERA BOOTED uptime \$(cut -d' ' -f1 /proc/uptime) s, kernel \$(uname -r)"
i=0; while [ ! -e /dev/video1 ] && [ \$i -lt 50 ]; do sleep 0.1; i=\$((i+1)); done
/bin/v4l_probe --mplane /dev/video1 /dev/video0 $LOOP_ARG
echo "RIGD-VM-CAMERA EXIT \$?"
poweroff -f
INIT
chmod +x "$IR/init"
(cd "$IR" && find . | cpio -o -H newc --quiet | gzip -1) > "$WORK/initramfs.cpio.gz"

# 4. Boot under TCG (KVM here is PVM-backed and hangs a stock kernel), bounded by `timeout`.
log "booting linux $ABI under QEMU TCG (timeout ${TIMEOUT} s)"
t_boot=$(now)
set +e
timeout "$TIMEOUT" qemu-system-x86_64 -accel tcg -cpu max -m 512 -smp 2 \
  -kernel "$VMLINUZ" -initrd "$WORK/initramfs.cpio.gz" \
  -append "console=ttyS0 loglevel=3 panic=-1 rdinit=/init" \
  -nographic -no-reboot -monitor none -nic none > "$WORK/console.log" 2>&1
qemu_rc=$?
set -e
t_end=$(now)
tr -d '\r' < "$WORK/console.log" | grep 'RIGD-VM-CAMERA' || true
guest_s=$(secs "$t_boot" "$t_end")
total_s=$(secs "$t_begin" "$t_end")
if [ $qemu_rc = 124 ]; then
  log "the guest did not finish within ${TIMEOUT} s; console: $WORK/console.log"
  tail -20 "$WORK/console.log" >&2
  exit 1
fi
if grep -q 'RIGD-VM-CAMERA DONE ok' "$WORK/console.log" && grep -q 'RIGD-VM-CAMERA EXIT 0' "$WORK/console.log"; then
  echo "camera-vm: passed in $total_s s (guest $guest_s s)"
  exit 0
fi
log "failed (qemu exit $qemu_rc); console: $WORK/console.log"
tail -30 "$WORK/console.log" >&2
exit 1
