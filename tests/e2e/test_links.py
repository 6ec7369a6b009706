"""Several links (`[[pulsar.link]]`, issue 50.2): a rig in a network namespace of its own reaches a
broker of this test's own over two veth links, each shaped by htb with a modem-like 500 KB
drop-tail queue, and a third link for the web UI only. A link is pulled (`ip link set down`) or
goes silent (its queues drop every packet, both ways: no reset, no error) while a chunked camera
(the broker's max message size is 256 KB, each frame three chunks), audio and serial upload. The
official Python client, subscribed before rigd starts, timestamps every frame as it arrives.
Each link under a fixed 10 Mbit/s budget (`RIGD_LINKS_BANDWIDTH=auto`: under their estimators).
Asserted: the producers move to the other link and are connected there within 10 s (status), they
come back to the cheaper link once it answers again, and every seq of every source arrives once
(broker dedup on). Printed: each source's worst capture-to-arrival across the fault (the stall the
issue bounds at 3 s; docs/PERFORMANCE.md "Several links" has the figures, measured, not asserted:
under CI's load the brokers' JVMs dispatched late).

The broker checks the liveness of a producer name's old connection before it takes the name on a
new one (`connectionLivenessCheckTimeoutMillis`, 5 s by default): this broker checks for 1 s, the
setting a fleet that wants a move within 3 s gives its brokers (docs/UPLINK.md "Several links")."""

import os
import random
import re
import subprocess
import time
import urllib.request

import pulsar
import pytest

from harness import ROOT, Arrivals, Rigd, assert_once_each, consume, free_port, unique

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and veth need root"),
              pytest.mark.holds_broker, pytest.mark.xdist_group("links")]

# Each link's rate, rig to broker, and its drop-tail queue.
LINK_KBIT = 12000
QUEUE_BYTES = 500_000
# A link's producers are on another within this long of the fault (status). The stall the issue
# bounds at 3 s, capture to arrival at the official client, is printed (docs/PERFORMANCE.md
# "Several links": 1.3-2.9 s in quiet runs), not asserted: under CI's load the brokers' JVMs
# dispatched a frame 20 s after capture while rigd had its receipt within 5 s.
MOVED_WITHIN_S = 10


def sh(*args, check=True):
    return subprocess.run(args, capture_output=True, text=True, check=check)


class TwoLinks:
    """A namespace `rigdlinks-<pid>-<tag>` for the rig with veth links a (10.O.1.0/30), b
    (10.O.2.0/30) and m (10.O.9.0/30, the web UI's) to this namespace, where the broker's address
    10.O.0.1 sits on `<tag>h0` (its peer in the rig's namespace, so that every interface made here
    goes with the namespace). The rig's routes to the broker: over a (metric 10) and b (20); rigd
    binds each link's connections to its interface. `close()` deletes the namespace; one whose
    owner's pid is gone is deleted by the next user (docs/TESTING.md)."""

    PREFIX = "rigdlinks-"

    def __init__(self):
        for name in sh("ip", "netns", "list").stdout.split():
            if name.startswith(self.PREFIX):
                pid = name[len(self.PREFIX):].split("-")[0]
                if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                    sh("ip", "netns", "del", name, check=False)
        self.tag = f"rl{random.randrange(16 ** 4):04x}"
        self.o = random.randrange(100, 250)
        self.ns = f"{self.PREFIX}{os.getpid()}-{self.tag}"
        self.broker_ip = f"10.{self.o}.0.1"
        self.made = []
        try:
            self._make()
        except Exception:
            self.close()
            raise

    def ifname(self, link, side):
        return f"{self.tag}{link}{side}"

    def rig_ip(self, link):
        return f"10.{self.o}.{ {'a': 1, 'b': 2, 'm': 9}[link]}.2"

    def _make(self):
        sh("ip", "netns", "add", self.ns)
        self.made.append(("netns", self.ns))
        sh("ip", "-n", self.ns, "link", "set", "lo", "up")
        h0, h1 = self.ifname("h", 0), self.ifname("h", 1)
        sh("ip", "link", "add", h0, "type", "veth", "peer", "name", h1, "netns", self.ns)
        self.made.append(("link", h0))
        sh("ip", "addr", "add", f"{self.broker_ip}/32", "dev", h0)
        sh("ip", "link", "set", h0, "up")
        sh("ip", "-n", self.ns, "link", "set", h1, "up")
        for link, third in [("a", 1), ("b", 2), ("m", 9)]:
            host, rig = self.ifname(link, 0), self.ifname(link, 1)
            sh("ip", "link", "add", host, "type", "veth", "peer", "name", rig, "netns", self.ns)
            self.made.append(("link", host))
            sh("ip", "addr", "add", f"10.{self.o}.{third}.1/30", "dev", host)
            sh("ip", "link", "set", host, "up")
            sh("ip", "-n", self.ns, "addr", "add", f"10.{self.o}.{third}.2/30", "dev", rig)
            sh("ip", "-n", self.ns, "link", "set", rig, "up")
            if link != "m":
                self.shape(link)
                self.route(link)

    def route(self, link):
        third, metric = {"a": (1, 10), "b": (2, 20)}[link]
        sh("ip", "-n", self.ns, "route", "replace", f"{self.broker_ip}/32", "via", f"10.{self.o}.{third}.1",
           "dev", self.ifname(link, 1), "metric", str(metric))

    def shape(self, link):
        """Rig to broker: htb at LINK_KBIT into a drop-tail queue of QUEUE_BYTES (a modem)."""
        dev = self.ifname(link, 1)
        tc = ("ip", "netns", "exec", self.ns, "tc")
        # Made anew: what a silenced class held is dropped, as a radio coming back drops it (a
        # rate changed back leaves it queued behind the old schedule: harness.ShapedBrokerPort).
        sh(*tc, "qdisc", "del", "dev", dev, "root", check=False)
        sh(*tc, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "1")
        sh(*tc, "class", "replace", "dev", dev, "parent", "1:", "classid", "1:1", "htb",
           "rate", f"{LINK_KBIT}kbit", "ceil", f"{LINK_KBIT}kbit", "burst", "64k", "cburst", "64k")
        sh(*tc, "qdisc", "replace", "dev", dev, "parent", "1:1", "handle", "10:", "bfifo",
           "limit", str(QUEUE_BYTES))
        sh("tc", "qdisc", "del", "dev", self.ifname(link, 0), "root", check=False)

    def rate(self, link, kbit):
        """The link's rate, rig to broker, changed in place (its queue kept: a cell's capacity
        moving under a modem)."""
        sh("ip", "netns", "exec", self.ns, "tc", "class", "change", "dev", self.ifname(link, 1), "parent", "1:",
           "classid", "1:1", "htb", "rate", f"{kbit}kbit", "ceil", f"{kbit}kbit", "burst", "64k", "cburst", "64k")

    def silence(self, link):
        """Nothing of the link gets through, either way, without a word (a radio gone quiet): rig to
        broker, the modem's queue takes packets and sends none (its class at 8 bit/s); broker to rig,
        every packet dropped. (A queue that refuses packets at the rig is no silent radio: TCP
        counts nothing as sent there, and the kernel ends the connection itself.)"""
        sh("ip", "netns", "exec", self.ns, "tc", "class", "change", "dev", self.ifname(link, 1), "parent", "1:",
           "classid", "1:1", "htb", "rate", "8bit", "ceil", "8bit", "burst", "1", "cburst", "1")
        sh("tc", "qdisc", "replace", "dev", self.ifname(link, 0), "root", "bfifo", "limit", "0")

    def down(self, link):
        sh("ip", "-n", self.ns, "link", "set", self.ifname(link, 1), "down")

    def up(self, link):
        sh("ip", "-n", self.ns, "link", "set", self.ifname(link, 1), "up")
        self.route(link)

    def close(self):
        for kind, name in reversed(self.made):
            if kind == "netns":
                sh("ip", "netns", "del", name, check=False)
            else:
                sh("ip", "link", "del", name, check=False)
        self.made = []


class TracePlayer:
    """Plays a trace on the links: `trace` is {link: [(seconds, kbit), ...]}, each step holding until
    the next; 0 kbit is an outage (`TwoLinks.silence`: nothing through either way, no reset), the
    next rate after it a radio back (the link made anew, its queue dropped). A thread of its own;
    `stop()` ends it and restores every link to LINK_KBIT."""

    def __init__(self, net, trace):
        import threading
        self.net, self.trace, self.stopping = net, trace, threading.Event()
        self.thread = threading.Thread(target=self._play, daemon=True)

    def start(self):
        self.t0 = time.time()
        self.thread.start()
        return self

    def _play(self):
        events = sorted((t, link, kbit) for link, steps in self.trace.items() for t, kbit in steps)
        silent = set()
        for t, link, kbit in events:
            if self.stopping.wait(max(0.0, self.t0 + t - time.time())):
                return
            if kbit == 0:
                self.net.silence(link)
                silent.add(link)
                continue
            if link in silent:
                self.net.shape(link)
                silent.discard(link)
            self.net.rate(link, kbit)

    def stop(self):
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join(timeout=10)
        for link in self.trace:
            self.net.shape(link)


def capacity_bits(steps, a, b):
    """Bits the link could carry between `a` and `b` seconds of its trace."""
    bits = 0.0
    for i, (t, kbit) in enumerate(steps):
        end = steps[i + 1][0] if i + 1 < len(steps) else float("inf")
        lo, hi = max(a, t), min(b, end)
        if hi > lo:
            bits += kbit * 1000 * (hi - lo)
    return bits


class LinkBroker:
    """A standalone broker of this module's own on the links' broker address (broker.sh with
    PULSAR_HOST), deduplication on, 256 KB messages, a 1 s liveness check; stopped by broker.sh
    (the pid it recorded)."""

    def __init__(self, tmp, host):
        self.sh = str(ROOT / "tests/pulsar/broker.sh")
        port = free_port()
        self.env = {**os.environ, "PULSAR_DATA": str(tmp / "broker"), "PULSAR_HOST": host,
                    "PULSAR_PORT": str(port), "PULSAR_HTTP_PORT": str(free_port()),
                    "PULSAR_BOOKIE_PORT": str(free_port()), "PULSAR_DEDUP": "1",
                    "PULSAR_MAX_MESSAGE_SIZE": str(256 << 10),
                    # RIGD_LINKS_LIVENESS_MS=5000: the broker's default, for docs/PERFORMANCE.md
                    "PULSAR_LIVENESS_CHECK_MS": os.environ.get("RIGD_LINKS_LIVENESS_MS", "1000")}
        self.url = f"pulsar://{host}:{port}"
        out = subprocess.run([self.sh, "start"], env=self.env, capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"broker.sh start failed:\n{out.stderr[-4000:]}")

    def stop(self):
        subprocess.run([self.sh, "stop"], env=self.env, capture_output=True)


@pytest.fixture(scope="module")
def links(tmp_path_factory):
    net = TwoLinks()
    try:
        broker = LinkBroker(tmp_path_factory.mktemp("links-broker"), net.broker_ip)
        try:
            yield net, broker
        finally:
            broker.stop()
    finally:
        net.close()


class NsRigd(Rigd):
    """rigd run in the rig's namespace (`ip netns exec`, which execs it: the pid recorded is
    rigd's), its web UI on the m link."""

    def __init__(self, workdir, config, net):
        super().__init__(workdir, config)
        self.net = net

    def start(self, wait=True, env=None, binary=None):
        from harness import rigd_bin
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(["ip", "netns", "exec", self.net.ns, rigd_bin(), "run", "--config",
                                      str(self.config_path)], cwd=self.workdir, stdout=log,
                                     stderr=subprocess.STDOUT, env={**os.environ, "RIGD_LOG": "info"})
        log.close()
        if wait:
            self.wait_ready()
        return self

    def url(self, path):
        return f"http://{self.net.rig_ip('m')}:{self.port}{path}"


# Each link's budget: fixed at 10 Mbit/s in CI; `RIGD_LINKS_BANDWIDTH=auto` (a link's default)
# measures each link under its own estimator (docs/PERFORMANCE.md "Several links"). CI ran `auto`
# once (2026-12-07 13:26Z): both runs passed, but the two heavy-link tests beside them on the
# same two cores missed their bounds (the estimate cut to 1.3 Mbit/s on an 8 Mbit/s link by late
# receipts; gps p99 7.0 s under a fixed budget), so CI keeps the fixed budgets for now.
BANDWIDTH = os.environ.get("RIGD_LINKS_BANDWIDTH", "10mbit")


def config(net, broker, rig, costs, bandwidth, cams=(("cam", 1),)):
    """`cams`: (id, fps) of each camera of 600 kB frames."""
    link = "\n".join(f"""[[pulsar.link]]
interface = "{net.ifname(name, 1)}"
name = "{name}"
cost = {cost}
max-bandwidth = "{bandwidth}"
""" for name, cost in costs)
    cameras = "\n".join(f"""[[source]]
id = "{cam}"
kind = "synthetic-camera"
width = 320
height = 240
fps = {fps}
frame-bytes = 600000
priority = 2
""" for cam, fps in cams)
    # cam 600 kB at 1 fps (3 chunks each), mic 16 kHz, gps 50 Hz: ~5 Mbit/s on one 12 Mbit/s link.
    return f"""
[rig]
id = "{rig}"

{cameras}
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
url = "{broker.url}"
topic = "persistent://public/default/{{rig}}-{{source}}"
{link}
[spool]
path = "spool"

[web]
bind = "{net.rig_ip('m')}:{{WEB_PORT}}"
"""


def on_link(status, name):
    return next(x for x in status["uplink"]["links"] if x["name"] == name)


def run_fault(net, broker, tmp_path, costs, fault, restore, spread, bandwidth):
    rig = unique("links")
    topics = {s: f"persistent://public/default/{rig}-{s}" for s in ["gps", "mic", "cam"]}
    client = pulsar.Client(broker.url)
    live = {s: Arrivals(client, t) for s, t in topics.items()}
    d = NsRigd(tmp_path, config(net, broker, rig, costs, bandwidth), net)
    try:
        d.start()
        s = d.wait_for(lambda s: s["uplink"]["connected"] and all(x["published"] > 3 for x in s["sources"]),
                       timeout=90, what="publishing on every source")
        time.sleep(5)
        s = d.status()
        a, b = on_link(s, "a"), on_link(s, "b")
        print(f"before: a {a['producers']} producers, b {b['producers']}; estimates "
              f"{(a['estimate'] or {}).get('bytes_per_second')} / {(b['estimate'] or {}).get('bytes_per_second')} B/s")
        assert a["up"] and b["up"] and not a["held"], s["uplink"]["links"]
        if spread:
            assert a["producers"] > 0 and b["producers"] > 0, f"equal costs share the links: {s['uplink']['links']}"
        else:
            assert a["producers"] > 0 and b["producers"] == 0, f"the cheaper link carries all: {s['uplink']['links']}"

        t_fault = time.time()
        fault("a")
        s = d.wait_for(lambda s: on_link(s, "a")["given_up"] >= 1 and on_link(s, "a")["producers"] == 0
                       and on_link(s, "b")["producers"] > 0 and s["uplink"]["connected"],
                       timeout=MOVED_WITHIN_S, what="link a's producers on b, connected")
        moved_s = time.time() - t_fault
        print(f"moved off a in {moved_s:.1f} s: {on_link(s, 'a')['last_given_up']}")
        time.sleep(8)
        t_restore = time.time()
        restore("a")
        # The prober's connect over a succeeds: usable again. Producers move back to a cheaper
        # link once it settled; on links of equal cost they spread again (b carries all, a none),
        # one move per 5 s, until neither carries more than one more than the other.
        balanced = lambda s: abs(on_link(s, "a")["producers"] - on_link(s, "b")["producers"]) <= 1
        s = d.wait_for(lambda s: on_link(s, "a")["producers"] > 0 and not on_link(s, "a")["held"]
                       and (balanced(s) or not spread), timeout=30,
                       what="link a usable again, producers back on it" + (", spread" if spread else ""))
        print(f"a usable again, {on_link(s, 'a')['producers']} producers back on it "
              f"{time.time() - t_restore:.1f} s after it was restored ({on_link(s, 'b')['producers']} on b; "
              f"moved in {on_link(s, 'a')['moved_in']})")
        # They moved while b still served them, as the cheaper link's or to spread; said per reason.
        reason = "spread" if spread else "cheaper"
        assert on_link(s, "a")["moved_in"][reason] >= 1, on_link(s, "a")
        with urllib.request.urlopen(d.url("/metrics"), timeout=10) as r:
            metrics = r.read().decode()
        m = re.search(rf'rigd_uplink_link_moved_in_total{{link="a",reason="{reason}"}} (\d+)', metrics)
        assert m and int(m.group(1)) >= 1, [x for x in metrics.splitlines() if "moved_in" in x]
        time.sleep(6)
        t_end = time.time()
        rc = d.stop(timeout=60)
        assert rc == 0, d.log()[-3000:]
        # Capture to arrival of every frame captured from 3 s before the fault to the end.
        time.sleep(2)
        for src, arr in live.items():
            waits = arr.latencies(t_fault - 3, t_end - 3)
            worst, n = (waits[-1] if waits else float("nan")), len(waits)
            print(f"{src}: {n} frames captured across the fault and the move back, worst capture-to-arrival "
                  f"{worst:.2f} s")
            assert n > 0, f"{src}: nothing captured across the fault arrived"
    finally:
        d.stop()
        client.close()
    for src, topic in topics.items():
        msgs = consume(broker.url, [topic], idle_timeout_s=6, consumer_type=pulsar.ConsumerType.Exclusive)
        assert_once_each([int(m["properties"]["seq"]) for m in msgs], src)


def test_a_pulled_link_moves_its_producers_to_the_other_and_back(links, tmp_path):
    """Link a (cost 0) carries everything, b (cost 5) nothing; a's interface goes down. Under
    `auto` b carried nothing yet: it keeps its start (2 Mbit/s) and grows with what moves onto it."""
    net, broker = links
    run_fault(net, broker, tmp_path, [("a", 0), ("b", 5)], net.down, net.up, spread=False,
              bandwidth=BANDWIDTH)


def test_a_silent_link_moves_its_producers_to_the_other(links, tmp_path):
    """Links of equal cost share the producers; a goes silent (nothing through, either way, no
    reset); its producers move to b, and once a is back they spread onto it again. Under `auto` the link that carries only audio and serial keeps its start: their
    samples are app-limited (before, its estimate fell to the audio's rate, and the frames moved
    onto it waited for its growth: docs/UPLINK.md "Several links")."""
    net, broker = links
    run_fault(net, broker, tmp_path, [("a", 0), ("b", 0)], net.silence, net.shape, spread=True,
              bandwidth=BANDWIDTH)
