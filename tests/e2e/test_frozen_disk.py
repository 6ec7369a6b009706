"""A spool disk that stops answering (fsfreeze of a loop-mounted ext4 the test makes): the lanes
block in their spool calls, but those run off the runtime's workers, so the web UI keeps answering
(before, /healthz timed out for as long as the disk was frozen). After the thaw rigd stops cleanly
and the spool verifies. Needs root (loop mount, fsfreeze); everything is undone in finally."""

import os
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from harness import Rigd, rigd_bin, unique

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="loop mounts and fsfreeze need root")

CONFIG = """
[rig]
id = "{rig}"

[[source]]
id = "cam"
kind = "synthetic-camera"
width = 320
height = 240
fps = 30

[[source]]
id = "mic"
kind = "synthetic-audio"

[[source]]
id = "gps"
kind = "synthetic-serial"
rate-hz = 50

[spool]
path = "{spool}"
free-reserve = "1MiB"

[web]
bind = "127.0.0.1:{{WEB_PORT}}"
"""


def answers(url, timeout=2.0):
    """Seconds the request took, or None when it got no answer in time."""
    t0 = time.time()
    try:
        urllib.request.urlopen(url, timeout=timeout).read()
    except urllib.error.HTTPError:
        pass  # an answer (e.g. 503 while a lane is stuck) is what counts
    except OSError:
        return None
    return time.time() - t0


def test_a_frozen_spool_disk_does_not_freeze_the_web_ui(tmp_path):
    img, mnt = tmp_path / "spool.img", tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["truncate", "-s", "256M", str(img)], check=True)
    subprocess.run(["mkfs.ext4", "-q", str(img)], check=True)
    subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], check=True)
    frozen = False
    d = Rigd(tmp_path, CONFIG.format(rig=unique("freeze"), spool=mnt / "spool"))
    try:
        d.start()
        d.wait_for(lambda s: s["spool"]["records"] > 50, timeout=30, what="spooling")
        subprocess.run(["fsfreeze", "--freeze", str(mnt)], check=True)
        frozen = True
        worst = 0.0
        for _ in range(16):  # 8 s frozen
            for path in ["/healthz", "/api/status"]:
                took = answers(d.url(path))
                assert took is not None, f"{path} did not answer while the spool disk was frozen"
                worst = max(worst, took)
            time.sleep(0.5)
        print(f"slowest answer while frozen: {worst * 1000:.0f} ms")
        subprocess.run(["fsfreeze", "--unfreeze", str(mnt)], check=True)
        frozen = False
        d.wait_for(lambda s: s["spool"]["records"] > 0, timeout=10, what="status after the thaw")
        assert d.stop() == 0
    finally:
        if frozen:
            subprocess.run(["fsfreeze", "--unfreeze", str(mnt)])
        d.close()
        subprocess.run(["umount", str(mnt)])
    subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], check=True)
    try:
        v = subprocess.run([rigd_bin(), "spool", "verify", "--spool", str(mnt / "spool")],
                           capture_output=True, text=True)
        assert v.returncode == 0, v.stdout + v.stderr
    finally:
        subprocess.run(["umount", str(mnt)])
