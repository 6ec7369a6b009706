"""`max-bandwidth = "auto"` (issue 50.1): one link stepping 8 -> 2 -> 8 Mbit/s behind a modem-like
500 KB drop-tail queue (htb on the broker's port and a bfifo), a ~7 Mbit/s camera (priority 2),
16 kHz audio (1) and 50 Hz serial (0). The official Python client, subscribed before rigd starts
with a receiver queue that needs no flow command through the shaped port, timestamps every serial
and audio frame as it arrives: capture (the `capture-ns` property) to receive. Asserted: in each
phase the estimate (status `uplink.estimate`) has its median from 10 s after the step within 25 %
of the shaped rate, the metrics name it, and after the link widens every frame arrives once.
Printed per phase (the benchmark's figures, docs/PERFORMANCE.md): the share of the rate carried,
the share of estimate samples within 20 %, serial and audio p95 capture-to-receive."""

import os
import time

import pulsar
import pytest

from harness import (BROKER_URL, Arrivals, Rigd, ShapedBrokerPort, assert_once_each, consume,
                     namespace_with_dedup, unique)

# `alone`: after every other lane (tests/lanes.py). Beside them (three brokers, a TCG guest, on two
# cores) its broker's receipts came late, read as the link's queue, and the estimate fell to
# 1.3 Mbit/s on the 8 Mbit/s link and 1.4 on the 2 Mbit/s one (fresh-clone runs of 2026-12-07;
# docs/UPLINK.md "Not built yet"); alone, or beside them in CI's landed runs, it passed.
pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="tc needs root"), pytest.mark.holds_broker,
              pytest.mark.alone]

PHASES = [(8000, 20), (2000, 20), (8000, 20)]
QUEUE_BYTES = 500_000


def config(ns, rig, frame_bytes=35000, cap="40mbit"):
    # cam 25 fps x 35 kB = 7 Mbit/s, mic 256 kbit/s, gps 50 Hz.
    return f"""
[rig]
id = "{rig}"

[[source]]
id = "cam"
kind = "synthetic-camera"
width = 320
height = 240
fps = 25
frame-bytes = {frame_bytes}
priority = 2

[[source]]
id = "mic"
kind = "synthetic-audio"
sample-rate = 16000
channels = 1
priority = 1

[[source]]
id = "gps"
kind = "synthetic-serial"
rate-hz = 50
priority = 0

[pulsar]
url = "{BROKER_URL}"
topic = "persistent://{ns}/{{rig}}-{{source}}"
max-bandwidth = "auto, at most {cap}"
[spool]
path = "spool"

[web]
bind = "127.0.0.1:{{WEB_PORT}}"
"""


def p95(xs):
    return xs[min(len(xs) - 1, int(len(xs) * 0.95))] if xs else None


# One worker with test_thin_link's outage test (never side by side: both load the CPU they measure).
@pytest.mark.xdist_group("heavy-link")
def test_auto_follows_a_link_stepping_8_2_8_mbit_live_first_and_every_frame_once(broker, tmp_path):
    ns = namespace_with_dedup(unique("auto"))
    rig = unique("auto")
    client = pulsar.Client(BROKER_URL)
    live = {src: Arrivals(client, f"persistent://{ns}/{rig}-{src}") for src in ["gps", "mic"]}
    d = Rigd(tmp_path, config(ns, rig))
    report = []
    try:
        rate0 = PHASES[0][0]
        with ShapedBrokerPort(rate0, queue_ms=QUEUE_BYTES * 8 // rate0) as link:
            d.start()
            d.wait_for(lambda s: s["uplink"]["connected"] and all(x["published"] > 20 for x in s["sources"]),
                       timeout=60, what="publishing on every source")
            time.sleep(10)  # the estimate's start (2 Mbit/s) and growth, before the first phase
            estimates = []
            for kbit, secs in PHASES:
                link.set_rate(kbit)
                t0, b0 = time.time(), link.bytes_sent()
                while time.time() - t0 < secs:
                    st = d.status()["uplink"]
                    if st.get("estimate"):
                        estimates.append((time.time(), st["estimate"]["bytes_per_second"],
                                          st["estimate"]["queueing_ms"]))
                    time.sleep(0.5)
                t1, b1 = time.time(), link.bytes_sent()
                rate = kbit * 1000 / 8
                est = [e for t, e, _ in estimates if t0 + 10 <= t < t1]
                within = sum(abs(e - rate) <= 0.2 * rate for e in est) / max(1, len(est))
                conv = next((t - t0 for t, e, _ in estimates
                             if t >= t0 and all(abs(x - rate) <= 0.2 * rate
                                                for u, x, _ in estimates if t <= u < t1)), None)
                report.append({"kbit": kbit, "t0": t0, "t1": t1, "carried": (b1 - b0) / (t1 - t0) / rate,
                               "within": within, "converged_s": conv,
                               "est_kbit": [round(e * 8 / 1e3) for e in est]})
            metrics = d.get("/metrics").decode()
            status = d.status()
        d.wait_for(lambda s: s["spool"]["records"] == 0, timeout=180, interval=1, what="everything drained")
        assert d.stop() == 0
    finally:
        d.close()
    for r in report:
        for src, limit in [("gps", 0.5), ("mic", 1.0)]:
            lat = live[src].latencies(r["t0"], r["t1"])
            r[f"{src}_p95"] = p95(lat)
            r[f"{src}_n"] = len(lat)
        print(f"{r['kbit']} kbit/s: carried {r['carried'] * 100:.0f} %, estimate within 20 % in "
              f"{r['within'] * 100:.0f} % of the samples from 10 s on (converged after {r['converged_s']} s), "
              f"gps p95 {r['gps_p95']:.3f} s ({r['gps_n']}), mic p95 {r['mic_p95']:.3f} s ({r['mic_n']}); "
              f"estimates {r['est_kbit']}")
    print("uplink at the end:", status["uplink"].get("estimate"), status["uplink"].get("rank_shares"))
    client.close()
    for src in ["gps", "mic", "cam"]:
        msgs = consume(BROKER_URL, [f"persistent://{ns}/{rig}-{src}"], idle_timeout_s=8,
                       consumer_type=pulsar.ConsumerType.Exclusive)
        assert_once_each([int(m["properties"]["seq"]) for m in msgs], src)
    assert "rigd_uplink_estimate_bytes_per_second" in metrics
    assert "rigd_uplink_queueing_seconds" in metrics
    for r in report:
        # The estimate follows the link: its median from 10 s after each step within 25 % of the
        # shaped rate (a backoff's cut may dip a lone sample below: 5.6 of 8 Mbit/s once). The
        # share carried and the live latencies are printed, not asserted: they depend on the
        # machine's load beside this test (in the fresh-clone run of 2026-12-06 23:10Z, beside a
        # QEMU guest and two other shaped-link tests, the last 8 Mbit/s phase carried 53 % with
        # serial p95 4.6 s; alone, 95-100 % and 0.19-0.24 s). The quiet-machine figures and the
        # issue's targets are in docs/PERFORMANCE.md "max-bandwidth = auto".
        est = sorted(r["est_kbit"])
        assert est, f"no estimate in status during the {r['kbit']} kbit/s phase"
        median = est[len(est) // 2]
        assert abs(median - r["kbit"]) <= 0.25 * r["kbit"], r
