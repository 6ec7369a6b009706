"""A PTP test network in Linux network namespaces: a switch namespace with a bridge, rigd's
namespace, and up to two grandmaster namespaces running linuxptp's ptp4l on CLOCK_REALTIME with
software timestamping. Every namespace shares the host's CLOCK_REALTIME, so "rig clock minus
CLOCK_REALTIME" is the true error of the rig clock.

Nothing here adjusts a clock: ptp4l runs as a master only with free_running 1, rigd disciplines its
own virtual clock. `host_clock_frequency()` reads the kernel's clock frequency with adjtimex in
read-only mode (modes = 0) so tests can check it did not change.

Processes are ended by the pid recorded when they were started; namespaces are deleted in
`down()`, which callers run in a finally block (and `atexit` runs it too)."""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

PREFIX = "rigdptp-"


def is_root() -> bool:
    return os.geteuid() == 0


def missing_tools() -> list[str]:
    from shutil import which
    return [t for t in ("ip", "ptp4l", "curl") if which(t) is None]


def host_clock_frequency() -> tuple[int, int]:
    """(freq, tick) of the kernel clock via adjtimex(2) with modes = 0: reads, never writes."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    buf = ctypes.create_string_buffer(512)  # struct timex, zeroed: modes = 0 is a pure read
    if libc.adjtimex(buf) < 0:
        raise OSError(ctypes.get_errno(), "adjtimex")
    freq = int.from_bytes(buf.raw[16:24], "little", signed=True)
    tick = int.from_bytes(buf.raw[88:96], "little", signed=True)
    return freq, tick


def run(*args: str, check=True) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), check=check, capture_output=True, text=True)


def remove_stale() -> None:
    """Namespaces left by a run of these tests that was killed: ours by prefix, and only those whose
    owner (the pid in the name, `rigdptp-<pid>-<hex>-...`) is gone, never a test's running beside us."""
    out = run("ip", "netns", "list", check=False).stdout
    for line in out.splitlines():
        name = line.split()[0] if line.strip() else ""
        if not name.startswith(PREFIX):
            continue
        owner = name[len(PREFIX):].split("-", 1)[0]
        if not (owner.isdigit() and Path(f"/proc/{owner}").exists()):
            run("ip", "netns", "delete", name, check=False)


GM_CONFIG = """[global]
priority1 {priority1}
domainNumber {domain}
time_stamping software
network_transport {transport}
delay_mechanism E2E
logAnnounceInterval {log_announce}
logSyncInterval {log_sync}
logMinDelayReqInterval {log_delay}
announceReceiptTimeout 3
free_running 1
tx_timestamp_timeout 10
[{iface}]
masterOnly 1
"""


class PtpNet:
    """Namespaces `<tag>-b` (rigd, interface `ptp0`, 10.77.0.2) and `<tag>-gm1` (grandmaster,
    10.77.0.11) on one veth pair; bridged: plus `<tag>-gm2` (10.77.0.12) and `<tag>-sw` holding the
    bridge all three are plugged into."""

    def __init__(self, workdir: Path, transport: str = "udp4", bridged: bool = False):
        self.tag = f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.transport = transport
        # Without a bridge rigd's interface is cabled straight to gm1 (one grandmaster only).
        self.bridged = bridged
        self.rig_ns = f"{self.tag}-b"
        self.rig_iface = "ptp0"
        self.gms: dict[str, subprocess.Popen] = {}
        self.rigs: list["RigInNetns"] = []
        self.namespaces: list[str] = []
        atexit.register(self.down)

    def ns(self, name: str) -> str:
        return f"{self.tag}-{name}"

    def up(self) -> "PtpNet":
        if not self.bridged:
            for n in ("b", "gm1"):
                run("ip", "netns", "add", self.ns(n))
                self.namespaces.append(self.ns(n))
                run("ip", "-n", self.ns(n), "link", "set", "lo", "up")
            run("ip", "-n", self.ns("gm1"), "link", "add", "gm0", "type", "veth", "peer", "name",
                self.rig_iface, "netns", self.ns("b"))
            for n, iface, mac, addr in (("b", self.rig_iface, "10:00:00:00:0b:02", "10.77.0.2/24"),
                                        ("gm1", "gm0", "10:00:00:00:0a:11", "10.77.0.11/24")):
                run("ip", "-n", self.ns(n), "link", "set", iface, "address", mac)
                run("ip", "-n", self.ns(n), "addr", "add", addr, "dev", iface)
                run("ip", "-n", self.ns(n), "link", "set", iface, "up")
            return self
        sw = self.ns("sw")
        for n in ("sw", "b", "gm1", "gm2"):
            run("ip", "netns", "add", self.ns(n))
            self.namespaces.append(self.ns(n))
            run("ip", "-n", self.ns(n), "link", "set", "lo", "up")
        run("ip", "-n", sw, "link", "add", "br0", "type", "bridge", "stp_state", "0",
            "forward_delay", "0", "mcast_snooping", "0")
        run("ip", "-n", sw, "link", "set", "br0", "up")
        # (namespace, interface there, MAC (globally administered), address)
        ends = [("b", self.rig_iface, "10:00:00:00:0b:02", "10.77.0.2/24"),
                ("gm1", "gm0", "10:00:00:00:0a:11", "10.77.0.11/24"),
                ("gm2", "gm0", "10:00:00:00:0a:12", "10.77.0.12/24")]
        for i, (n, iface, mac, addr) in enumerate(ends):
            port = f"sw{i}"
            run("ip", "-n", sw, "link", "add", port, "type", "veth", "peer", "name", iface,
                "netns", self.ns(n))
            run("ip", "-n", sw, "link", "set", port, "master", "br0")
            run("ip", "-n", sw, "link", "set", port, "up")
            run("ip", "-n", self.ns(n), "link", "set", iface, "address", mac)
            run("ip", "-n", self.ns(n), "addr", "add", addr, "dev", iface)
            run("ip", "-n", self.ns(n), "link", "set", iface, "up")
        return self

    def start_gm(self, name: str = "gm1", priority1: int = 10, log_sync: int = -3,
                 log_announce: int = 0, domain: int = 0) -> subprocess.Popen:
        cfg = self.workdir / f"{name}.cfg"
        cfg.write_text(GM_CONFIG.format(
            priority1=priority1, domain=domain,
            transport="UDPv4" if self.transport == "udp4" else "L2",
            log_announce=log_announce, log_sync=log_sync, log_delay=log_sync, iface="gm0"))
        log = open(self.workdir / f"{name}.log", "ab")
        p = subprocess.Popen(["ip", "netns", "exec", self.ns(name), "ptp4l", "-f", str(cfg),
                              "-i", "gm0", "-m", "-q"],
                             stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.gms[name] = p
        return p

    def stop_gm(self, name: str) -> None:
        p = self.gms.pop(name, None)
        if p and p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def gm_identity(self, name: str) -> str:
        """ptp4l's clock identity for a grandmaster namespace (derived from its MAC)."""
        mac = {"gm1": "10:00:00:00:0a:11", "gm2": "10:00:00:00:0a:12"}[name].split(":")
        return f"{mac[0]}{mac[1]}{mac[2]}.fffe.{mac[3]}{mac[4]}{mac[5]}"

    def down(self) -> None:
        for rig in self.rigs:
            rig.kill()
        self.rigs = []
        for name in list(self.gms):
            self.stop_gm(name)
        for n in self.namespaces:
            run("ip", "netns", "delete", n, check=False)
        self.namespaces = []


RIG_CONFIG = """[rig]
id = "ptp-test"

[clock]
interface = "{iface}"
transport = "{transport}"
log-sync-interval = {log_sync}
log-announce-interval = {log_announce}
log-min-delay-req-interval = {log_sync}
simulate-offset-ns = {offset_ns}
simulate-ppm = {ppm}
{clock_extra}

[[source]]
id = "gps"
kind = "synthetic-serial"
rate-hz = 20

[spool]
path = "{spool}"
max-bytes = "64MiB"
free-reserve = "1MiB"

[web]
bind = "127.0.0.1:{port}"
"""


class RigInNetns:
    """rigd run inside the rig namespace; status read with curl from inside it."""

    def __init__(self, net: PtpNet, rigd_bin: str, name: str = "rigd", log_sync: int = -3,
                 log_announce: int = 0, offset_ns: int = 0, ppm: float = 0.0, port: int = 8088,
                 clock_extra: str = ""):
        """`clock_extra`: more `[clock]` lines (TOML)."""
        self.net = net
        self.bin = rigd_bin
        self.port = port
        self.dir = net.workdir / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config = self.dir / "rigd.toml"
        self.config.write_text(RIG_CONFIG.format(
            iface=net.rig_iface, transport=net.transport, log_sync=log_sync,
            log_announce=log_announce, offset_ns=offset_ns, ppm=ppm, clock_extra=clock_extra,
            spool=self.dir / "spool", port=port))
        self.log_path = self.dir / "rigd.log"
        self.proc: subprocess.Popen | None = None
        net.rigs.append(self)

    def start(self) -> "RigInNetns":
        log = open(self.log_path, "ab")
        env = {**os.environ, "RIGD_LOG": os.environ.get("RIGD_LOG", "info,statime=warn")}
        self.proc = subprocess.Popen(["ip", "netns", "exec", self.net.rig_ns, self.bin, "run",
                                      "--config", str(self.config)],
                                     stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"rigd exited with {self.proc.returncode}:\n{self.log()[-4000:]}")
            try:
                self.status()
                return self
            except (OSError, ValueError, subprocess.SubprocessError):
                time.sleep(0.2)
        raise RuntimeError(f"rigd not ready:\n{self.log()[-4000:]}")

    def status(self) -> dict:
        r = subprocess.run(["ip", "netns", "exec", self.net.rig_ns, "curl", "-sf", "-m", "2",
                            f"http://127.0.0.1:{self.port}/api/status"],
                           capture_output=True, text=True, timeout=5)
        if r.returncode != 0:
            raise OSError(f"curl exit {r.returncode}")
        return json.loads(r.stdout)

    def clock(self) -> dict:
        return self.status()["clock"]

    def wait_clock(self, predicate, timeout: float, what: str) -> dict:
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            try:
                last = self.clock()
                if predicate(last):
                    return last
            except (OSError, ValueError, subprocess.SubprocessError):
                pass
            time.sleep(0.2)
        raise AssertionError(f"timed out after {timeout}s waiting for {what}; last clock status: "
                             f"{json.dumps(last)}\n--- rigd log tail:\n{self.log()[-3000:]}")

    def sample_errors(self, seconds: float, period: float = 0.1, at_least: int = 0) -> list[dict]:
        """Clock status every `period` seconds for `seconds`; longer (up to 4 times) until there are
        `at_least` samples: on a loaded host one status read took ~260 ms (a CI run of 2026-12-07
        got 19 in 5 s, its clock within 1 us)."""
        out = []
        start = time.time()
        while time.time() < start + seconds or (len(out) < at_least and time.time() < start + 4 * seconds):
            try:
                out.append(self.clock())
            except (OSError, ValueError, subprocess.SubprocessError):
                pass
            time.sleep(period)
        return out

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def kill(self) -> None:
        """Ends this rigd (by its pid) if still running; for cleanup paths."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self, timeout=20) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"rigd did not stop after SIGTERM:\n{self.log()[-3000:]}")
        return self.proc.returncode


def stats_ns(values: list[int]) -> dict:
    """RMS, max |x|, median |x| and the 95th percentile |x| of a list of nanosecond values."""
    if not values:
        return {"n": 0}
    a = sorted(abs(v) for v in values)
    rms = (sum(v * v for v in values) / len(values)) ** 0.5
    return {"n": len(values), "rms": rms, "max": a[-1], "median": a[len(a) // 2],
            "p95": a[min(len(a) - 1, int(len(a) * 0.95))]}
