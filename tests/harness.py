"""Shared helpers for rigd's end-to-end tests: the rigd binary as a child process, free ports,
the broker's admin API, and synthetic-frame checks. Processes are ended by the pid we recorded."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
import zlib
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "pulsar"))

from consume import consume  # noqa: E402  (the official client wrapper)

BROKER_URL = os.environ.get("PULSAR_URL", "pulsar://127.0.0.1:6650")
ADMIN_URL = os.environ.get("PULSAR_ADMIN_URL", "http://127.0.0.1:8080")


def rigd_bin() -> str:
    b = os.environ.get("RIGD_BIN") or str(ROOT / "target" / "release" / "rigd")
    if not Path(b).exists():
        raise RuntimeError(f"rigd binary not found at {b}: run `cargo build --release --locked` first")
    return b


def failpoint_bin() -> str:
    """rigd with a test crash armed by RIGD_FAILPOINT (daemon/examples/rigd_failpoint.rs, built
    by `cargo build --all-targets` beside rigd; the rigd binary itself cannot be made to crash)."""
    b = Path(rigd_bin()).parent / "examples" / "rigd_failpoint"
    if not b.exists():
        raise RuntimeError(f"{b} not found: run `cargo build --release --locked --workspace --all-targets`")
    return str(b)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def admin(method: str, path: str, body=None, timeout=30):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(ADMIN_URL + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        raw = r.read()
        return json.loads(raw) if raw.strip().startswith((b"{", b"[")) else raw.decode()


def namespace_with_dedup(name: str, dedup: bool = True) -> str:
    """Creates public/<name> with broker deduplication on (or off); returns 'public/<name>'."""
    try:
        admin("PUT", f"/admin/v2/namespaces/public/{name}", {})
    except urllib.error.HTTPError as e:
        if e.code != 409:
            raise
    admin("POST", f"/admin/v2/namespaces/public/{name}/deduplication", dedup)
    return f"public/{name}"


def namespace_without_dedup(name: str) -> str:
    """Creates public/<name> with broker deduplication off; returns 'public/<name>'."""
    return namespace_with_dedup(name, dedup=False)


class TlsBroker:
    """A broker of one test's own, started by broker.sh with TLS (a CA made here) and token
    authentication (a key made here): its own data dir and ports, stopped by `stop()` (by the pid
    broker.sh recorded). `knobs`: more PULSAR_* settings."""

    def __init__(self, tmp_path: Path, **knobs: str):
        self.sh = str(ROOT / "tests/pulsar/broker.sh")
        self.tls, self.key = tmp_path / "tls", tmp_path / "token.key"
        self.env = {**os.environ,
                    "PULSAR_DATA": str(tmp_path / "broker"), "PULSAR_PORT": str(free_port()),
                    "PULSAR_HTTP_PORT": str(free_port()), "PULSAR_BOOKIE_PORT": str(free_port()),
                    "PULSAR_TLS_PORT": str(free_port()), "PULSAR_HTTPS_PORT": str(free_port()),
                    "PULSAR_TLS_DIR": str(self.tls), "PULSAR_TOKEN_SECRET_KEY": str(self.key), **knobs}
        self.url = f"pulsar+ssl://127.0.0.1:{self.env['PULSAR_TLS_PORT']}"
        self.ca = self.tls / "ca.pem"
        self.run("gen-tls", str(self.tls))
        self.run("gen-token-key", str(self.key))

    def run(self, *args: str, **env: str) -> str:
        """broker.sh with this broker's environment (plus `env`); its stdout."""
        return subprocess.run([self.sh, *args], env={**self.env, **env}, capture_output=True, text=True,
                              check=True).stdout.strip()

    def stop(self):
        subprocess.run([self.sh, "stop"], env=self.env, capture_output=True)

    def rig_config(self, rig: str, spool: str, rate_hz: int, pulsar: str) -> str:
        """A rig with one synthetic serial source publishing to this broker's TLS port, trusting
        its CA; `pulsar`: the rest of [pulsar] (credentials)."""
        return f"""
[rig]
id = "{rig}"
[[source]]
id = "gps"
kind = "synthetic-serial"
rate-hz = {rate_hz}
[pulsar]
url = "{self.url}"
tls-ca-file = "{self.ca}"
{pulsar}
[spool]
path = "{spool}"
[web]
bind = "127.0.0.1:{{WEB_PORT}}"
"""


class Rigd:
    """One rigd daemon with its own config, spool and web port."""

    def __init__(self, workdir: Path, config: str, name: str = "rigd", tls_ca: Path | None = None):
        """`tls_ca`: the web UI is served over HTTPS with a certificate this CA signed."""
        import ssl
        self.scheme = "https" if tls_ca else "http"
        self.ssl = ssl.create_default_context(cafile=str(tls_ca)) if tls_ca else None
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.config_path = self.workdir / f"{name}.toml"
        self.config_path.write_text(config.replace("{WEB_PORT}", str(self.port)))
        self.log_path = self.workdir / f"{name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self, wait=True, env=None, binary=None):
        """`binary`: another build of rigd (the failpoint binary, `failpoint_bin()`)."""
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([binary or rigd_bin(), "run", "--config", str(self.config_path)],
                                     cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "RIGD_LOG": os.environ.get("RIGD_LOG", "info"),
                                          **(env or {})})
        log.close()
        if wait:
            self.wait_ready()
        return self

    def url(self, path: str) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}{path}"

    def get(self, path: str, timeout=5):
        with urllib.request.urlopen(self.url(path), timeout=timeout, context=self.ssl) as r:
            return r.read()

    def status(self) -> dict:
        return json.loads(self.get("/api/status"))

    def wait_ready(self, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc and self.proc.poll() is not None:
                raise RuntimeError(f"rigd exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if self.get("/healthz", timeout=1).startswith(b"ok"):
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"rigd not ready after {timeout}s:\n{self.log()}")

    def wait_for(self, predicate, timeout=60, what="condition", interval=0.2):
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            try:
                last = self.status()
                if predicate(last):
                    return last
            except OSError:
                pass
            time.sleep(interval)
        raise AssertionError(f"timed out waiting for {what}; last status: {json.dumps(last)[:2000]}\n{self.log()[-4000:]}")

    def stop(self, timeout=30) -> int:
        """SIGTERM and wait: rigd drains to the spool and exits 0."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"rigd did not stop within {timeout}s after SIGTERM:\n{self.log()[-4000:]}")

    def kill9(self):
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def totals(self) -> dict:
        """Per source, the tallies of the last run as rigd logged them once it stopped
        (`source totals`: frames, published, spool_dropped, device_drops, refused, spooled)."""
        runs = self.log().split("rigd stopped")
        assert len(runs) > 1, f"no `rigd stopped` in the log:\n{self.log()[-4000:]}"
        out = {}
        for line in runs[-2].splitlines():
            if "source totals" in line:
                fields = dict(re.findall(r"(\w+)=(\S+)", line.split("source totals", 1)[1]))
                source = fields.pop("source")
                out[source] = {k: int(v) for k, v in fields.items()}
        return out

    def close(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def broker_connections(pid: int, url: str = BROKER_URL) -> int:
    """Established TCP connections of process `pid` to the broker's port (`ss`, kernel's view)."""
    port = urlparse(url).port or 6650
    out = subprocess.run(["ss", "-tnpH", "state", "established", f"( dport = :{port} )"],
                         capture_output=True, text=True, check=True).stdout
    return sum(f"pid={pid}," in line for line in out.splitlines())


def reset_broker_connections(pid: int, url: str = BROKER_URL) -> int:
    """Resets process `pid`'s established connections to the broker's port, as a broker that
    crashed or a middlebox would (`ss -K`: the kernel aborts the socket and sends the peer a
    RST); only that process's, never another test's. Returns how many."""
    port = urlparse(url).port or 6650
    out = subprocess.run(["ss", "-tnpH", "state", "established", f"( dport = :{port} )"],
                         capture_output=True, text=True, check=True).stdout
    local = [line.split()[2].rsplit(":", 1)[1] for line in out.splitlines() if f"pid={pid}," in line]
    for lp in local:
        subprocess.run(["ss", "-K", "-tnH", "state", "established", f"( sport = :{lp} and dport = :{port} )"],
                       capture_output=True, check=True)
    return len(local)


def check_synthetic_jpeg(payload: bytes) -> None:
    """The synthetic camera's comment tag: CRC-32 (zlib) of every byte after the tag segment."""
    assert payload[:4] == b"\xff\xd8\xff\xfe", "not a tagged synthetic JPEG"
    seg_len = int.from_bytes(payload[4:6], "big")
    tag = payload[6:4 + seg_len].decode()
    assert tag.startswith("rigd-synthetic v1 crc32="), tag
    want = int(tag.split("=", 1)[1], 16)
    assert zlib.crc32(payload[4 + seg_len:]) == want, f"payload corrupted ({len(payload)} bytes)"


def nmea_valid(line: str) -> bool:
    if not line.startswith("$") or "*" not in line:
        return False
    body, _, cs = line[1:].partition("*")
    x = 0
    for ch in body.encode():
        x ^= ch
    return cs.strip().upper() == f"{x:02X}"


def holds_broker(what: str) -> None:
    """Stopping, freezing or shaping a broker is for a test that holds it alone: marked
    `holds_broker`, it runs in the lane of tests/lanes.py where each worker has a broker of its own.
    In the shared lane (RIGD_SHARED_BROKER=1) it would break the tests running beside it."""
    if os.environ.get("RIGD_SHARED_BROKER") == "1":
        raise RuntimeError(f"{what} on the shared broker: mark the test `@pytest.mark.holds_broker`")


def broker_ctl(cmd: str) -> None:
    """tests/pulsar/broker.sh `cmd` (start, stop) for this test's broker (the lane's PULSAR_*)."""
    if cmd != "start":
        holds_broker(f"broker.sh {cmd}")
    r = subprocess.run([str(ROOT / "tests/pulsar/broker.sh"), cmd], capture_output=True, text=True)
    assert r.returncode == 0, f"broker.sh {cmd} failed:\n{r.stderr[-3000:]}"


def broker_pid() -> int:
    """This test's broker JVM, as tests/pulsar/broker.sh recorded it."""
    data = Path(os.environ.get("PULSAR_DATA", ROOT / "target" / "pulsar-data"))
    pid = int((data / "broker.pid").read_text().strip())
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    assert b"java" in cmdline, f"pid {pid} is not the broker's JVM"
    return pid


class FrozenBroker:
    """SIGSTOP of the test broker (a peer that goes silent: the kernel keeps the connection and
    ACKs until the buffers fill, then nothing moves); SIGCONT on exit, whatever happened."""

    def __enter__(self):
        holds_broker("SIGSTOP of the broker")
        self.pid = broker_pid()
        os.kill(self.pid, signal.SIGSTOP)
        self.frozen_at = time.time()
        return self

    def __exit__(self, *exc):
        os.kill(self.pid, signal.SIGCONT)
        return False


class LoopbackQdisc:
    """Shaping of selected loopback traffic that tests running at the same time can share: one htb
    root qdisc on lo (handle ROOT:), whose default class ROOT:1 passes everything else, and a class
    of each user's own (ROOT:N with its leaf qdisc ROOTN: and u32 filters of priority N) for the
    traffic it selects. Classes are added and removed under a lock (flock on LOCK); the last user out
    removes the root, and a class whose owner died is removed by the next user. Refuses to run if lo
    has a shaping qdisc that is not this one (no netem here: docs/field-faults notes)."""

    ROOT = "7"
    STATE = Path("/run/rigd-tests/lo-qdisc")  # a file per class in use, named N, holding its owner's pid
    LOCK = Path("/run/rigd-tests/lo-qdisc.lock")

    def _tc(self, *args, check=True):
        return subprocess.run(["tc", *args], capture_output=True, text=True, check=check)

    def install(self):
        """Subclasses: the class (`add_class`) and the filters (`add_filter`) of the traffic to shape."""
        raise NotImplementedError

    def add_class(self, *htb: str, leaf_limit: int):
        """Our class ROOT:N with `htb` parameters and a drop-tail leaf queue of `leaf_limit` bytes."""
        self._tc("class", "add", "dev", "lo", "parent", f"{self.ROOT}:", "classid", self.classid, "htb", *htb)
        self._tc("qdisc", "add", "dev", "lo", "parent", self.classid, "handle", f"{self.ROOT}{self.n}:",
                 "bfifo", "limit", str(leaf_limit))

    def change_class(self, *htb: str):
        self._tc("class", "change", "dev", "lo", "parent", f"{self.ROOT}:", "classid", self.classid, "htb", *htb)

    def add_filter(self, field: str, port: int):
        """TCP/UDP traffic whose `field` (sport or dport) is `port` goes through our class."""
        self._tc("filter", "add", "dev", "lo", "parent", f"{self.ROOT}:", "protocol", "ip", "prio", str(self.n),
                 "u32", "match", "ip", field, str(port), "0xffff", "flowid", self.classid)

    def bytes_sent(self) -> int:
        out = self._tc("-s", "class", "show", "dev", "lo", "classid", self.classid).stdout
        for line in out.splitlines():
            line = line.strip()
            if line.startswith("Sent "):
                return int(line.split()[1])
        return 0

    @contextlib.contextmanager
    def _locked(self):
        self.STATE.mkdir(parents=True, exist_ok=True)
        with open(self.LOCK, "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield

    def _drop(self, n: int):
        """Removes class N and its filters (the lock is held); the root too once no class is left."""
        self._tc("filter", "del", "dev", "lo", "parent", f"{self.ROOT}:", "protocol", "ip", "prio", str(n), "u32",
                 check=False)
        self._tc("class", "del", "dev", "lo", "classid", f"{self.ROOT}:{n}", check=False)
        (self.STATE / str(n)).unlink(missing_ok=True)
        if not any(self.STATE.iterdir()):
            self._tc("qdisc", "del", "dev", "lo", "root", "handle", f"{self.ROOT}:", check=False)

    def __enter__(self):
        with self._locked():
            for f in list(self.STATE.iterdir()):  # classes whose owner died
                if not Path(f"/proc/{f.read_text().strip() or 0}").exists():
                    self._drop(int(f.name))
            current = self._tc("qdisc", "show", "dev", "lo").stdout
            if f"qdisc htb {self.ROOT}: root" not in current:
                if "htb" in current or "tbf" in current:
                    raise RuntimeError(f"lo already has a shaping qdisc: {current}")
                for f in list(self.STATE.iterdir()):  # the root is gone: so are its classes
                    f.unlink()
                self._tc("qdisc", "add", "dev", "lo", "root", "handle", f"{self.ROOT}:", "htb", "default", "1")
                self._tc("class", "add", "dev", "lo", "parent", f"{self.ROOT}:", "classid", f"{self.ROOT}:1",
                         "htb", "rate", "40gbit")
            self.n = next(n for n in range(2, 100) if not (self.STATE / str(n)).exists())
            self.classid = f"{self.ROOT}:{self.n}"
            (self.STATE / str(self.n)).write_text(str(os.getpid()))
            try:
                self.install()
            except Exception:
                self._drop(self.n)
                raise
        return self

    def remove(self):
        with self._locked():
            self._drop(self.n)

    def __exit__(self, *exc):
        self.remove()
        return False


class ShapedBrokerPort(LoopbackQdisc):
    """Traffic to the broker's port on loopback through an htb class of `rate` (the rest of lo
    unshaped), with a drop-tail queue of `queue_ms`. The test holds its broker (`holds_broker`)."""

    def __init__(self, rate_kbit: int, port: int | None = None, queue_ms: int = 300):
        # The test broker's port (PULSAR_URL), never another broker's on this machine.
        own = urlparse(BROKER_URL).port or 6650
        port = port or own
        if port == own:
            holds_broker("shaping the broker's port")
        self.rate_kbit, self.port, self.queue_ms = rate_kbit, port, queue_ms

    def install(self):
        limit = max(64 << 10, self.rate_kbit * 1000 // 8 * self.queue_ms // 1000)
        self.add_class(*self.rate(self.rate_kbit), leaf_limit=limit)
        self.add_filter("dport", self.port)

    @staticmethod
    def rate(rate_kbit: int) -> tuple[str, ...]:
        return ("rate", f"{rate_kbit}kbit", "ceil", f"{rate_kbit}kbit", "burst", "64k", "cburst", "64k")

    def set_rate(self, rate_kbit: int):
        self.change_class(*self.rate(rate_kbit))

    def renew(self, rate_kbit: int):
        """The class made anew at `rate_kbit`. After a cut to a few bits per second, `set_rate`
        leaves the packets queued then behind the old schedule (a TCP connect to the broker still
        timed out 6 s after a change back to 1 Gbit/s, measured 3 Dec 2026; the thin-link test saw
        the uplink back ~21 s after its restore), which a link coming back does not do. What the
        cut class held is dropped, as a radio link drops it."""
        self.remove()
        self.rate_kbit = rate_kbit
        self.__enter__()


class Arrivals:
    """Every message of a topic as it arrives (a listener of the official client, subscribed from
    the start): (receive time s, capture time s from the `capture-ns` property, payload bytes,
    `seq`)."""

    def __init__(self, client, topic):
        import threading

        import pulsar
        self.seen = []
        self.lock = threading.Lock()
        self.consumer = client.subscribe(topic, unique("live"), receiver_queue_size=50000,
                                         initial_position=pulsar.InitialPosition.Earliest,
                                         message_listener=self.on)

    def on(self, consumer, msg):
        t = time.time()
        with self.lock:
            self.seen.append((t, int(msg.properties()["capture-ns"]) / 1e9, len(msg.data()),
                              int(msg.properties()["seq"])))
        consumer.acknowledge(msg)

    def latencies(self, a, b):
        """Capture to arrival of the frames captured in [a, b), sorted."""
        with self.lock:
            return sorted(r - c for r, c, *_ in self.seen if a <= c < b)


def received_seqs(topic: str, url: str = BROKER_URL, idle: float = 6) -> list[int]:
    """The `seq` property of every message on `topic`, in delivery order (Exclusive subscription:
    publish order; Key_Shared orders per key only)."""
    import pulsar

    msgs = consume(url, [topic], idle_timeout_s=idle, consumer_type=pulsar.ConsumerType.Exclusive)
    return [int(m["properties"]["seq"]) for m in msgs]


def assert_once_each_in_order(seqs: list[int], source: str) -> None:
    """Every seq from 0 once, in order (what a drained spool and broker dedup promise)."""
    dups = len(seqs) - len(set(seqs))
    missing = sorted(set(range(max(seqs, default=-1) + 1)) - set(seqs))
    print(f"{source}: {len(seqs)} received, {dups} duplicates, {len(missing)} missing")
    assert dups == 0, f"{source}: {dups} frames arrived twice"
    assert not missing, f"{source}: {len(missing)} lost, first {missing[:10]}"
    assert seqs == sorted(seqs), f"{source}: out of order"


def assert_once_each(seqs: list[int], source: str) -> None:
    """Every seq from 0 once, in any order: with `drain = "live-first"` (the default) the frames
    captured after an outage reach the topic before the backlog (docs/UPLINK.md "The thin link")."""
    dups = len(seqs) - len(set(seqs))
    missing = sorted(set(range(max(seqs, default=-1) + 1)) - set(seqs))
    print(f"{source}: {len(seqs)} received, {dups} duplicates, {len(missing)} missing")
    assert seqs, f"{source}: nothing received"
    assert dups == 0, f"{source}: {dups} frames arrived twice"
    assert not missing, f"{source}: {len(missing)} lost, first {missing[:10]}"
