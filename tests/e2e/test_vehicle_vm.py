"""Vehicle in a box: tests/vm/vehicle.sh boots a Debian guest (systemd as PID 1, the rigd .deb,
vivid, snd-aloop, a host-fed 8250 UART and a vcan CAN bus) under QEMU TCG against this run's broker,
and judges what reached the broker with the official Python client: frames of every device, the web
UI, the CAN bus (canplayer at 2,000 frames/s: every frame as candump logged it, kernel filters, CAN FD;
the interface down and up: retried, resumed), a
network cut that spools and drains, the watchdog restarting a SIGSTOPped daemon, config faults (a bad
key stops the unit, a late token file and a late spool disk are retried until they appear), a power cut (QEMU
killed) in `always` mode with a reboot from the same disk, and every (source, seq) exactly once.
The guest image is cached in ~/.cache/rigd-vm: the first run debootstraps it (a few minutes).

The same script and checks run on an aarch64 guest (`RIGD_VM_ARCH=arm64`: QEMU `virt`, the
cross-built arm64 .deb): `test_vehicle_in_a_box_arm64`, marked `arm64`, the named group
`RIGD_LANES=arm64 tests/run.sh` that CI leaves out (docs/TESTING.md gives its time)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time

import pytest

from harness import ROOT

SCRIPT = ROOT / "tests/vm/vehicle.sh"
VM_PACKAGES = ["debootstrap", "qemu-system-x86", "qemu-utils", "e2fsprogs", "socat", "curl"]
CHECKS = [
    "service active",
    "frames of vivid, snd-aloop and the UART reach the host's broker",
    "web UI answers with the four devices running",
    "CAN: canplayer at 2,000 frames/s on vcan0",
    "CAN: vcan0 down then up: the CAN sources retry and say why, then resume",
    "CAN: a drive replayed: rigd replay --out writes candump's log, canplayer plays it onto vcan1",
    "network cut of 20 s: the spool grows, then drains",
    "watchdog restarts a SIGSTOPped daemon",
    "config faults: a bad key stops the unit (no restart)",
    "power cut (SIGKILL of QEMU) during a network cut",
    "every (source, seq) on the broker exactly once",
]


def ensure_vm_tools(arch: str) -> None:
    """Installs QEMU and debootstrap when missing (for arm64: `tests/setup.sh --cross arm64`, the
    cross toolchain and qemu-user's binfmt handler too); skips only when they cannot be installed
    (or without root, which debootstrap and chroot need)."""
    if os.geteuid() != 0:
        pytest.skip("vehicle.sh needs root (debootstrap, chroot, dpkg -i into the guest tree)")
    if arch != "amd64":
        out = subprocess.run([str(ROOT / "tests/setup.sh"), "--cross", arch], capture_output=True, text=True)
        if out.returncode != 0:
            pytest.skip(f"tests/setup.sh --cross {arch} failed: {out.stderr.strip()[-300:]}")
        return
    if all(shutil.which(t) for t in ["qemu-system-x86_64", "debootstrap", "mkfs.ext4", "socat", "curl"]):
        return
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    out = subprocess.run(sudo + ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *VM_PACKAGES],
                         capture_output=True, text=True, env=env)
    if out.returncode != 0 or not (shutil.which("qemu-system-x86_64") and shutil.which("debootstrap")):
        pytest.skip(f"QEMU/debootstrap cannot be installed here (apt-get install {' '.join(VM_PACKAGES)} "
                    f"failed: {out.stderr.strip()[-300:]})")


def vehicle(broker: str, arch: str) -> None:
    ensure_vm_tools(arch)
    t = time.monotonic()
    out = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=2400,
                         env=dict(os.environ, PULSAR_URL=broker, RIGD_VM_ARCH=arch))
    took = time.monotonic() - t
    lines = [line for line in out.stderr.splitlines() if line.startswith("vehicle: ")]
    print("\n".join(lines))
    print(f"RIGD_VM_ARCH={arch} tests/vm/vehicle.sh took {took:.1f} s")
    assert out.returncode == 0, f"vehicle.sh exit {out.returncode}\n" + "\n".join(lines[-60:]) + \
        f"\n{out.stderr[-3000:]}"
    text = "\n".join(lines)
    assert "FAIL:" not in text
    for check in CHECKS:
        assert re.search(r"^vehicle: PASS: " + re.escape(check), text, re.M), f"no PASS for {check!r}\n{text}"
    assert "vehicle: all checks passed" in text


@pytest.mark.vm  # a QEMU guest: the vm lane, one at a time
def test_vehicle_in_a_box(broker):
    vehicle(broker, "amd64")


@pytest.mark.arm64  # the aarch64 guest: the `arm64` group, outside CI (docs/TESTING.md)
def test_vehicle_in_a_box_arm64(broker):
    vehicle(broker, "arm64")
