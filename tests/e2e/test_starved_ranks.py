"""Every rank moves on a link the better ranks would fill (issue 46.7), judged by the official
client.

A camera of chunked 1.5 MB frames at three times a 4 Mbit/s budget (its live producer always
has a chunk ready: the link is full of rank 2) beside a serial source of a worse priority (9:
its live frames rank 9) with a backlog (rank 20, spooled while the broker was unreachable), on
one connection; then the camera's topic is moved (unloaded through the broker's admin API: its
producer is closed, created again and resends what it held). Before, the pool wrote strictly
by rank: the serial source sent nothing while the camera had a frame, and a waiting producer
was credited with the camera's bytes, so nothing showed it. Now a channel that has waited `budget::OVERDUE_AFTER` (2 s) and earned the turn goes
next whatever its rank, and status says how long each source has waited (`starved_ms`,
`starved`) and `/metrics` `rigd_uplink_starved_seconds`.

Shared lane: its own namespace on the shared broker; the unload is of its own topic."""

import re
import threading
import time

import pulsar

from harness import BROKER_URL, Rigd, admin, consume, free_port, namespace_with_dedup, unique

# The bound the pool keeps (2 s) plus what may be ahead of the serial source when it falls due:
# the camera's chunk being written and one turn of a camera backlog that waited longer (each at
# most 2 s of the budget: a 1 MB chunk).
BOUND_S = 2 + 2 + 2
SLACK_S = 2
RATE_HZ = 50


def config(ns: str, rig: str, url: str) -> str:
    return f"""
[rig]
id = "{rig}"

[[source]]
id = "cam"
kind = "synthetic-camera"
width = 1280
height = 720
fps = 1
frame-bytes = 1500000

[[source]]
id = "gps"
kind = "synthetic-serial"
rate-hz = {RATE_HZ}
priority = 9

[pulsar]
url = "{url}"
topic = "persistent://{ns}/{{rig}}-{{source}}"
max-bandwidth = "4mbit"

[spool]
path = "spool"

[web]
bind = "127.0.0.1:{{WEB_PORT}}"
"""


def by_id(status, source):
    return next(s for s in status["sources"] if s["id"] == source)


class Receiver(threading.Thread):
    """The official client subscribed to a topic while the test runs: when each message arrived
    (the consumer's clock: the broker dispatches a message as it stores it) and its seq."""

    def __init__(self, topic: str):
        super().__init__(daemon=True)
        self.client = pulsar.Client(BROKER_URL, operation_timeout_seconds=10)
        self.consumer = self.client.subscribe(topic, f"judge-{unique('s')}",
                                              consumer_type=pulsar.ConsumerType.Exclusive,
                                              initial_position=pulsar.InitialPosition.Earliest)
        self.got: list[tuple[float, int, int]] = []
        self.done = threading.Event()

    def run(self):
        while not self.done.is_set():
            try:
                m = self.consumer.receive(timeout_millis=200)
            except pulsar.Timeout:
                continue
            props = m.properties()
            self.got.append((time.time(), int(props["seq"]), int(props["capture-ns"])))
            self.consumer.acknowledge(m)

    def stop(self):
        self.done.set()
        self.join(timeout=5)
        self.client.close()


def test_a_backlog_behind_a_chunked_camera_that_fills_the_link_moves_within_the_bound_and_shows_starved(tmp_path):
    ns = namespace_with_dedup(unique("starve"))
    rig = unique("starve")
    # 1. The broker unreachable for 5 s: 250 serial frames (and the camera's) spool.
    down = Rigd(tmp_path, config(ns, rig, f"pulsar://127.0.0.1:{free_port()}"), name="down")
    try:
        down.start()
        down.wait_for(lambda s: by_id(s, "gps")["spooled_records"] >= 250, timeout=30,
                      what="a serial backlog")
        assert down.stop() == 0
        spooled = down.totals()["gps"]["frames"]
    finally:
        down.close()
    t_restart_ns = time.time_ns()
    # 2. The broker back: live camera frames fill the link, the serial backlog waits behind them.
    d = Rigd(tmp_path, config(ns, rig, BROKER_URL), name="up")
    starved_seen = []
    serial = Receiver(f"persistent://{ns}/{rig}-gps")
    serial.start()
    try:
        d.start()
        d.wait_for(lambda s: by_id(s, "cam")["published"] >= 1 and by_id(s, "gps")["published"] >= 1,
                   timeout=30, what="both sources publishing")
        # 3. The camera's topic moves: its producer is closed by the broker and set up again.
        admin("PUT", f"/admin/v2/persistent/{ns}/{rig}-cam/unload")
        t_move = time.time()
        while time.time() - t_move < 20:
            s = d.status()
            gps = by_id(s, "gps")
            starved_seen.append((round(time.time() - t_move, 2), gps.get("starved_ms"), gps.get("starved")))
            time.sleep(0.25)
        t_end = time.time()
        metrics = d.get("/metrics").decode()
        assert d.stop() == 0
        log = d.log()
        time.sleep(1)
    finally:
        d.close()
        serial.stop()

    def received(source):
        return consume(BROKER_URL, [f"persistent://{ns}/{rig}-{source}"], idle_timeout_s=6,
                       consumer_type=pulsar.ConsumerType.Exclusive)

    cam = received("cam")
    # When each serial frame (live and backlog) reached the consumer after the move.
    after = sorted(t for t, _, _ in serial.got if t_move <= t <= t_end)
    gaps = [b - a for a, b in zip([t_move] + after, after + [t_end])]
    backlog = {seq for _, seq, capture in serial.got if capture < t_restart_ns}
    cam_after = [m for m in cam if m["publish_timestamp"] / 1e3 > t_move]
    print(f"serial: {len(after)} frames received in the {t_end - t_move:.0f} s after the move, longest gap "
          f"{max(gaps):.1f} s; its backlog: {len(backlog)} of {spooled} frames; camera frames stored "
          f"after the move: {len(cam_after)}")
    assert after, "no serial frame received after the move: starved behind the camera"
    assert max(gaps) <= BOUND_S + SLACK_S, f"the serial source waited {max(gaps):.1f} s (bound {BOUND_S} s)"
    # Each serial frame captured after the move (and the bound before the end) arrived within
    # the bound of its capture: none waited longer, none was left behind in the spool.
    limit = BOUND_S + SLACK_S
    window = [(seq, t - capture / 1e9) for t, seq, capture in serial.got
              if t_move <= capture / 1e9 <= t_end - limit]
    # What was captured there, by its numbers (a frame the source captured has the next seq; a
    # tick the synthetic source woke too late for is no frame), not by the wall clock: every one
    # arrived. (By the clock, 50 Hz over the window, a loaded run missed 73 ticks of ~600.)
    seqs = {seq for seq, _ in window}
    received = {seq for _, seq, _ in serial.got}
    # Up to the first frame captured after the window that arrived (a live producer's frames go
    # in order): a frame of the window that never arrived is a gap below it.
    later = [seq for _, seq, capture in serial.got if capture / 1e9 > t_end - limit]
    lo = min(seqs, default=0)
    hi = min(later) - 1 if later else max(seqs, default=-1)
    missing = [s for s in range(lo, hi + 1) if s not in received]
    late = sorted(w for _, w in window if w > limit)
    print(f"serial frames captured after the move: {len(window)} received (seqs {lo}..{hi}, "
          f"~{int(RATE_HZ * (t_end - limit - t_move))} at 50 Hz), {len(late)} later than {limit} s "
          f"(capture to receipt, worst {max((w for _, w in window), default=float('nan')):.1f} s)")
    assert len(seqs) >= RATE_HZ, f"only {len(seqs)} serial frames captured after the move"
    assert not missing and not late, \
        f"{len(missing)} serial frames captured after the move never arrived, {len(late)} arrived late"
    # Status said how long the serial source waited, while it waited (the consumer saw the same).
    waits = [w for _, w, _ in starved_seen if w is not None]
    print(f"gps starved_ms every 0.25 s after the move (max {max(waits, default=None)}):",
          [w for _, w, _ in starved_seen])
    assert any(flag for _, _, flag in starved_seen), f"starved never shown: {starved_seen}"
    assert max(waits) <= (BOUND_S + SLACK_S) * 1000, f"a wait past the bound: {max(waits)} ms"
    assert re.search(r'^rigd_uplink_starved_seconds\{[^}]*source="gps"', metrics, re.M), "no starved metric"
    # Its backlog, the worst rank, drained too.
    assert len(backlog) == spooled, f"{spooled - len(backlog)} backlog frames never sent"
    # The camera, rank 2, still has most of the link, and its topic's move cost no reconnect of
    # the serial producers (a waiting producer is excused, not stalled).
    assert len(cam_after) >= 3, f"{len(cam_after)} camera frames after the move"
    stalled = [x for x in log.splitlines() if "link stalled" in x and f"{rig}-gps" in x]
    assert not stalled, stalled[:3]
