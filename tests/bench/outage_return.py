#!/usr/bin/env python3
"""Back within 2 s of the link (issue 26): the time from the broker taking connections again to
rigd's first receipt after an outage, for two kinds of outage:

- `silent`: the broker's port cut by tc (an 8 bit/s htb class: SYNs go unanswered, the open
  connection hangs without a reset, as a cellular link does); counted from the restore;
- `down`: the broker stopped (connections refused) and started again; counted from the moment it
  answers a CONNECT (a starting broker takes TCP connections ~10-20 s before it answers them,
  printed per round; a pending CONNECT is answered the moment it serves).

Each rigd given (`--rigd`, and `--rigd-before` for the build to compare with) runs side by side
through the same outage: one rig each, a 100 Hz serial source, so a receipt follows within 10 ms
of the uplink being back. "First receipt" is the first rise of the source's `published` count
(polled every 20 ms) after the outage. Medians of `--rounds` rounds with the spread.

Beside them, the official Java client (`--java`, on when its jars and a JDK are here;
tests/bench/java/OutageProducer.java): a producer on a topic of its own in the same namespace,
sendAsync every 10 ms, sendTimeout 0, blockIfQueueFull, the client's default backoff (100 ms
doubling to 60 s); `--java-max-backoff MS` adds one more with maxBackoffInterval MS. Its first
receipt is the first completed send after the outage (the JVM's own clock, ms), from the same
moment as rigd's. `--keep-logs DIR` keeps each contestant's log (rigd: RIGD_LOG, e.g.
`info,rigd=debug`; Java: the client's INFO log) for reading the gap afterwards.

Needs root (tc). Runs a broker of its own on ports 6950-6952, never the test broker, and stops it;
or, with `--port P`, shapes the broker on P that the caller started for it (`silent` only).
Usage: tests/bench/outage_return.py [--quick] [--outages 40,120] [--kinds silent,down] [--rounds 3]
                                   [--rigd BIN] [--rigd-before BIN] [--port P]
                                   [--java | --no-java] [--java-max-backoff MS] [--keep-logs DIR]"""

import argparse
import bisect
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
# `--port P`: shape the broker already on P (the bench's own: tests/bench/run.sh passes the broker it
# started) instead of starting one; only the `silent` kind then (it never stops that broker).
_port_arg = sys.argv.index("--port") + 1 if "--port" in sys.argv else 0
PORT = int(sys.argv[_port_arg]) if _port_arg else 6950
OWN_BROKER = not _port_arg
if OWN_BROKER:
    os.environ.update({"PULSAR_URL": f"pulsar://127.0.0.1:{PORT}", "PULSAR_ADMIN_URL": f"http://127.0.0.1:{PORT + 1}"})
else:  # the caller's broker: its admin URL from PULSAR_ADMIN_URL (default 8080, as the tests)
    os.environ["PULSAR_URL"] = f"pulsar://127.0.0.1:{PORT}"
BROKER_ENV = {**os.environ, "PULSAR_DATA": str(ROOT / "target" / "pulsar-data-bench-outage"),
              "PULSAR_PORT": str(PORT), "PULSAR_HTTP_PORT": str(PORT + 1), "PULSAR_BOOKIE_PORT": str(PORT + 2)}
sys.path.insert(0, str(ROOT / "tests"))

from harness import Rigd, ShapedBrokerPort, namespace_with_dedup, unique  # noqa: E402


def broker(cmd: str):
    subprocess.run([str(ROOT / "tests" / "pulsar" / "broker.sh"), cmd], env=BROKER_ENV, check=True,
                   stdout=subprocess.DEVNULL)


def accepts() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", PORT), timeout=0.2):
            return True
    except OSError:
        return False


# CONNECT as the protocol frames it: total size, command size, BaseCommand {type: CONNECT (2),
# connect: {client_version: "bench" (1), protocol_version: 15 (4)}} in protobuf.
_CONNECT_BODY = b"\x0a\x05bench\x20\x0f"
_CMD = b"\x08\x02\x12" + bytes([len(_CONNECT_BODY)]) + _CONNECT_BODY
CONNECT = (len(_CMD) + 4).to_bytes(4, "big") + len(_CMD).to_bytes(4, "big") + _CMD


def answers_at(deadline_s: float = 120) -> float:
    """When the broker first answers CONNECT with CONNECTED (BaseCommand type 3): a connection that
    a starting broker took is answered the moment it serves. Retried while connections fail."""
    t0 = time.time()
    while time.time() - t0 < deadline_s:
        try:
            with socket.create_connection(("127.0.0.1", PORT), timeout=0.2) as c:
                c.settimeout(deadline_s)
                c.sendall(CONNECT)
                head = c.recv(10)
                if len(head) >= 10 and head[8:10] == b"\x08\x03":
                    return time.time()
        except OSError:
            pass
        time.sleep(0.02)
    raise RuntimeError("the broker never answered CONNECT")


class Cut(ShapedBrokerPort):
    """The broker port's own htb class: cut to 8 bit/s (silent: nothing passes, nothing is reset),
    restored as a class made anew (`renew`)."""

    def cut(self):
        self.change_class("rate", "8bit", "ceil", "8bit", "burst", "1600", "cburst", "1600")

    def restore(self):
        self.renew(1_000_000)


def config(ns: str, rig: str) -> str:
    return f"""
[rig]
id = "{rig}"

[[source]]
id = "gps"
kind = "synthetic-serial"
rate-hz = 100

[pulsar]
url = "pulsar://127.0.0.1:{PORT}"
topic = "persistent://{ns}/{{rig}}-{{source}}"

[spool]
path = "spool"

[web]
bind = "127.0.0.1:{{WEB_PORT}}"
"""


def published(d: Rigd) -> int:
    return d.status()["sources"][0]["published"]


class RigdContestant:
    """A rigd: its mark is the source's `published` count; a receipt is the count rising (seen by
    polling, so at the poll's time)."""

    def __init__(self, d: Rigd):
        self.d = d

    def wait_publishing(self):
        self.d.wait_for(lambda s: s["uplink"]["connected"] and s["sources"][0]["published"] > 0, timeout=120,
                        what="publishing")

    def mark(self):
        return published(self.d)

    def receipt_after(self, mark):
        return time.time() if published(self.d) > mark else None

    def close(self):
        self.d.stop()
        self.d.close()

    def log(self) -> str:
        return self.d.log()


# The Java client's log (INFO: connections, lookups, producers) on stderr with ms timestamps.
JAVA_LOG4J = """<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="warn">
  <Appenders><Console name="err" target="SYSTEM_ERR">
    <PatternLayout pattern="%d{yyyy-MM-dd'T'HH:mm:ss.SSS} [%t] %-5level %logger{36} - %msg%n"/>
  </Console></Appenders>
  <Loggers><Root level="info"><AppenderRef ref="err"/></Root></Loggers>
</Configuration>
"""


def java_lib() -> Path:
    """The broker's jar dir as tests/pulsar/broker.sh caches it (pulsar-client-original among them)."""
    cache = os.environ.get("PULSAR_CACHE_DIR") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rigd-pulsar")
    return Path(cache) / os.environ.get("PULSAR_VERSION", "3.0.7") / "lib"


def java_home() -> Path:
    return Path(os.environ.get("JAVA_HOME") or "/usr/lib/jvm/java-17-openjdk-amd64")


def java_available() -> bool:
    return (java_lib().parent / "lib.ok").exists() and (java_home() / "bin" / "javac").exists()


def java_compile(name: str = "OutageProducer") -> Path:
    """tests/bench/java/NAME.java into target/bench-java (as tests/bench/run.sh does)."""
    out = ROOT / "target" / "bench-java"
    src = ROOT / "tests" / "bench" / "java" / f"{name}.java"
    cls = out / f"{name}.class"
    if not cls.exists() or cls.stat().st_mtime < src.stat().st_mtime:
        out.mkdir(parents=True, exist_ok=True)
        subprocess.run([str(java_home() / "bin" / "javac"), "-d", str(out), "-cp", f"{java_lib()}/*", str(src)],
                       check=True)
    return out


class JavaContestant:
    """The official Java client (OutageProducer): its mark is a time; a receipt is the first send
    completed after it, at the completion's own time (epoch ms from the JVM, the same clock)."""

    def __init__(self, workdir: Path, topic: str, max_backoff_ms=None):
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "log4j2.xml").write_text(JAVA_LOG4J)
        self.log_path = workdir / "java.log"
        self.acks: list[float] = []
        self.errors: list[str] = []
        cmd = [str(java_home() / "bin" / "java"), "-Xmx256m", f"-Dlog4j2.configurationFile={workdir / 'log4j2.xml'}",
               "-cp", f"{java_compile()}:{java_lib()}/*", "OutageProducer", os.environ["PULSAR_URL"], topic]
        if max_backoff_ms is not None:
            cmd.append(str(max_backoff_ms))
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            word, _, rest = line.strip().partition(" ")
            if word == "ack":
                self.acks.append(int(rest) / 1000)  # in order: one printer, the JVM's clock
            elif word == "err":
                self.errors.append(rest)

    def wait_publishing(self, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the Java producer exited with {self.proc.returncode}:\n{self.log()[-4000:]}")
            if self.acks and time.time() - self.acks[-1] < 1.0:
                return
            time.sleep(0.1)
        raise AssertionError(f"the Java producer not publishing after {timeout} s:\n{self.log()[-4000:]}")

    def mark(self):
        return time.time()

    def receipt_after(self, mark):
        i = bisect.bisect_right(self.acks, mark)
        return self.acks[i] if i < len(self.acks) else None

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.errors:
            print(f"  the Java producer failed {len(self.errors)} sends, first: {self.errors[0]}", file=sys.stderr)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


def back_after(rigs: dict, since: float, deadline_s: float = 120, base=None) -> dict:
    """Seconds from `since` to each contestant's first receipt after its mark `base` (None: not
    within the deadline; a receipt before `since` counts as 0)."""
    base = base or {name: d.mark() for name, d in rigs.items()}
    out = {}
    while len(out) < len(rigs) and time.time() - since < deadline_s:
        for name, d in rigs.items():
            if name not in out:
                at = d.receipt_after(base[name])
                if at is not None:
                    out[name] = max(0.0, at - since)
        time.sleep(0.02)
    return {name: out.get(name) for name in rigs}


def utc(t: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


def one_round(kind: str, outage_s: float, rigs: dict, link: Cut) -> dict:
    for d in rigs.values():
        d.wait_publishing()
    if kind == "silent":
        link.cut()
        time.sleep(outage_s)
        # The base counts are read before the restore: nothing is received while the link is cut.
        rigs_base_taken = time.time()
        link.restore()
        print(f"  restored at {utc(rigs_base_taken)}", file=sys.stderr)
        return back_after(rigs, rigs_base_taken)
    broker("stop")
    time.sleep(outage_s)
    starting = subprocess.Popen([str(ROOT / "tests" / "pulsar" / "broker.sh"), "start"], env=BROKER_ENV,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not accepts():
        time.sleep(0.02)
    t_accept = time.time()
    base = {name: d.mark() for name, d in rigs.items()}
    t_answer = answers_at()
    r = back_after(rigs, t_answer, base=base)
    starting.wait(timeout=120)
    print(f"  the port took connections {t_answer - t_accept:.1f} s before the broker answered CONNECT"
          f" ({utc(t_accept)}, then {utc(t_answer)})", file=sys.stderr)
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="one 5 s outage of each kind (CI smoke)")
    ap.add_argument("--outages", default="40,120", help="outage lengths in seconds, comma-separated")
    ap.add_argument("--kinds", default="silent,down")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rigd", default=str(ROOT / "target" / "release" / "rigd"))
    ap.add_argument("--rigd-before", help="another build, run side by side through the same outages")
    ap.add_argument("--logs", action="store_true", help="print each rig's uplink log lines at the end")
    ap.add_argument("--port", type=int, help="the broker to shape (started by the caller); silent outages only")
    ap.add_argument("--java", action=argparse.BooleanOptionalAction, default=None,
                    help="the official Java client beside rigd (default: on when its jars and JAVA_HOME are here)")
    ap.add_argument("--java-max-backoff", type=int, metavar="MS",
                    help="one more Java producer, with the client's maxBackoffInterval at MS")
    ap.add_argument("--keep-logs", metavar="DIR", help="copy each contestant's log to DIR at the end")
    a = ap.parse_args()
    outages = [5.0] if a.quick else [float(x) for x in a.outages.split(",")]
    rounds = 1 if a.quick else a.rounds
    bins = {"after": a.rigd, **({"before": a.rigd_before} if a.rigd_before else {})}
    java = java_available() if a.java is None else a.java
    javas = {"java": None, **({f"java-{a.java_max_backoff}ms": a.java_max_backoff}
                              if a.java_max_backoff is not None else {})} if java else {}
    if java:
        java_compile()
    names = [*bins, *javas]
    kinds = a.kinds.split(",") if OWN_BROKER else ["silent"]
    if OWN_BROKER:
        broker("start")
    results = {}
    try:
        with tempfile.TemporaryDirectory() as tmp, Cut(1_000_000, port=PORT) as link:
            rigs = {}
            ns = namespace_with_dedup(unique("bench-outage"))
            for name, binary in bins.items():
                os.environ["RIGD_BIN"] = os.path.abspath(binary)  # each rig runs in a directory of its own
                rigs[name] = RigdContestant(Rigd(Path(tmp) / name, config(ns, unique(f"out-{name}"))).start())
            for name, max_backoff in javas.items():
                rigs[name] = JavaContestant(Path(tmp) / name, f"persistent://{ns}/{unique(f'out-{name}')}",
                                            max_backoff)
            try:
                for outage in outages:
                    for kind in kinds:
                        for _ in range(rounds):
                            r = one_round(kind, outage, rigs, link)
                            print(f"outage {outage:.0f} s {kind}: " + ", ".join(
                                f"{n} {v:.2f} s" if v is not None else f"{n} not back" for n, v in r.items()),
                                file=sys.stderr)
                            for n, v in r.items():
                                results.setdefault((outage, kind, n), []).append(v)
            finally:
                for name, d in rigs.items():
                    d.close()
                    if a.logs:
                        lines = [line for line in d.log().splitlines() if "uplink" in line or "pulsar" in line]
                        print(f"== {name}\n" + "\n".join(lines[-30:]), file=sys.stderr)
                    if a.keep_logs:
                        Path(a.keep_logs).mkdir(parents=True, exist_ok=True)
                        (Path(a.keep_logs) / f"{name}.log").write_text(d.log())
                if a.keep_logs and OWN_BROKER:
                    for f in (Path(BROKER_ENV["PULSAR_DATA"]) / "logs").glob("pulsar.log*"):
                        shutil.copy(f, Path(a.keep_logs) / f"broker-{f.name}")
    finally:
        if OWN_BROKER:
            broker("stop")

    def cell(xs):
        if not xs:
            return "-"
        if any(x is None for x in xs):
            return f"not back within 120 s in {sum(x is None for x in xs)} of {len(xs)}"
        return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"

    print("| outage | kind | " + " | ".join(f"{n}: s to the first receipt, median (min-max)" for n in names)
          + " | rounds |")
    print("|---|---|" + "---|" * len(names) + "---|")
    for outage in outages:
        for kind in kinds:
            print(f"| {outage:.0f} s | {kind} | "
                  + " | ".join(cell(results.get((outage, kind, n), [])) for n in names) + f" | {rounds} |")


if __name__ == "__main__":
    main()
