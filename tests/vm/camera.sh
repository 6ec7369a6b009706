#!/usr/bin/env bash
# The V4L2 camera driver on a real kernel driver: Debian's stock kernel with vivid, booted from a
# busybox initramfs under QEMU TCG (never KVM), runs the static `v4l_probe` example
# (drivers/examples/v4l_probe.rs) against /dev/video0, and its multi-planar checks against
# /dev/video1 (vivid's second device, loaded with multiplanar=2). With v4l2loopback (built from
# Debian's v4l2loopback-dkms): MJPEG passthrough on /dev/video10, and H.264 passthrough on
# /dev/video11 of a libx264 clip the host makes (tests/vm/h264_clip.py, PyAV; copied into the
# initramfs, and kept in target/vm-camera/h264 for the host to compare with what the guest printed).
#   tests/vm/camera.sh        exit 0 when every guest check passed; prints the guest's
#                             `RIGD-VM-CAMERA ...` lines and `camera-vm: passed in N s`
# Cache: $RIGD_VM_CACHE (default ~/.cache/rigd-vm)/kernel-<abi>: the kernel package, unpacked and
# depmod'ed once. Work files: target/vm-camera. Needs qemu-system-x86 busybox-static cpio kmod
# (tests/setup.sh installs them) and the musl target (added with rustup when missing).
# RIGD_VM_TIMEOUT (default 150 s) bounds the guest. RIGD_VM_CAMERA_ONLY=PREFIX runs only the probe's
# checks whose names start with PREFIX (to iterate on one; the run then does not pass as a whole).
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
[ -z "$LOOP_SKIP" ] || log "MJPEG and H.264 passthrough checks skipped: $LOOP_SKIP"

# 1b'. vicodec (cached) for the M2M encoder checks. Debian's kernel has neither vicodec nor the
# v4l2-mem2mem core it needs (CONFIG_V4L2_MEM2MEM_DEV is off: no driver of that config uses it), so
# both are built out of tree, in one folder, from linux-source-6.1 of the kernel's own version
# (only vicodec's folder and v4l2-mem2mem.c are taken out of the 140 MB tarball; the .deb is
# deleted after) against linux-headers-$ABI. Without them the m2m checks print SKIP and why.
VIC=$CACHE/vicodec-$ABI
M2M_SKIP=""
if [ ! -f "$VIC/vicodec.ko" ] || [ ! -f "$VIC/v4l2-mem2mem.ko" ]; then
  HDR=/usr/src/linux-headers-$ABI
  if [ ! -d "$HDR" ]; then
    log "installing linux-headers-$ABI (to build vicodec)"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "linux-headers-$ABI" >&2 2>&1 || true
  fi
  if [ -d "$HDR" ] && command -v make >/dev/null && command -v gcc >/dev/null && command -v xz >/dev/null; then
    mkdir -p "$VIC/deb"
    if ! ls "$VIC"/deb/linux-source-6.1_*.deb >/dev/null 2>&1; then
      KVER=$(apt-cache show "linux-image-$ABI" 2>/dev/null | awk '/^Version:/{print $2; exit}')
      log "fetching linux-source-6.1 ${KVER:-(newest)} (140 MB, once) to build vicodec"
      (cd "$VIC/deb" && { apt-get download "linux-source-6.1${KVER:+=$KVER}" 2>&1 || apt-get download linux-source-6.1 2>&1; } \
        | grep -v '^W: Download is performed unsandboxed' >&2) || true
    fi
    DEB=$(ls "$VIC"/deb/linux-source-6.1_*.deb 2>/dev/null | head -1 || true)
    if [ -n "$DEB" ]; then
      rm -rf "$VIC/src" "$VIC/build"; mkdir -p "$VIC/src" "$VIC/build"
      dpkg-deb --fsys-tarfile "$DEB" | tar -xO --wildcards './usr/src/linux-source-*.tar.xz' \
        | tar -xJ -C "$VIC/src" --wildcards '*/drivers/media/test-drivers/vicodec/*' '*/drivers/media/v4l2-core/v4l2-mem2mem.c' \
        || true
      cp "$VIC"/src/*/drivers/media/test-drivers/vicodec/* "$VIC"/src/*/drivers/media/v4l2-core/v4l2-mem2mem.c "$VIC/build/" 2>/dev/null || true
      if [ -f "$VIC/build/vicodec-core.c" ] && [ -f "$VIC/build/v4l2-mem2mem.c" ]; then
        echo 'obj-m += v4l2-mem2mem.o' >> "$VIC/build/Makefile"   # vicodec's own Makefile, plus the core
        if make -C "$HDR" M="$VIC/build" CONFIG_VIDEO_VICODEC=m modules >"$VIC/build.log" 2>&1; then
          cp "$VIC/build/vicodec.ko" "$VIC/build/v4l2-mem2mem.ko" "$VIC/"
          rm -rf "$VIC/deb" "$VIC/src"
        else
          M2M_SKIP="vicodec did not build against linux-headers-$ABI (see $VIC/build.log)"
        fi
      else
        M2M_SKIP="linux-source-6.1 ($DEB) has no drivers/media/test-drivers/vicodec or v4l2-mem2mem.c"
      fi
    else
      M2M_SKIP="apt-get download linux-source-6.1 failed"
    fi
  else
    M2M_SKIP="no linux-headers-$ABI, make, gcc or xz to build vicodec"
  fi
fi
[ -z "$M2M_SKIP" ] || log "M2M encoder checks skipped: $M2M_SKIP"

# 1c. The H.264 clip for the passthrough check (libx264 through PyAV; skipped without them).
H264_ARG=""
rm -rf "$WORK/h264"
if [ -f "$LOOP_KO" ]; then
  mkdir -p "$WORK"
  if python3 tests/vm/h264_clip.py "$WORK/h264" >&2; then
    H264_ARG="--h264 /dev/video11 /h264"
  else
    log "H.264 passthrough check skipped: tests/vm/h264_clip.py could not make the clip (PyAV with libx264)"
  fi
fi

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
[ -z "$H264_ARG" ] || cp -r "$WORK/h264" "$IR/h264"
: > "$IR/modules/order"
while read -r verb path _; do
  [ "$verb" = insmod ] || continue
  cp "$path" "$IR/modules/"
  basename "$path" >> "$IR/modules/order"
done < <(modprobe -d "$KROOT/root" -S "$ABI" --show-depends vivid)
grep -q '^vivid.ko$' "$IR/modules/order" || { log "vivid.ko not found in linux-image-$ABI"; exit 1; }
# vicodec after v4l2-mem2mem, after the stock modules both need (modinfo's depends, in modprobe's
# order); loaded single-planar, the probe reloads it multi-planar for its second check.
M2M_ARG=""
if [ -z "$M2M_SKIP" ]; then
  for dep in $( { modinfo -F depends "$VIC/v4l2-mem2mem.ko"; modinfo -F depends "$VIC/vicodec.ko"; } | tr ',' ' '); do
    case $dep in v4l2_mem2mem|v4l2-mem2mem) continue;; esac
    while read -r verb path _; do
      [ "$verb" = insmod ] || continue
      grep -qx "$(basename "$path")" "$IR/modules/order" && continue
      cp "$path" "$IR/modules/"; basename "$path" >> "$IR/modules/order"
    done < <(modprobe -d "$KROOT/root" -S "$ABI" --show-depends "$dep")
  done
  cp "$VIC/v4l2-mem2mem.ko" "$VIC/vicodec.ko" "$IR/modules/"
  printf 'v4l2-mem2mem.ko\nvicodec.ko\n' >> "$IR/modules/order"
  M2M_ARG="--m2m /modules/vicodec.ko"
fi
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
    v4l2loopback.ko) args="devices=2 video_nr=10,11 card_label=rigd-loopback,rigd-h264";;
    *) args="";;
  esac
  insmod /modules/\$m \$args || echo "RIGD-VM-CAMERA FAIL insmod \$m"
done
i=0; while [ ! -e /dev/video0 ] && [ \$i -lt 50 ]; do sleep 0.1; i=\$((i+1)); done
echo; echo "RIGD-VM-CAMERA BOOTED uptime \$(cut -d' ' -f1 /proc/uptime) s, kernel \$(uname -r)"
i=0; while [ ! -e /dev/video1 ] && [ \$i -lt 50 ]; do sleep 0.1; i=\$((i+1)); done
[ -z "$M2M_SKIP" ] || echo "RIGD-VM-CAMERA SKIP m2m: $M2M_SKIP"
/bin/v4l_probe --mplane /dev/video1 $H264_ARG $M2M_ARG ${RIGD_VM_CAMERA_ONLY:+--only $RIGD_VM_CAMERA_ONLY} /dev/video0 $LOOP_ARG
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
