"""Issue 46.8: after a crash, a full disk costs everything held and buys nothing.

A rig that crashed (kill -9) restarts on a filesystem another file has filled: sled cannot open
the index, so that run works on a temporary one rebuilt from the segments. Before the fix, its
first frame found the spool "full" and drop-oldest deleted every record it held
("records=243"), yet stored none of the frames it captured after (`spooled=0`); and the on-disk
index it could not open still named the deleted records, so after a clean SIGTERM
`rigd spool verify` exited 1 ("its segment file is gone").

Now records held are deleted only to make room that is then used (docs/SPOOL.md, "A full
disk"): what the crashed run held is still held after the full-disk run, and the index and the
segments agree after its clean exit, and once space is back the next start opens that index
and finds every record it names. No broker: without [pulsar] everything is spooled. Needs
root for the tmpfs mount (skipped without it); unmounted in a finally."""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from harness import Rigd, rigd_bin, unique
from test_spool_integrity import BIG_CAM, Tmpfs, fill

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


def config(rig: str, spool: Path) -> str:
    return f"""
[rig]
id = "{rig}"
{BIG_CAM}
[spool]
path = "{spool}"
free-reserve = "1MiB"

[web]
bind = "127.0.0.1:{{WEB_PORT}}"
"""


def rigd(*args, timeout=120):
    return subprocess.run([rigd_bin(), *map(str, args)], capture_output=True, text=True, timeout=timeout)


def held(spool: Path) -> dict:
    """Records per source, as `rigd spool stat --json` counts them."""
    r = rigd("spool", "stat", "--spool", spool, "--json")
    assert r.returncode == 0, r.stderr
    return {s["id"]: s["records"] for s in json.loads(r.stdout)["sources"]}


def test_a_crash_then_a_full_disk_keeps_what_was_held_and_the_index_agrees(tmp_path):
    rig = unique("fullafter")
    disk = tmp_path / "disk"
    spool = disk / "spool"
    cfg = config(rig, spool)
    with Tmpfs(disk, "32m"):
        d = Rigd(tmp_path, cfg, name="crashed").start()
        try:
            time.sleep(6)  # ~3 MB/s of camera: about 18 MB held in the spool
            d.kill9()
        finally:
            d.close()
        # Another file takes every block left.
        fill(disk / "fill")
        assert os.statvfs(disk).f_bavail == 0
        before = held(spool)
        assert sum(before.values()) > 100, before
        d = Rigd(tmp_path, cfg, name="full").start()
        try:
            d.wait_for(lambda s: sum(x["frames"] for x in s["sources"]) >= 150, timeout=30,
                       what="frames captured on the full disk")
            status = d.status()
            assert d.stop() == 0, d.log()[-3000:]
        finally:
            d.close()
        log = d.log()
        after = held(spool)
        print(f"crash then full disk: held {before} before, {after} after; run: {status['spool']}")
        for source, n in before.items():
            assert after.get(source, 0) >= n, (f"{source}: {n} records held before the full-disk run, "
                                               f"{after.get(source, 0)} after", log[-3000:])
        # The index on disk names no record that is gone, nor one whose bytes are another's.
        v = rigd("spool", "verify", "--spool", spool, "--json")
        assert v.returncode == 0, (v.stdout[-2000:], v.stderr[-2000:])
        assert "dropped the oldest segment" not in log, log[-3000:]
        # Space back: the next start opens the index on disk, which names no record that is gone.
        (disk / "fill").unlink()
        d = Rigd(tmp_path, cfg, name="space-back").start()
        try:
            back = d.status()["spool"]
            assert d.stop() == 0, d.log()[-3000:]
        finally:
            d.close()
        assert back["quarantined"] == 0 and back["records"] >= sum(before.values()), (back, before)
        assert "its segment is gone" not in d.log(), d.log()[-3000:]
        v = rigd("spool", "verify", "--spool", spool, "--json")
        assert v.returncode == 0, (v.stdout[-2000:], v.stderr[-2000:])
