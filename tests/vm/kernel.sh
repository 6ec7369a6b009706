# Sourced by the busybox-initramfs guests (tests/vm/camera.sh, tests/vm/clock.sh): Debian's stock
# kernel, the ABI linux-image-amd64 points at (a cached one when apt cannot say), unpacked and
# depmod'ed once under $CACHE/kernel-<abi>. Needs CACHE and log(); sets SUDO, ABI, KROOT, VMLINUZ.
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo -n"
kernel_abi() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{sub("linux-image-","",$2); print $2; exit}' || true; }
ABI=$(kernel_abi)
if [ -z "$ABI" ] && ! ls -d "$CACHE"/kernel-*/.done >/dev/null 2>&1; then
  $SUDO apt-get update -qq >&2 2>&1 || true   # a fresh machine may have no package lists yet
  ABI=$(kernel_abi)
fi
if [ -z "$ABI" ]; then
  ABI=$(ls -d "$CACHE"/kernel-*/.done 2>/dev/null | head -1 | sed 's|.*/kernel-||; s|/.done||' || true)
  [ -n "$ABI" ] || { log "cannot tell the kernel ABI (apt-cache depends linux-image-amd64) and nothing is cached"; exit 1; }
fi
KROOT=$CACHE/kernel-$ABI
if [ ! -f "$KROOT/.done" ]; then
  log "fetching linux-image-$ABI into $KROOT"
  rm -rf "$KROOT"; mkdir -p "$KROOT/deb"
  (cd "$KROOT/deb" && apt-get download "linux-image-$ABI" 2>&1 | grep -v '^W: Download is performed unsandboxed' >&2) || true
  DEB=$(ls "$KROOT"/deb/linux-image-"$ABI"_*.deb 2>/dev/null) || { log "apt-get download linux-image-$ABI failed"; exit 1; }
  dpkg-deb -x "$DEB" "$KROOT/root"
  rm -f "$DEB"
  depmod -b "$KROOT/root" "$ABI"   # the package ships no modules.dep
  touch "$KROOT/.done"
fi
VMLINUZ=$KROOT/root/boot/vmlinuz-$ABI
