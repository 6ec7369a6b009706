"""Vehicle in a box: tests/vm/vehicle.sh boots a Debian guest (systemd as PID 1, the rigd .deb,
vivid, snd-aloop and a host-fed 8250 UART) under QEMU TCG against this run's broker, and judges
what reached the broker with the official Python client: frames of every device, the web UI, a
network cut that spools and drains, the watchdog restarting a SIGSTOPped daemon, config faults (a bad
key stops the unit, a late token file and a late spool disk are retried until they appear), a power cut (QEMU
killed) in `always` mode with a reboot from the same disk, and every (source, seq) exactly once.
The guest image is cached in ~/.cache/rigd-vm: the first run debootstraps it (a few minutes)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time

import pytest

from harness import ROOT

pytestmark = pytest.mark.vm  # a QEMU guest: the vm lane, one at a time

SCRIPT = ROOT / "tests/vm/vehicle.sh"
VM_PACKAGES = ["debootstrap", "qemu-system-x86", "qemu-utils", "e2fsprogs", "socat", "curl"]
CHECKS = [
    "service active",
    "frames of vivid, snd-aloop and the UART reach the host's broker",
    "web UI answers with the three devices running",
    "network cut of 20 s: the spool grows, then drains",
    "watchdog restarts a SIGSTOPped daemon",
    "config faults: a bad key stops the unit (no restart)",
    "power cut (SIGKILL of QEMU) during a network cut",
    "every (source, seq) on the broker exactly once",
]


def ensure_vm_tools() -> None:
    """Installs QEMU and debootstrap when missing; skips only when they cannot be installed (or
    without root, which debootstrap and chroot need)."""
    if os.geteuid() != 0:
        pytest.skip("vehicle.sh needs root (debootstrap, chroot, dpkg -i into the guest tree)")
    if all(shutil.which(t) for t in ["qemu-system-x86_64", "debootstrap", "mkfs.ext4", "socat", "curl"]):
        return
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    out = subprocess.run(sudo + ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *VM_PACKAGES],
                         capture_output=True, text=True, env=env)
    if out.returncode != 0 or not (shutil.which("qemu-system-x86_64") and shutil.which("debootstrap")):
        pytest.skip(f"QEMU/debootstrap cannot be installed here (apt-get install {' '.join(VM_PACKAGES)} "
                    f"failed: {out.stderr.strip()[-300:]})")


def test_vehicle_in_a_box(broker):
    ensure_vm_tools()
    t = time.monotonic()
    out = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=1500,
                         env=dict(os.environ, PULSAR_URL=broker))
    took = time.monotonic() - t
    lines = [line for line in out.stderr.splitlines() if line.startswith("vehicle: ")]
    print("\n".join(lines))
    print(f"tests/vm/vehicle.sh took {took:.1f} s")
    assert out.returncode == 0, f"vehicle.sh exit {out.returncode}\n" + "\n".join(lines[-60:]) + \
        f"\n{out.stderr[-3000:]}"
    text = "\n".join(lines)
    assert "FAIL:" not in text
    for check in CHECKS:
        assert re.search(r"^vehicle: PASS: " + re.escape(check), text, re.M), f"no PASS for {check!r}\n{text}"
    assert "vehicle: all checks passed" in text
