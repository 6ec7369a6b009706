#!/usr/bin/env python3
"""Several links under traces (issue 50.2): a rig in a namespace of its own reaches a broker of its
own over two veth links (tests/e2e/test_links.py's `TwoLinks`, each an htb class into a modem-like
500 KB drop-tail queue), and a trace player of the tests' own (`TracePlayer`) moves each link's rate
as the trace says: steps, a ramp, and an LTE-like trace with outages. Each trace is run over one
link (a) and over both, under `max-bandwidth = "auto"`, and over one link under fixed caps (the best
fixed cap is the one chosen in hindsight), and by the official Java client over one link
(`tests/bench/java/TraceProducer.java`: the same sources as producers of its own, no budget, one
connection; budget `java`). The rig: two cameras (600 kB frames at 1.5 fps, 7.2
Mbit/s each, three 256 KB chunks a frame; priority 2), audio (1) and serial (0): more than the
links carry, so goodput measures the uplink, not the sources.

Printed, one markdown row per run: the links' shaped capacity over the trace (mean), the goodput
(bytes of every frame the official client received during the trace, over its length), their
ratio, each live source's capture-to-arrival p95 (frames captured during the trace that arrived
by its end + 10 s) and the camera's, the share of the serial frames captured during the trace that
arrived by then (against its 50 Hz), and frames twice (must be 0: broker dedup on).

The LTE-like trace is a seeded random walk of the rate in log space every 0.5 s between 1 and 20
Mbit/s with fades, and outages of 2-3 s (silence both ways, no reset) on each link at different
times: the shape of published cellular uplink traces, generated, not recorded (none is packaged
here). Needs root. Usage: tests/bench/links_trace.py [--quick] [--traces steps,ramp,lte]
[--only steps:a:java,...]"""

import argparse
import math
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

import pulsar  # noqa: E402

from harness import Arrivals, unique  # noqa: E402
from outage_return import JAVA_LOG4J, java_available, java_compile, java_home, java_lib  # noqa: E402
from test_links import LinkBroker, NsRigd, TracePlayer, TwoLinks, capacity_bits  # noqa: E402
from test_links import config as links_config  # noqa: E402

ARGS = argparse.ArgumentParser()
ARGS.add_argument("--quick", action="store_true", help="one short steps trace over both links (smoke)")
ARGS.add_argument("--traces", default="steps,ramp,lte")
ARGS.add_argument("--caps", default="2000kbit,6000kbit", help="fixed caps run over one link")
ARGS.add_argument("--only", help="these runs: TRACE:LINKS:BUDGET,..., e.g. steps:a:auto,lte:a+b:auto")
ARGS.add_argument("--keep", action="store_true", help="keep the run's directory (rigs' spools and logs, the broker)")
ARGS.add_argument("--timeline", action="store_true",
                  help="after each run, every 2 s of it: each link's shaped rate and estimate, the worst gps / mic")
ARGS = ARGS.parse_args()


def steps(secs):
    a = [(0, 8000), (secs, 2000), (2 * secs, 8000)]
    b = [(0, 2000), (secs, 8000), (2 * secs, 2000)]
    return {"a": a, "b": b}, 3 * secs


def ramp(secs):
    """2 -> 12 -> 2 Mbit/s over `secs`, 1 s steps; b the other way round."""
    half = secs // 2
    up = [2000 + 10000 * i // half for i in range(half)]
    shape = up + up[::-1]
    return {"a": list(enumerate(shape)), "b": list(enumerate(shape[::-1]))}, len(shape)


def lte(secs, seed=50):
    rng = random.Random(seed)
    out = {}
    for link, outage_at in (("a", secs * 0.4), ("b", secs * 0.7)):
        x, trace, t = math.log(6000), [], 0.0
        while t < secs:
            if outage_at <= t < outage_at + 2.5:
                trace.append((t, 0))
            else:
                x += rng.gauss(0, 0.25)
                if rng.random() < 0.03:
                    x -= 1.0  # a fade: a handover, a tunnel
                x = min(max(x, math.log(1000)), math.log(20000))
                trace.append((t, int(math.exp(x))))
            t += 0.5
        out[link] = trace
    return out, secs


def config(net, broker, rig, links, bandwidth):
    """The links test's rig with two cameras (600 kB at 1.5 fps each), every link of cost 0."""
    return links_config(net, broker, rig, [(name, 0) for name in links], bandwidth,
                        cams=(("cam1", 1.5), ("cam2", 1.5)))


# The rig's sources for the Java client (NAME:HZ:BYTES): the cameras of `config`, audio blocks of
# 33 ms at 16 kHz mono (1,056 bytes), RMC sentences at 50 Hz.
JAVA_SOURCES = ["cam1:1.5:600000", "cam2:1.5:600000", "mic:30.303:1056", "gps:50:70"]


class JavaRig:
    """The official Java client (TraceProducer) in the rig's namespace, over link a (the route of
    the lower metric; the client binds to no interface). `ip netns exec` execs it: the pid
    recorded is the JVM's."""

    def __init__(self, workdir, net, broker, rig):
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "log4j2.xml").write_text(JAVA_LOG4J.replace('level="info"', 'level="warn"'))
        self.log_path = workdir / "java.log"
        cmd = ["ip", "netns", "exec", net.ns, str(java_home() / "bin" / "java"), "-Xmx1g",
               f"-Dlog4j2.configurationFile={workdir / 'log4j2.xml'}",
               "-cp", f"{java_compile('TraceProducer')}:{java_lib()}/*", "TraceProducer", broker.url,
               f"persistent://public/default/{rig}-", *JAVA_SOURCES]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)

    def stop(self, timeout=60):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


def p95(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, len(xs) * 95 // 100)] if xs else float("nan")


def run(net, broker, tmp, name, trace, secs, links, bandwidth):
    rig = unique("trace")
    sources = ["gps", "mic", "cam1", "cam2"]
    client = pulsar.Client(broker.url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    got = {s: Arrivals(client, f"persistent://public/default/{rig}-{s}") for s in sources}
    java = bandwidth == "java"
    assert not java or links == ["a"], "the Java client runs over link a only"
    d = JavaRig(tmp / rig, net, broker, rig) if java else \
        NsRigd(tmp / rig, config(net, broker, rig, links, bandwidth), net)
    player = TracePlayer(net, {link: trace[link] for link in links})
    try:
        if java:
            deadline = time.time() + 90
            while not all(len(got[s].seen) > 3 for s in ("gps", "mic")):
                assert time.time() < deadline and d.proc.poll() is None, \
                    f"the Java client published nothing in 90 s: {d.log_path.read_text()[-2000:]}"
                time.sleep(0.5)
        else:
            d.start()
            # The live sources publish (a camera may wait for the budget from the start: two
            # cameras under a 2 Mbit/s cap).
            d.wait_for(lambda s: s["uplink"]["connected"] and
                       all(x["published"] > 3 for x in s["sources"] if x["id"] in ("gps", "mic")),
                       timeout=90, what="publishing on every live source")
        player.start()
        t0 = player.t0
        polled = []
        while time.time() < t0 + secs:
            time.sleep(0.5)
            if ARGS.timeline and not java:
                st = d.status()["uplink"]
                est = {x["name"]: (x.get("estimate") or {}) for x in st.get("links") or []} or \
                    {"a": st.get("estimate") or {}}
                polled.append((time.time() - t0, {k: (v.get("bytes_per_second") or 0, v.get("queueing_ms") or 0)
                                                  for k, v in est.items()}))
        t1 = time.time()
        status = None if java else d.status()
        time.sleep(10)
    finally:
        try:
            player.stop()
        finally:
            d.stop(timeout=60)
            client.close()
    cap = sum(capacity_bits(trace[link], 0, secs) for link in links) / secs / 1e6
    with_lock = {}
    for s, r in got.items():
        with r.lock:
            with_lock[s] = list(r.seen)
    carried = sum(n for rows in with_lock.values() for t, _, n, _ in rows if t0 <= t < t1) * 8 / (t1 - t0) / 1e6
    lat = {s: p95([t - c for t, c, _, _ in rows if t0 <= c < t1]) for s, rows in with_lock.items()}
    twice = sum(len(rows) - len({q for *_, q in rows}) for rows in with_lock.values())
    # The live frames captured during the trace that arrived by its end + 10 s, against the
    # source's rate (gps 50 Hz): a p95 counts only what arrived.
    arrived = sum(1 for _, c, _, _ in with_lock["gps"] if t0 <= c < t1) / (50 * (t1 - t0))
    where = "a (the Java client)" if java else \
        ", ".join(f"{x['name']} {x['producers']}" for x in status["uplink"]["links"]) or "a (one link)"
    cams = max(lat["cam1"], lat["cam2"])
    print(f"| {name} | {'+'.join(links)} | {bandwidth} | {cap:.1f} | {carried:.1f} | {100 * carried / cap:.0f} % "
          f"| {lat['gps']:.2f} | {100 * arrived:.0f} % | {lat['mic']:.2f} | {cams:.1f} | {twice} | {where} |", flush=True)
    if ARGS.timeline:
        timeline(trace, links, polled, with_lock, t0, secs)
    assert twice == 0, f"{twice} frames twice"


def timeline(trace, links, polled, rows, t0, secs):
    """Every 2 s of the run: each link's shaped rate, its estimate and queueing delay (status), the
    worst capture-to-arrival of gps and mic frames captured then, camera frames captured then that
    arrived."""
    def rate_at(steps, t):
        return next((k for s, k in reversed(steps) if s <= t), steps[0][1])
    for a in range(0, int(secs), 2):
        cells = []
        for link in links:
            seen = [v[link] for t, v in polled if a <= t < a + 2 and link in v]
            est = f"{seen[-1][0] * 8 / 1e6:.1f} est, {seen[-1][1]:.0f} ms" if seen else "-"
            cells.append(f"{link} {rate_at(trace[link], a) / 1000:.1f} Mbit/s ({est})")
        worst = {s: max((t - c for t, c, _, _ in rows[s] if t0 + a <= c < t0 + a + 2), default=float("nan"))
                 for s in ("gps", "mic")}
        cams = sum(1 for s in ("cam1", "cam2") for t, c, _, _ in rows[s] if t0 + a <= c < t0 + a + 2)
        print(f"  {a:3d} s: {'; '.join(cells)}; worst gps {worst['gps']:.2f} s, mic {worst['mic']:.2f} s; "
              f"cam frames {cams}", flush=True)


def warm_up(net, broker, tmp):
    """A rig over both links for 15 s, not measured: the first run after the broker's start had
    its live p95 several times the runs after it (6.9 and 18.8 s against 0.9-4.3 s: the broker's
    JVM warming up, its first topics and ledgers)."""
    d = NsRigd(tmp / "warm-up", config(net, broker, unique("warm"), ["a", "b"], "auto"), net)
    try:
        d.start()
        time.sleep(15)
    finally:
        d.stop(timeout=60)


def main():
    if os.geteuid() != 0:
        sys.exit("links_trace.py needs root (namespaces, veth, tc)")
    import tempfile
    tmp = Path(tempfile.mkdtemp(prefix="rigd-links-trace-"))
    traces = {"steps": steps(5 if ARGS.quick else 20), "ramp": ramp(60), "lte": lte(60)}
    chosen = ["steps"] if ARGS.quick else ARGS.traces.split(",")
    net = TwoLinks()
    try:
        broker = LinkBroker(tmp, net.broker_ip)
        try:
            warm_up(net, broker, tmp)
            print("| trace | links | budget | capacity Mbit/s | goodput Mbit/s | goodput / capacity "
                  "| gps p95 s | gps arrived | mic p95 s | cam p95 s | frames twice | producers at the end |")
            print("|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
            for only in ARGS.only.split(",") if ARGS.only else []:
                name, links, bandwidth = only.split(":")
                trace, secs = traces[name]
                run(net, broker, tmp, name, trace, secs, links.split("+"), bandwidth)
                chosen = []
            for name in chosen:
                trace, secs = traces[name]
                runs = [(["a", "b"], "auto")] if ARGS.quick else \
                    [(["a"], "auto"), (["a", "b"], "auto")] + [(["a"], cap) for cap in ARGS.caps.split(",")] \
                    + ([(["a"], "java")] if java_available() else [])
                for links, bandwidth in runs:
                    run(net, broker, tmp, name, trace, secs, links, bandwidth)
        finally:
            broker.stop()
    finally:
        net.close()
        # the broker's ledgers and the rigs' spools: 0.4-1.5 GB a run, left in /tmp they filled CI's disk
        if ARGS.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
