"""`max-bandwidth = "auto"` and a broker slow to answer (issue 50.1): receipts late while nothing
waits on the link are the broker's delay, not the link's queue, and cut nothing.

The broker's own path to its bookie (the standalone broker's BookKeeper client to its bookie's port
on loopback) is held to 1 Mbit/s for 1.5 s every 6 s, under the ~4.5 Mbit/s the rig publishes: the
broker reads on, its writes to the ledger wait, its receipts come up to seconds late. The rig's
link (loopback to the broker's port) is not shaped: its kernel sees no queue (TCP_INFO). Before,
each such stall cut the estimate (at most in half a cut, `MAX_CUT`) and the backoff paced at what
the stalled receipts measured: a loaded CI run's cascade, 8.6 -> 1.3 Mbit/s. Asserted: the receipts
were late (the scenario bit), status counts the broker's delays, the estimate's lowest during the
stalls is at least 70 % of what it was before them, and every frame arrives once (the official
client)."""

import os
import time

import pulsar
import pytest

from harness import BROKER_URL, Rigd, ShapedBrokerPort, assert_once_each, consume, namespace_with_dedup, unique
from test_auto_bandwidth import config as auto_config

# tc needs root; the shaped bookie port is this test's own broker's (holds_broker).
pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="tc needs root"), pytest.mark.holds_broker]

BOOKIE_PORT = int(os.environ.get("PULSAR_BOOKIE_PORT", "3181"))
STALLS = 4
EVERY_S, STALL_S, STALL_KBIT = 6.0, 1.5, 1000


def config(ns, rig):
    # cam 25 fps x 20 kB = 4 Mbit/s, mic 256 kbit/s, gps 50 Hz: under the cap, the rig's link idle
    # for part of each second (its estimate is what it carries, grown by probes).
    return auto_config(ns, rig, frame_bytes=20000, cap="12mbit")


class BookiePath(ShapedBrokerPort):
    """The broker's writes to its bookie (its port on loopback) through a class of ours: at 10 Gbit/s
    (nothing held) until the test lowers its rate; a deep queue, so that a stall delays and drops
    nothing."""

    def __init__(self):
        super().__init__(10_000_000, port=BOOKIE_PORT)

    def install(self):
        # 16 MiB: the parent's queue_ms at 10 Gbit/s would be gigabytes.
        self.add_class(*self.rate(self.rate_kbit), leaf_limit=16 << 20)
        self.add_filter("dport", self.port)


def test_receipts_late_from_a_slow_broker_do_not_cut_the_estimate(broker, tmp_path):
    ns = namespace_with_dedup(unique("slowbk"))
    rig = unique("slowbk")
    d = Rigd(tmp_path, config(ns, rig))
    samples = []  # (time, estimate B/s, queueing ms, mode, broker_delays)

    def sample():
        e = d.status()["uplink"].get("estimate") or {}
        samples.append((time.time(), e.get("bytes_per_second", 0), e.get("queueing_ms", 0.0), e.get("mode"),
                        e.get("broker_delays", 0)))

    try:
        with BookiePath() as bookie:
            d.start()
            d.wait_for(lambda s: s["uplink"]["connected"] and all(x["published"] > 20 for x in s["sources"]),
                       timeout=60, what="publishing on every source")
            t_warm = time.time()
            while time.time() - t_warm < 20:  # the start (2 Mbit/s) grown to what the rig carries
                sample()
                time.sleep(0.25)
            t_first = time.time()
            for _ in range(STALLS):
                t0 = time.time()
                bookie.set_rate(STALL_KBIT)
                while time.time() - t0 < STALL_S:
                    sample()
                    time.sleep(0.25)
                bookie.set_rate(10_000_000)
                while time.time() - t0 < EVERY_S:
                    sample()
                    time.sleep(0.25)
            t_end = time.time()
            status = d.status()
            metrics = d.get("/metrics").decode()
        d.wait_for(lambda s: s["spool"]["records"] == 0, timeout=120, interval=1, what="everything drained")
        assert d.stop() == 0
    finally:
        d.close()
    before = [e for t, e, *_ in samples if t_first - 5 <= t < t_first]
    during = [(t, e, q, m) for t, e, q, m, _ in samples if t_first <= t < t_end]
    base = sorted(before)[len(before) // 2]
    lowest = min(e for _, e, _, _ in during)
    late = max(q for _, _, q, _ in during)
    modes = sorted({m for *_, m in during if m})
    est = status["uplink"]["estimate"]
    print(f"estimate before the stalls {base * 8 / 1e6:.2f} Mbit/s (median of the last 5 s), lowest during them "
          f"{lowest * 8 / 1e6:.2f} Mbit/s; receipts' queueing up to {late:.0f} ms; modes {modes}; "
          f"broker delays {est.get('broker_delays')}, the path's queue at the last {est.get('path_queue_ms')} ms")
    print("estimate every 0.25 s (Mbit/s, queueing ms):",
          [(round(e * 8 / 1e6, 1), round(q)) for _, e, q, _ in during])
    for src in ["gps", "mic", "cam"]:
        msgs = consume(BROKER_URL, [f"persistent://{ns}/{rig}-{src}"], idle_timeout_s=8,
                       consumer_type=pulsar.ConsumerType.Exclusive)
        assert_once_each([int(m["properties"]["seq"]) for m in msgs], src)
    assert late > 240, f"the receipts were never late ({late:.0f} ms): the bookie's path held nothing back"
    assert est.get("broker_delays", 0) >= 1, est
    assert "rigd_uplink_broker_delays_total" in metrics
    assert lowest >= 0.7 * base, \
        f"the estimate fell from {base * 8 / 1e6:.2f} to {lowest * 8 / 1e6:.2f} Mbit/s on a slow broker"
