"""The spool never destroys what it cannot read (issue 15): a damaged index, a full filesystem,
exhausted file descriptors. The segments are the truth and the index a cache: every record that
was spooled is still stored, published, or counted as dropped/quarantined.

Configs without [pulsar] spool everything and need no broker. The full-disk tests mount their own
tmpfs and need root (skipped without it). The shared broker is used, never stopped."""

import json
import os
import resource
import subprocess
import time
from pathlib import Path

import pulsar
import pytest

from harness import BROKER_URL, Rigd, consume, free_port, namespace_with_dedup, received_seqs, rigd_bin, unique

SOURCES = """
[[source]]
id = "cam"
kind = "synthetic-camera"
width = 160
height = 120
fps = 30
frame-bytes = 20000

[[source]]
id = "mic"
kind = "synthetic-audio"
channels = 1

[[source]]
id = "gps"
kind = "synthetic-serial"
rate-hz = 10
"""


def config(rig, spool="spool", url=None, ns="public/default", extra_spool="", sources=SOURCES):
    pulsar_cfg = f'[pulsar]\nurl = "{url}"\ntopic = "persistent://{ns}/{{rig}}-{{source}}"\n' if url else ""
    return f"""
[rig]
id = "{rig}"
{sources}
{pulsar_cfg}
[spool]
path = "{spool}"
max-bytes = "64MiB"
{extra_spool}

[web]
bind = "127.0.0.1:{{WEB_PORT}}"
"""


def rigd(*args, timeout=120):
    return subprocess.run([rigd_bin(), *map(str, args)], capture_output=True, text=True, timeout=timeout)


def stat(spool: Path) -> dict:
    r = rigd("spool", "stat", "--spool", spool, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def scan_seqs(spool: Path) -> dict:
    """Every valid record in the segments, per source (the truth the index caches)."""
    r = rigd("spool", "stat", "--spool", spool, "--json", "--scan")
    assert r.returncode == 0, r.stderr
    return {s["id"]: s["records"] for s in json.loads(r.stdout)["sources"]}


def records(st: dict) -> int:
    return sum(s["records"] for s in st["sources"])


def capture(tmp_path, seconds=10, rig=None, name="capture"):
    """A rig with no broker captures for `seconds` and stops cleanly: everything is spooled."""
    rig = rig or unique("integ")
    d = Rigd(tmp_path, config(rig), name=name).start()
    try:
        time.sleep(seconds)
        assert d.stop() == 0, d.log()[-3000:]
    finally:
        d.close()
    return rig


@pytest.fixture
def live_broker():
    """The shared broker, used as it runs: the conftest `broker` fixture would (re)start it with
    this checkout's broker.sh, which refuses when the running one was started with another config."""
    import socket
    host, port = BROKER_URL.rsplit("/", 1)[-1].split(":")
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except OSError:
        pytest.skip(f"no broker listening at {BROKER_URL}")
    return BROKER_URL


def damage_index(spool: Path, how: str):
    index = spool / "index"
    db = index / "db"
    if how == "removed":
        subprocess.run(["rm", "-rf", str(index)], check=True)
    elif how == "zeroed":
        db.write_bytes(b"\0" * db.stat().st_size)
    elif how == "truncated":
        db.write_bytes(b"")
    elif how == "flipped":
        data = bytearray(db.read_bytes())
        for i in range(50):
            data[(i * 7919 + 13) % len(data)] ^= 0x5A
        db.write_bytes(bytes(data))
    else:
        raise ValueError(how)


@pytest.mark.parametrize("how", ["removed", "zeroed", "truncated", "flipped"])
def test_a_damaged_index_keeps_every_record_and_numbering_goes_on(tmp_path, how):
    rig = capture(tmp_path)
    spool = tmp_path / "spool"
    before = stat(spool)
    n = records(before)
    assert n > 300, before
    segments = sorted(p.name for p in (spool / "segments").glob("*.seg"))
    damage_index(spool, how)
    # The offline tools see what the daemon will: every record, and verify says the index is damaged.
    after_damage = stat(spool)
    assert records(after_damage) == n, (how, after_damage)
    v = rigd("spool", "verify", "--spool", spool, "--json")
    if how != "flipped":  # sled may recover a consistent earlier state from flipped bytes
        assert v.returncode == 1, (how, v.stdout[-2000:])
        assert json.loads(v.stdout)["index_damage"], v.stdout[-2000:]
    # The daemon starts, keeps every segment and every record, and numbers above them.
    d = Rigd(tmp_path, config(rig), name="after").start()
    try:
        time.sleep(2)
        s = d.status()
        assert s["spool"]["records"] >= n, (how, s["spool"], n)
        # The technician sees it without a shell: status, an alert, and the metric.
        assert s["spool"]["index_damage"], (how, s["spool"])
        assert any("index damaged" in a["text"] for a in s["alerts"]), (how, s["alerts"])
        assert "rigd_spool_index_damaged 1" in d.get("/metrics").decode(), how
        assert d.stop() == 0
    finally:
        d.close()
    left = sorted(p.name for p in (spool / "segments").glob("*.seg"))
    assert set(segments) <= set(left), (how, "segments deleted", segments, left)
    final = stat(spool)
    assert records(final) > n, (how, records(final), n)
    # Sequence numbers never restart at 0: a reused (source, seq) would collapse in the scan.
    counts = scan_seqs(spool)
    for src in final["sources"]:
        assert counts[src["id"]] == src["records"], (how, src, counts)
    v = rigd("spool", "verify", "--spool", spool, "--json")
    assert v.returncode == 0, (how, v.stdout[-2000:])


def test_a_removed_index_drains_to_the_broker_exactly_once(live_broker, tmp_path):
    broker = live_broker
    ns = namespace_with_dedup(unique("integ"))
    rig = unique("integ")
    dead = f"pulsar://127.0.0.1:{free_port()}"  # nothing listens: everything spools
    d = Rigd(tmp_path, config(rig, url=dead, ns=ns), name="outage").start()
    try:
        time.sleep(8)
        assert d.stop() == 0
    finally:
        d.close()
    spool = tmp_path / "spool"
    stored = scan_seqs(spool)
    assert sum(stored.values()) > 200, stored
    damage_index(spool, "removed")
    online = Rigd(tmp_path, config(rig, url=broker, ns=ns), name="online").start()
    try:
        online.wait_for(lambda s: s["uplink"]["connected"] and s["spool"]["records"] == 0, timeout=120,
                        what="the rebuilt spool drained")
        assert online.stop() == 0
    finally:
        online.close()
    for src, n in stored.items():
        msgs = consume(BROKER_URL, [f"persistent://{ns}/{rig}-{src}"], idle_timeout_s=6,
                       consumer_type=pulsar.ConsumerType.Exclusive)
        seqs = [int(m["properties"]["seq"]) for m in msgs]
        assert len(seqs) == len(set(seqs)), f"{src}: duplicates"
        # Every spooled record arrived (0..n-1), in order among themselves; the new run's frames,
        # numbered above the jump, go out live first (drain = "live-first") under their own epoch.
        backlog = [s for s in seqs if s < n]
        assert backlog == list(range(n)), f"{src}: spooled records missing or out of order"
        assert len(seqs) > n, f"{src}: the new run's frames are missing"


def test_a_drained_spool_whose_index_is_lost_publishes_the_next_frames(live_broker, tmp_path):
    """Everything published and acknowledged, the drained segments deleted, then the index is
    removed: the segments hold nothing to number from. Numbering must resume past what the broker
    has (the floor in SEQ), or its deduplication drops the new frames as duplicates."""
    ns = namespace_with_dedup(unique("integ"))
    rig = unique("integ")
    topic = f"persistent://{ns}/{rig}-gps"
    d = Rigd(tmp_path, config(rig, url=live_broker, ns=ns), name="first").start()
    try:
        d.wait_for(lambda s: next(x for x in s["sources"] if x["id"] == "gps")["published"] >= 40,
                   timeout=60, what="40 gps frames published")
        assert d.stop() == 0
    finally:
        d.close()
    first = [int(m["properties"]["seq"]) for m in consume(BROKER_URL, [topic], idle_timeout_s=4,
                                                           consumer_type=pulsar.ConsumerType.Exclusive)]
    assert len(first) >= 40
    damage_index(tmp_path / "spool", "removed")
    d = Rigd(tmp_path, config(rig, url=live_broker, ns=ns), name="second").start()
    try:
        d.wait_for(lambda s: next(x for x in s["sources"] if x["id"] == "gps")["published"] >= 20,
                   timeout=60, what="20 gps frames published")
        published = next(x for x in d.status()["sources"] if x["id"] == "gps")["published"]
        assert d.stop() == 0
    finally:
        d.close()
    seqs = [int(m["properties"]["seq"]) for m in consume(BROKER_URL, [topic], idle_timeout_s=4,
                                                          consumer_type=pulsar.ConsumerType.Exclusive)]
    assert len(seqs) == len(set(seqs)), "duplicates"
    second = [q for q in seqs if q > max(first)]
    # Every frame the second run published reached the topic (none dropped as a duplicate).
    assert len(second) >= published, (len(second), published, max(first), seqs[-5:])


BIG_CAM = """
[[source]]
id = "cam"
kind = "synthetic-camera"
width = 160
height = 120
fps = 30
frame-bytes = 100000

[[source]]
id = "gps"
kind = "synthetic-serial"
rate-hz = 20
"""


class Tmpfs:
    """A tmpfs this test mounts itself (a real full filesystem), unmounted whatever happens."""

    def __init__(self, path: Path, size: str):
        self.path, self.size = path, size

    def __enter__(self):
        self.path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size}", "tmpfs", str(self.path)], check=True)
        return self

    def resize(self, size: str):
        subprocess.run(["mount", "-o", f"remount,size={size}", str(self.path)], check=True)

    def __exit__(self, *exc):
        subprocess.run(["umount", "-l", str(self.path)], check=False)


def sane(status: dict, carried=0):
    """Counters of a run that started with `carried` records in the spool."""
    sp = status["spool"]
    frames = sum(s["frames"] for s in status["sources"]) + carried
    for k in ("records", "bytes", "dropped", "quarantined"):
        assert sp[k] < 1 << 48, (k, sp)  # a wrapped counter is near 2^64
    assert sp["dropped"] <= frames, (sp, frames)
    assert sp["records"] <= frames, (sp, frames)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_reserve_the_filesystem_cannot_keep_is_refused_before_capture(tmp_path):
    """`free-reserve = "0"` (every group commit then fails with ENOSPC on a full disk) and the
    default 256 MiB on a 24 MiB filesystem (every frame dropped) never start: `check` and `run`
    exit 2 naming the key, and no spool is created (issue 16's preflight)."""
    disk = tmp_path / "disk"
    with Tmpfs(disk, "24m"):
        for reserve in ['free-reserve = "0"', ""]:
            cfg = config(unique("reserve"), spool=str(disk / "spool"), extra_spool=reserve, sources=BIG_CAM)
            path = tmp_path / "reserve.toml"
            path.write_text(cfg.replace("{WEB_PORT}", "0"))
            for cmd in (["check", "--config", path], ["run", "--config", path]):
                r = rigd(*cmd)
                # `run`: a reserve below 1 MiB is the config's mistake (2), one the filesystem
                # cannot keep the host's (75: systemd tries again, the disk may be swapped).
                want = 75 if cmd[0] == "run" and not reserve else 2
                assert r.returncode == want, (reserve, cmd, r.returncode, r.stderr)
                assert "spool.free-reserve" in r.stderr, r.stderr
            assert not (disk / "spool").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
@pytest.mark.parametrize("reserve", ['free-reserve = "1MiB"'])
def test_a_full_filesystem_loses_nothing_spooled_and_counters_stay_sane(tmp_path, reserve):
    rig = unique("full")
    disk = tmp_path / "disk"
    cfg = config(rig, spool=str(disk / "spool"), extra_spool=reserve, sources=BIG_CAM)
    with Tmpfs(disk, "24m") as fs:
        d = Rigd(tmp_path, cfg, name="full").start()
        try:
            time.sleep(14)  # ~3 MB/s: the 24 MiB filesystem fills after ~8 s
            s_full = d.status()
            sane(s_full)
            assert d.stop() == 0, d.log()[-3000:]
        finally:
            d.close()
        before = scan_seqs(disk / "spool")
        # The restart on the still-full disk starts, and keeps the intact index where it is.
        again = Rigd(tmp_path, cfg, name="still-full").start()
        try:
            time.sleep(3)
            sane(again.status(), carried=sum(before.values()))
            assert again.stop() == 0, again.log()[-3000:]
        finally:
            again.close()
        assert not list((disk / "spool").glob("index.corrupt-*")), "the intact index was moved aside"
        still = scan_seqs(disk / "spool")
        for src, n in before.items():
            assert still.get(src, 0) >= n if not reserve else True, (src, n, still)
        # Space comes back: nothing spooled is deleted.
        fs.resize("64m")
        back = Rigd(tmp_path, cfg, name="space-back").start()
        try:
            time.sleep(3)
            s = back.status()
            sane(s, carried=sum(still.values()))
            assert back.stop() == 0, back.log()[-3000:]
        finally:
            back.close()
        after = scan_seqs(disk / "spool")
        print(f"full disk ({reserve or 'default reserve'}): first run {s_full['spool']}, records stored "
              f"{before} -> still full {still} -> space back {after}")
        for src, n in still.items():
            assert after.get(src, 0) >= n, (src, n, after)
        st = stat(disk / "spool")
        assert {x["id"]: x["records"] for x in st["sources"]} == after, (st, after)
        v = rigd("spool", "verify", "--spool", disk / "spool", "--json")
        assert v.returncode == 0, v.stdout[-2000:]


@pytest.mark.skipif(os.geteuid() != 0, reason="running the tools as another user needs root")
def test_the_offline_tools_read_a_read_only_copy_as_another_user(tmp_path):
    """Issue 32: `rigd spool verify` as a non-root user on a copy whose files are 0444 said "index
    damaged ... Permission denied" and exited 1: the private copy of the index kept mode 0444 and
    sled could not open it. A data engineer's copy must verify as the spool itself does, and a file
    of it the user may not read is a permission problem, never corruption."""
    import shutil
    import tempfile
    capture(tmp_path, seconds=3)
    truth = stat(tmp_path / "spool")
    # A directory the other user can reach (pytest's tmp_path is root's alone).
    top = Path(tempfile.mkdtemp(prefix="rigd-ro-copy-"))
    try:
        top.chmod(0o755)
        copy = top / "spool"
        shutil.copytree(tmp_path / "spool", copy)
        for p in [copy, *copy.rglob("*")]:
            p.chmod(0o555 if p.is_dir() else 0o444)
        nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", rigd_bin()]
        v = subprocess.run(nobody + ["spool", "verify", "--spool", str(copy), "--json"], capture_output=True,
                           text=True, timeout=120, cwd=top)
        assert v.returncode == 0, (v.stdout[-2000:], v.stderr[-2000:])
        got = json.loads(subprocess.run(nobody + ["spool", "stat", "--spool", str(copy), "--json"], capture_output=True,
                                        text=True, timeout=120, cwd=top, check=True).stdout)
        assert got["sources"] == truth["sources"] and not got.get("index_damage"), (got, truth)
        # A segment the user may not read (a copy with root's 0400 files) is a permission problem,
        # said once with the file's name and exit 77 (EX_NOPERM): before, `verify` listed each of
        # its records as corrupt ("cannot open segment: Permission denied") and exited 1.
        segment = sorted((copy / "segments").glob("*.seg"))[0]
        segment.chmod(0o400)
        for tool in (["spool", "verify"], ["spool", "stat"], ["replay", "--out", str(top / "out")]):
            r = subprocess.run(nobody + tool + ["--spool", str(copy)], capture_output=True, text=True, timeout=120,
                               cwd=top)
            assert r.returncode == 77, (tool, r.stdout[-2000:], r.stderr[-2000:])
            assert str(segment) in r.stderr and "permission problem, not damage" in r.stderr, (tool, r.stderr)
            assert "corrupt" not in (r.stdout + r.stderr).lower(), (tool, r.stdout[-2000:], r.stderr)
    finally:
        for p in [top, *top.rglob("*")]:
            if p.is_dir():
                p.chmod(0o755)
        shutil.rmtree(top)


GPS_50HZ = """
[[source]]
id = "gps"
kind = "synthetic-serial"
rate-hz = 50
"""


def fill(path: Path) -> None:
    """Writes `path` until the filesystem has not one block left (ENOSPC)."""
    import errno
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for size in (1 << 20, 4096, 1):
            while True:
                try:
                    os.write(fd, b"\0" * size)
                except OSError as e:
                    assert e.errno == errno.ENOSPC, e
                    break
    finally:
        os.close(fd)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_after_a_crash_rigd_starts_and_publishes_on_a_full_or_unwritable_spool(live_broker, tmp_path):
    """Issue 31.3. After a kill -9 in `on-outage` mode the next start owes a sequence jump and
    moves the floor in `SEQ` past it. On a full filesystem, or with `SEQ.tmp` a directory so that
    no file can replace `SEQ`, that write was fatal ("reading the sequence number"): systemd
    restart-looped a rig that captured nothing. Now the floor is rewritten in place: each start
    comes up, publishes live, and the official client finds every acknowledged frame once, each
    crashed run's numbers left behind by a jump."""
    ns = namespace_with_dedup(unique("fullcrash"))
    rig = unique("fullcrash")
    disk = tmp_path / "disk"
    spool = disk / "spool"
    cfg = config(rig, spool=str(spool), url=BROKER_URL, ns=ns, extra_spool='free-reserve = "1MiB"',
                 sources=GPS_50HZ)
    acked = 0
    with Tmpfs(disk, "16m"):
        for name in ("first", "full", "unwritable"):
            if name == "full":
                fill(disk / "fill")
                assert os.statvfs(disk).f_bavail == 0
            if name == "unwritable":
                (disk / "fill").unlink()
                (spool / "SEQ.tmp").mkdir()
            d = Rigd(tmp_path, cfg, name=name).start()
            try:
                d.wait_for(lambda s: s["uplink"]["published"] >= 100, timeout=60,
                           what=f"{name}: frames published live")
                # Frames captured before the producer first connects go to the spool, which on
                # the full disk drops them (counted): sane counters, no more.
                s = d.status()
                sane(s)
                acked += s["uplink"]["published"]
                d.kill9()
            finally:
                d.close()
            if name == "full":
                assert "cannot move the sequence floor" not in d.log(), d.log()[-3000:]
    seqs = sorted(received_seqs(f"persistent://{ns}/{rig}-gps"))
    assert len(seqs) == len(set(seqs)), "a frame arrived twice"
    assert len(seqs) >= acked, (len(seqs), acked)
    jumps = sum(1 for a, b in zip(seqs, seqs[1:]) if b - a >= 1 << 19)
    print(f"crash starts on a full/unwritable spool: {len(seqs)} frames received, {acked} acknowledged, {jumps} jumps")
    assert jumps == 2, f"each start after a crash numbers past the crashed run: {jumps} jumps"


@pytest.mark.skipif(os.geteuid() != 0, reason="lowering a running child's RLIMIT_NOFILE with prlimit needs root")
def test_drop_oldest_without_file_descriptors_deletes_nothing_it_did_not_count(tmp_path):
    import socket
    rig = unique("nofile")
    cfg = config(rig, sources=BIG_CAM).replace('max-bytes = "64MiB"', 'max-bytes = "8MiB"')
    d = Rigd(tmp_path, cfg, name="nofile").start()
    conns = []
    try:
        time.sleep(4)  # the 8 MiB spool is full: drop-oldest runs every ~0.3 s from here on
        pid = d.proc.pid
        used = len(os.listdir(f"/proc/{pid}/fd"))
        limit = used + 8
        # The soft limit only: the hard one may not be raised again without CAP_SYS_RESOURCE.
        subprocess.run(["prlimit", f"--pid={pid}", f"--nofile={limit}:"], check=True)
        # Idle web clients take the rest of the descriptors.
        for _ in range(limit):
            try:
                conns.append(socket.create_connection(("127.0.0.1", d.port), timeout=1))
            except OSError:
                break
        time.sleep(6)
        s = d.status()
        sane(s)
        for c in conns:
            c.close()
        conns.clear()
        subprocess.run(["prlimit", f"--pid={pid}", "--nofile=1024:"], check=True)
        time.sleep(2)
        s = d.status()
        assert d.stop() == 0, d.log()[-3000:]
    finally:
        for c in conns:
            c.close()
        d.close()
    spool = tmp_path / "spool"
    listed = stat(spool)
    truth = scan_seqs(spool)
    print(f"fd exhaustion: status {s['spool']}; index lists "
          f"{ {x['id']: x['records'] for x in listed['sources']} }, segments hold {truth}")
    # Every index entry points at a record that is there, and nothing stored is unlisted.
    assert {x["id"]: x["records"] for x in listed["sources"]} == truth, (listed, truth)
    v = rigd("spool", "verify", "--spool", spool, "--json")
    assert v.returncode == 0, v.stdout[-2000:]
    # Status bytes are what the segment files hold, not more.
    on_disk = sum(p.stat().st_size for p in (spool / "segments").glob("*.seg"))
    assert s["spool"]["bytes"] <= on_disk + (2 << 20), (s["spool"], on_disk)
    assert "dropped the newest frame (when-full = drop-newest)" not in d.log()


def test_the_spool_records_its_rig_and_replay_republishes_without_rig(live_broker, tmp_path):
    ns = namespace_with_dedup(unique("rigid"))
    rig = unique("rigid")
    dead = f"pulsar://127.0.0.1:{free_port()}"
    cfg = config(rig, url=dead, ns=ns).replace("[rig]\n", "[rig]\nbucket-ms = 40\n", 1)
    d = Rigd(tmp_path, cfg, name="outage").start()
    try:
        time.sleep(5)
        assert d.stop() == 0
    finally:
        d.close()
    spool = tmp_path / "spool"
    st = stat(spool)
    assert st["rig"] == {"rig": rig, "bucket-ms": 40, "topic": f"persistent://{ns}/{{rig}}-{{source}}"}, st
    human = rigd("spool", "stat", "--spool", spool)
    assert f"rig {rig} (bucket 40 ms" in human.stdout, human.stdout
    r = rigd("replay", "--spool", spool, "--pulsar", live_broker, "--json", timeout=180)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    for src in st["sources"]:
        msgs = consume(BROKER_URL, [f"persistent://{ns}/{rig}-{src['id']}"], idle_timeout_s=6,
                       consumer_type=pulsar.ConsumerType.Exclusive)
        assert len(msgs) == src["records"], (src, len(msgs))
        assert all(m["properties"]["rig"] == rig and m["properties"]["bucket-ms"] == "40" for m in msgs)
