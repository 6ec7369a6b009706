#!/usr/bin/env bash
# Is there a PTP hardware clock (PHC) with hardware timestamping anywhere rigd's tests can reach?
# The hosts here have none (no /sys/class/ptp, no ptp_mock/netdevsim). This boots Debian's stock
# kernel under QEMU TCG with each emulated NIC QEMU offers that Linux has a PHC driver for (e1000e:
# Intel 82574L; the e1000 default as a control), and in the guest prints /sys/class/ptp, `ethtool -T`
# two reads of the PHC 1 s apart (`phc_ctl get`), and 8 s of `ptp4l` with hardware timestamping
# (master only) on that NIC: a PHC that really
# timestamps shows ptp4l sending Sync without "timed out while polling for tx timestamp".
# Findings: docs/CLOCK.md ("target = phc"). Needs qemu-system-x86 busybox-static cpio kmod ethtool
# linuxptp; touches no host clock or interface (the guest NIC is QEMU user-mode networking).
#   tests/ptp/phc_vm_probe.sh [NIC...]     default: e1000e e1000
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
CACHE=${RIGD_VM_CACHE:-$HOME/.cache/rigd-vm}
WORK=$ROOT/target/vm-phc
log() { echo "phc-vm: $*" >&2; }
command -v ethtool >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ethtool >&2
. tests/vm/kernel.sh
NICS=("$@"); [ ${#NICS[@]} -gt 0 ] || NICS=(e1000e e1000)
for nic in "${NICS[@]}"; do
  mod=$nic; [ "$nic" = e1000 ] && mod=e1000
  IR=$WORK/$nic/initramfs
  rm -rf "$IR"; mkdir -p "$IR"/{bin,dev,proc,sys,tmp,modules,etc}
  cp /bin/busybox "$IR/bin/busybox"
  for exe in "$(command -v ethtool)" "$(command -v ptp4l)" "$(command -v phc_ctl)"; do
    cp "$exe" "$IR/bin/"
    for lib in $(ldd "$exe" | awk '/=>/ {print $3} /ld-linux/ {print $1}'); do
      mkdir -p "$IR$(dirname "$lib")"; cp -L "$lib" "$IR$lib"
    done
  done
  : > "$IR/modules/order"
  while read -r verb path _; do
    [ "$verb" = insmod ] || continue
    cp "$path" "$IR/modules/"; basename "$path" >> "$IR/modules/order"
  done < <(modprobe -d "$KROOT/root" -S "$ABI" --show-depends "$mod")
  printf '[global]\ntime_stamping hardware\nnetwork_transport L2\nmasterOnly 1\nlogSyncInterval -3\ntx_timestamp_timeout 50\n' > "$IR/etc/ptp4l.cfg"
  cat > "$IR/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in $(cat /modules/order); do insmod /modules/$m; done
sleep 1; ip link set eth0 up; sleep 2
echo "PHC-VM nic driver: $(basename $(readlink /sys/class/net/eth0/device/driver) 2>/dev/null)"
echo "PHC-VM /sys/class/ptp: $(ls /sys/class/ptp 2>/dev/null | tr '\n' ' ')"
for p in /sys/class/ptp/ptp*; do [ -e "$p" ] && echo "PHC-VM $(basename $p) clock_name: $(cat $p/clock_name)"; done
ethtool -T eth0 2>&1 | sed 's/^/PHC-VM ethtool: /'
if [ -e /dev/ptp0 ]; then
  # Does the PHC run? Two reads 1 s apart (phc_ctl only reads here).
  phc_ctl /dev/ptp0 get 2>&1 | sed 's/^/PHC-VM phc_ctl: /'; sleep 1
  phc_ctl /dev/ptp0 get 2>&1 | sed 's/^/PHC-VM phc_ctl: /'
fi
timeout 8 ptp4l -f /etc/ptp4l.cfg -i eth0 -m 2>&1 | head -20 | sed 's/^/PHC-VM ptp4l: /'
echo "PHC-VM done"
poweroff -f
INIT
  chmod +x "$IR/init"
  (cd "$IR" && find . | cpio -o -H newc --quiet | gzip -1) > "$WORK/$nic/initramfs.cpio.gz"
  log "booting with -device $nic"
  timeout 120 qemu-system-x86_64 -accel tcg -cpu max -m 512 -smp 1 \
    -kernel "$VMLINUZ" -initrd "$WORK/$nic/initramfs.cpio.gz" \
    -append "console=ttyS0 loglevel=3 panic=-1 rdinit=/init" \
    -nographic -no-reboot -monitor none -netdev user,id=n0 -device "$nic",netdev=n0 \
    > "$WORK/$nic/console.log" 2>&1 || true
  echo "== -device $nic (QEMU $(qemu-system-x86_64 --version | head -1 | awk '{print $4}'), kernel $ABI)"
  tr -d '\r' < "$WORK/$nic/console.log" | grep '^PHC-VM' || tail -5 "$WORK/$nic/console.log"
done
