"""The V4L2 camera driver against a real kernel driver: tests/vm/camera.sh boots Debian's stock
kernel with vivid under QEMU TCG and runs drivers/examples/v4l_probe.rs inside. This asserts on the
guest's marker lines: YUYV frames by card name (valid JPEGs of the negotiated size, mapped monotonic
stamps, every sequence number a frame or a counted drop), vivid's dropped buffers counted, and a
simulated unplug reopened; multi-planar capture (vivid's second device, `multiplanar=2`) of NV12M,
NV12 and YUYV with pictures that match; and, when v4l2loopback could be built (linux-headers of the guest kernel),
MJPEG passthrough byte for byte with half-written JPEGs rejected and counted."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time

import pytest

from harness import ROOT

pytestmark = pytest.mark.vm  # a QEMU guest: the vm lane, one at a time

SCRIPT = ROOT / "tests/vm/camera.sh"
VM_PACKAGES = ["qemu-system-x86", "busybox-static", "cpio", "kmod"]


def ensure_qemu() -> None:
    """Installs the VM packages when missing; skips only when they cannot be installed."""
    if shutil.which("qemu-system-x86_64") and os.path.exists("/bin/busybox") and shutil.which("cpio"):
        return
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    out = subprocess.run(sudo + ["apt-get", "install", "-y", "-qq", "--no-install-recommends",
                                 *VM_PACKAGES], capture_output=True, text=True, env=env)
    if out.returncode != 0 or not shutil.which("qemu-system-x86_64"):
        pytest.skip(f"QEMU cannot be installed here (apt-get install {' '.join(VM_PACKAGES)} "
                    f"failed: {out.stderr.strip()[-300:]})")


def test_v4l_capture_on_vivid_in_a_qemu_guest():
    ensure_qemu()
    t = time.monotonic()
    out = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=600)
    took = time.monotonic() - t
    lines = [line for line in out.stdout.splitlines() if "RIGD-VM-CAMERA" in line]
    print("\n".join(lines))
    print(f"tests/vm/camera.sh took {took:.1f} s")
    assert out.returncode == 0, f"camera.sh exit {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    text = "\n".join(lines)
    assert "RIGD-VM-CAMERA DONE ok" in text
    assert "RIGD-VM-CAMERA FAIL" not in text

    yuyv = re.search(r"PASS yuyv card=`([^`]+)` negotiated=`YUYV (\d+)x(\d+) @ ([0-9.]+) fps, (\d+) buffers` "
                     r"frames=(\d+) drops=(\d+)", text)
    assert yuyv, text
    assert yuyv.group(1) == "vivid"
    assert int(yuyv.group(2)) > 0 and int(yuyv.group(3)) > 0
    assert float(yuyv.group(4)) > 0
    assert int(yuyv.group(6)) >= 20

    drops = re.search(r"PASS drops frames=(\d+) lost=(\d+)", text)
    assert drops and int(drops.group(2)) > 0, text

    reopen = re.search(r"PASS reopen streams=(\d+)", text)
    assert reopen and int(reopen.group(1)) >= 2, text

    if "SKIP mjpeg" not in text:
        mjpeg = re.search(r"PASS mjpeg negotiated=`MJPG (\d+)x(\d+) .*` written=(\d+) \(cut (\d+)\) "
                          r"frames=(\d+) identical=all rejected=(\d+)", text)
        assert mjpeg, text
        assert int(mjpeg.group(5)) >= int(mjpeg.group(3)) // 2
        assert int(mjpeg.group(6)) >= 1

    # vivid's second device is loaded with multiplanar=2: the multi-planar API only. NV12M (two
    # planes, joined for the encoder), NV12 and YUYV each streamed, and the two NV12 pictures match
    # the YUYV one (the probe compares decoded pixels of the same test pattern).
    assert "SKIP mplane" not in text, "camera.sh must give the probe its multi-planar device"
    mplane = re.search(r"PASS mplane YUYV `YUYV (\d+)x(\d+) [^`]*` frames=(\d+) drops=(\d+) jpeg=(\d+)B"
                       r" \| NV12M `NV12M (\d+)x(\d+) [^`]*` frames=(\d+) drops=(\d+) jpeg=(\d+)B vs-YUYV=([0-9.]+)"
                       r" \| NV12 `NV12 (\d+)x(\d+) [^`]*` frames=(\d+) drops=(\d+) jpeg=(\d+)B vs-YUYV=([0-9.]+)",
                       text)
    assert mplane, text
    g = mplane.groups()
    assert g[0:2] == g[5:7] == g[11:13], "all three formats at the same size"
    for frames in (g[2], g[7], g[13]):
        assert int(frames) >= 10
    assert float(g[10]) <= 12.0 and float(g[16]) <= 12.0
