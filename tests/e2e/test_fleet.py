"""The fleet's coverage index (issue 51.2, docs/FLEET.md): ten real rigd rigs, each with an
on-request camera and a real serial GPS (a pty fed RMC sentences by the test at 5 Hz: rig A parked at
P1, rigs B, D, E, F, G parked at P2 ~5 km away, rigs H, I, J at P3 ~16 km away, rig C at P1 until
t+5 s, then driving straight to P2, there at t+11 s), publish their digests to one coverage topic; 1,000 synthetic rigs' digests (made with
rigd's own code, `rigd fleet synth-digests`, around Berlin) are published to it with the official
client. The broker compacts the topic (admin REST), the official reader with `is_read_compacted`
sees one message per rig, and `rigd fleet coverage` answers place-and-time queries with exactly the
rigs and ranges the test knows: A's camera over the whole window, C's until it left the circle (to
within the GPS's stamping, 0.25 s), nobody else. `rigd fleet recall` over a window when only A was
there asks A alone; the frames that arrive (official client) are A's camera in the window, each once.

Each `rigd fleet coverage` is timed (process start to exit, 1,003 digests): the figure goes to
docs/PERFORMANCE.md ("Fleet coverage"), not into an assert.
"""

import json
import os
import subprocess
import threading
import time
import tty as tty_module
import urllib.error

import pulsar
import pytest

from harness import BROKER_URL, Rigd, admin, consume, namespace_with_dedup, rigd_bin, unique

S = 1_000_000_000
P1 = (48.1370, 11.5750)
P2 = (48.1800, 11.6200)
P3 = (48.0500, 11.4000)
# Where each real rig is parked (C drives: where_c).
PARKED = {"a": P1, "b": P2, "d": P2, "e": P2, "f": P2, "g": P2, "h": P3, "i": P3, "j": P3}
RADIUS = 300.0
GPS_HZ = 5
# Rig C: leaves P1 at t+LEAVE, reaches P2 at t+ARRIVE (straight, constant speed).
LEAVE, ARRIVE = 5.0, 11.0
# The query window, from the GPS's start: every rig runs and holds its camera all through it.
W1, W2 = 1.0, 13.0
RUN = 16.0


def checksum(body: str) -> str:
    x = 0
    for ch in body.encode():
        x ^= ch
    return f"${body}*{x:02X}"


def rmc(lat: float, lon: float, t: float) -> str:
    g = time.gmtime(t)
    hhmmss = time.strftime("%H%M%S", g) + f".{int(t * 100) % 100:02d}"
    la, lo = abs(lat), abs(lon)
    lat_s = f"{int(la):02d}{(la - int(la)) * 60:07.4f}"
    lon_s = f"{int(lo):03d}{(lo - int(lo)) * 60:07.4f}"
    return checksum(f"GPRMC,{hhmmss},A,{lat_s},{'N' if lat >= 0 else 'S'},{lon_s},"
                    f"{'E' if lon >= 0 else 'W'},0.0,0.0,{time.strftime('%d%m%y', g)},,,A")


def where_c(dt: float) -> tuple[float, float]:
    """Rig C's position `dt` seconds after the GPS started."""
    s = min(max((dt - LEAVE) / (ARRIVE - LEAVE), 0.0), 1.0)
    return (P1[0] + s * (P2[0] - P1[0]), P1[1] + s * (P2[1] - P1[1]))


def crossing(centre, inside_first: bool) -> float:
    """When (s after the GPS start) C crosses the circle of RADIUS around `centre` (bisection on
    the haversine along its straight way)."""
    import math

    def dist(dt):
        lat, lon = where_c(dt)
        p1, p2 = math.radians(centre[0]), math.radians(lat)
        a = (math.sin((p2 - p1) / 2) ** 2
             + math.cos(p1) * math.cos(p2) * math.sin(math.radians(lon - centre[1]) / 2) ** 2)
        return 2 * 6_371_008.8 * math.asin(math.sqrt(a))

    lo, hi = LEAVE, ARRIVE
    for _ in range(60):
        mid = (lo + hi) / 2
        if (dist(mid) <= RADIUS) == inside_first:
            lo = mid
        else:
            hi = mid
    return lo


class Gps:
    """A serial GPS on a pty: RMC sentences at GPS_HZ from `where(dt)`."""

    def __init__(self, where):
        self.master, self.slave = os.openpty()
        tty_module.setraw(self.slave)
        self.device = os.ttyname(self.slave)
        self.where = where
        # (due, written) of each sentence, s after t0: how late this feeder itself ran.
        self.written: list[tuple[float, float]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.feed, daemon=True)

    def start(self, t0: float):
        self.t0 = t0
        self.thread.start()

    def feed(self):
        n = 0
        while not self.stop.is_set():
            at = self.t0 + n / GPS_HZ
            delay = at - time.time()
            if delay > 0:
                time.sleep(delay)
            now = time.time()
            lat, lon = self.where(now - self.t0)
            try:
                os.write(self.master, (rmc(lat, lon, now) + "\r\n").encode())
            except OSError:
                return
            self.written.append((at - self.t0, now - self.t0))
            n += 1

    def late_near(self, dt: float) -> float:
        """How late (s) the feeder wrote its sentences due within a second of `dt`: the test's own
        lag (a Python thread beside the digests' producer and a loaded host), not rigd's."""
        return max((w - due for due, w in self.written if abs(due - dt) <= 1.0), default=0.0)

    def close(self):
        self.stop.set()
        self.thread.join(timeout=5)
        os.close(self.master)
        os.close(self.slave)


def config(ns: str, rig: str, tty: str) -> str:
    return f"""
[rig]
id = "{rig}"

[[source]]
id = "cam"
kind = "synthetic-camera"
width = 160
height = 120
fps = 10
frame-bytes = 4000
upload = "on-request"
retain-age = "1h"

[[source]]
id = "gps"
kind = "serial"
device = "{tty}"
baud = 115200
framing = "line"

[pulsar]
url = "{BROKER_URL}"
topic = "persistent://{ns}/{{rig}}-{{source}}"
coverage-interval-s = 2

[spool]
path = "spool"

[web]
bind = "127.0.0.1:{{WEB_PORT}}"
"""


def fleet(*args, timeout=120):
    t = time.monotonic()
    r = subprocess.run([rigd_bin(), "fleet", *map(str, args)], capture_output=True, text=True, timeout=timeout)
    return r, time.monotonic() - t


def coverage(topic: str, *query) -> tuple[dict, float]:
    r, secs = fleet("coverage", "--pulsar", BROKER_URL, "--topic", topic, "--json", *query)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), secs


def ranges(answer: dict) -> dict:
    """{rig: {source: [(from, to), ...]}}"""
    return {h["rig"]: {s["source"]: [(x["from"], x["to"]) for x in s["ranges"]] for s in h["sources"]}
            for h in answer["rigs"]}


def compact(topic: str):
    path = "/admin/v2/persistent/" + topic.removeprefix("persistent://") + "/compaction"
    admin("PUT", path)
    deadline = time.time() + 60
    while time.time() < deadline:
        status = admin("GET", path)
        if status.get("status") == "SUCCESS":
            return
        assert status.get("status") != "ERROR", status
        time.sleep(0.3)
    raise AssertionError(f"compaction of {topic} did not finish: {status}")


def read_all(topic: str, compacted: bool) -> list[tuple[str, bytes]]:
    client = pulsar.Client(BROKER_URL)
    try:
        reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=compacted)
        out = []
        while True:
            try:
                m = reader.read_next(timeout_millis=3000)
            except pulsar.Timeout:
                return out
            out.append((m.partition_key(), m.data()))
    finally:
        client.close()


@pytest.fixture(scope="module")
def fleet_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("fleet")
    ns = namespace_with_dedup(unique("fleet"))
    topic = f"persistent://{ns}/rigd-coverage"
    tag = unique("f")
    where = {k: (lambda dt, p=p: p) for k, p in PARKED.items()} | {"c": where_c}
    gps = {k: Gps(w) for k, w in where.items()}
    rigs = {k: Rigd(work / k, config(ns, f"{tag}-{k}", gps[k].device), name=k) for k in where}
    ids = {k: f"{tag}-{k}" for k in where}
    try:
        for d in rigs.values():
            d.start()
        t0 = time.time()
        for g in gps.values():
            g.start(t0)
        # Meanwhile, 1,000 synthetic rigs around Berlin, an hour each, made by rigd's own code.
        synth = work / "synth.ndjson"
        with open(synth, "w") as out:
            r = subprocess.run([rigd_bin(), "fleet", "synth-digests", "--rigs", "1000", "--hours", "1",
                                "--prefix", f"{tag}-synth-", "--around", "52.52,13.405,20000"],
                               stdout=out, stderr=subprocess.PIPE, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        print(r.stderr.strip())
        client = pulsar.Client(BROKER_URL)
        producer = client.create_producer(topic, batching_enabled=False)
        lines = synth.read_text().splitlines()
        for line in lines:
            producer.send_async(line.encode(), None, partition_key=json.loads(line)["rig"])
        producer.flush()
        client.close()
        # Until every rig has published a digest made after the window (every 2 s).
        time.sleep(max(0.0, t0 + RUN - time.time()))
        end = int((t0 + W2 + 1) * S)
        deadline = time.time() + 30
        while True:
            answer, _ = coverage(topic)
            made = {h["rig"]: h["digest_at"] for h in answer["rigs"] if h["rig"] in ids.values()}
            if len(made) == len(ids) and min(made.values()) > end:
                break
            assert time.time() < deadline, f"digests made: {made}"
            time.sleep(0.5)
        for d in rigs.values():
            assert d.stop() == 0
        yield {"ns": ns, "topic": topic, "ids": ids, "t0": t0, "rigs": rigs, "synth": lines,
               "gps_c": gps["c"]}
    finally:
        for g in gps.values():
            g.close()
        for d in rigs.values():
            d.close()


def test_coverage_answers_a_place_and_time_query_with_exactly_the_rigs_and_ranges(fleet_run):
    topic, ids, t0 = fleet_run["topic"], fleet_run["ids"], fleet_run["t0"]
    before = read_all(topic, compacted=False)
    assert len(before) > 1010, "each real rig published several digests"
    compact(topic)
    after = read_all(topic, compacted=True)
    keys = [k for k, _ in after]
    assert len(after) == len(set(keys)) == 1010, (len(after), len(set(keys)))

    w1, w2 = int((t0 + W1) * S), int((t0 + W2) * S)
    window = ("--from", w1, "--to", w2)
    near = lambda p: ("--near", f"{p[0]},{p[1]},{RADIUS}")  # noqa: E731
    timings = []

    # Around P1: A all through the window, C until it left; B and the synthetic rigs nowhere.
    answer, secs = coverage(topic, *near(P1), *window)
    timings.append(secs)
    assert answer["digests"] == 1010 and answer["unreadable"] == 0, answer
    got = ranges(answer)
    assert set(got) == {ids["a"], ids["c"]}, got
    assert got[ids["a"]] == {"cam": [(w1, w2)]}, got
    (c_from, c_to), = got[ids["c"]]["cam"]
    # Within a fix's period (0.2 s) and 50 ms of the crossing, plus however late the test's own
    # feeder wrote the fixes there (a CI run had 0.259 s: the feeder's thread, not rigd, ran late).
    left = t0 + crossing(P1, inside_first=True)
    bound = 0.25 + fleet_run["gps_c"].late_near(left - t0)
    assert c_from == w1
    assert abs(c_to / S - left) < bound, (c_to / S - t0, left - t0, bound)

    # Around P2: B, D, E, F, G all through, C from when it arrived within the radius.
    answer, secs = coverage(topic, *near(P2), *window)
    timings.append(secs)
    got = ranges(answer)
    at_p2 = [k for k, p in PARKED.items() if p == P2]
    assert set(got) == {ids[k] for k in at_p2} | {ids["c"]}, got
    for k in at_p2:
        assert got[ids[k]] == {"cam": [(w1, w2)]}, (k, got)
    (c_from, c_to), = got[ids["c"]]["cam"]
    arrived = t0 + crossing(P2, inside_first=False)
    bound = 0.25 + fleet_run["gps_c"].late_near(arrived - t0)
    assert abs(c_from / S - arrived) < bound, (c_from / S - t0, arrived - t0, bound)
    assert c_to == w2

    # Around P3: H, I, J, whole; nobody else.
    answer, secs = coverage(topic, *near(P3), *window)
    timings.append(secs)
    got = ranges(answer)
    assert got == {ids[k]: {"cam": [(w1, w2)]} for k in "hij"}, got

    # A window before C moved: A and C whole; a source no rig holds there (gps is live): nobody.
    answer, secs = coverage(topic, *near(P1), "--from", w1, "--to", int((t0 + 4) * S), "--source", "cam")
    timings.append(secs)
    assert set(ranges(answer)) == {ids["a"], ids["c"]}
    answer, _ = coverage(topic, *near(P1), *window, "--source", "gps")
    assert answer["rigs"] == []

    # A synthetic rig where its digest says it was: found there and then.
    probe = json.loads(fleet_run["synth"][417])
    dt, dlat, dlon = probe["trk"][0][:3]
    t_ms, lat, lon = probe["t0"] + dt, dlat / 1e5, dlon / 1e5
    answer, secs = coverage(topic, "--near", f"{lat},{lon},50", "--from", (t_ms - 1000) * 1_000_000,
                            "--to", (t_ms + 1000) * 1_000_000)
    timings.append(secs)
    assert probe["rig"] in ranges(answer), answer["rigs"]
    assert len(answer["rigs"]) < 10

    # Without the compaction the same answer comes from the whole topic (latest per key).
    print(f"rigd fleet coverage over 1010 digests: {', '.join(f'{t:.3f}' for t in timings)} s "
          f"(read {answer['read_ms']} ms, query {answer['query_ms']} ms)")


def test_fleet_recall_asks_the_rig_that_was_there_and_its_frames_arrive_once(fleet_run):
    ns, topic, ids, t0 = fleet_run["ns"], fleet_run["topic"], fleet_run["ids"], fleet_run["t0"]
    a = fleet_run["rigs"]["a"]
    a.start()  # it holds the camera in its spool; recall needs it running
    # C had left P1 by then: only A is asked.
    w1, w2 = int((t0 + 8) * S), int((t0 + 11) * S)
    r, secs = fleet("recall", "--pulsar", BROKER_URL, "--topic", topic, "--near", f"{P1[0]},{P1[1]},{RADIUS}",
                    "--from", w1, "--to", w2, "--control-topic", f"persistent://{ns}/{{rig}}-control",
                    "--json", "--timeout", "60")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.strip()]
    asked = lines[0]
    assert [h["rig"] for h in asked["rigs"]] == [ids["a"]], asked
    done = [x for x in lines[1:] if x.get("state") == "done"]
    assert len(done) == 1 and done[0]["rig"] == ids["a"], lines
    msgs = consume(BROKER_URL, [f"persistent://{ns}/{ids['a']}-cam"], idle_timeout_s=3)
    recalled = [m for m in msgs if m["properties"].get("recall") == done[0]["id"]]
    seqs = [int(m["properties"]["seq"]) for m in recalled]
    assert len(seqs) == len(set(seqs)) == done[0]["sent"]["frames"], (len(seqs), done[0])
    assert 25 <= len(seqs) <= 35, "3 s at 10 fps"
    for m in recalled:
        assert w1 <= int(m["properties"]["capture-ns"]) < w2
    assert a.stop() == 0
