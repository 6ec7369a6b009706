#!/usr/bin/env python3
"""What limits an uplink bench row (issue 26, goal 5): the rows of tests/bench/run.sh's uplink section
run again, rigd and the official Java client taking turns going first, each with the machine's and
the broker's own figures over the row: the client's CPU, the broker JVM's CPU and the bytes it wrote
(journal and ledgers: /proc/<broker>/io), the whole machine's CPU (/proc/stat, of every core) and
the broker's disk busy time (/proc/diskstats io_ticks of the device under the broker's data).

    python3 tests/bench/uplink_limits.py --uplink-bench <target/release/deps/uplink-...> \\
        [--rows 4096:100000:false,4096:200000:true] [--rounds 3]

The uplink bench binary is the one run.sh resolves (`cargo bench --workspace --bench uplink --no-run`);
the Java client is compiled as run.sh does (target/bench-java) and runs a warm-up row of a fifth of
the count in the same JVM before the measured one. Needs the test broker up
(tests/pulsar/broker.sh start). Prints one markdown table: per row and client the medians of the
rounds, the spread of msg/s."""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

# The broker tests/pulsar/broker.sh starts by default (its data directory), unless PULSAR_DATA names
# another, as for the e2e tests.
os.environ.setdefault("PULSAR_DATA", "/tmp/rigd-pulsar-data")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import ROOT, broker_pid  # noqa: E402
from rig_profile import cpu_seconds  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
BROKER_DATA = Path(os.environ["PULSAR_DATA"])


def proc_write_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    return 0


def machine_busy_s() -> float:
    f = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = f[3] + f[4]  # idle + iowait
    return (sum(f[:8]) - idle) / TICK


def device_of(path: Path) -> str:
    """The block device under `path` (its whole disk's name in /proc/diskstats terms)."""
    dev = os.stat(path).st_dev
    major, minor = os.major(dev), os.minor(dev)
    for line in Path("/proc/diskstats").read_text().splitlines():
        f = line.split()
        if int(f[0]) == major and int(f[1]) == minor:
            return f[2]
    return ""


def io_ticks_ms(device: str) -> int:
    if not device:
        return 0
    for line in Path("/proc/diskstats").read_text().splitlines():
        f = line.split()
        if f[2] == device:
            return int(f[12])
    return 0


class Sampler(threading.Thread):
    """Every 50 ms: the client's and the broker's CPU, the broker's written bytes, the machine's
    busy time and the disk's busy time, each against the time it was read."""

    def __init__(self, client: int, broker: int, device: str):
        super().__init__(daemon=True)
        self.client, self.broker, self.device = client, broker, device
        self.samples, self.done = [], threading.Event()

    def run(self):
        while not self.done.is_set():
            try:
                self.samples.append((time.time(), cpu_seconds(self.client), cpu_seconds(self.broker),
                                     proc_write_bytes(self.broker), machine_busy_s(), io_ticks_ms(self.device)))
            except (FileNotFoundError, ProcessLookupError):
                return
            time.sleep(0.05)

    def at(self, t: float):
        return min(self.samples, key=lambda x: abs(x[0] - t))


def measured(cmd: list[str], broker: int, device: str, skip: int = 0) -> dict:
    """Runs one row (after `skip` warm-up rows of the same process); the figures are taken over the
    row's own measured phase (its `secs`, ending when it prints its result), not the client's start
    (a JVM's start and JIT would count)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    sampler = Sampler(p.pid, broker, device)
    sampler.start()
    row, t_end = None, None
    for line in p.stdout:
        if line.startswith("{"):
            if skip == 0:
                row, t_end = json.loads(line), time.time()
                break
            skip -= 1
    sampler.done.set()
    p.stdout.read()
    p.wait()
    sampler.join()
    if row is None:
        raise SystemExit(f"{cmd[0]}: no result (exit {p.returncode})")
    a, b = sampler.at(t_end - row["secs"]), sampler.at(t_end)
    secs = b[0] - a[0]
    return {
        "msg_per_s": row["msg_per_s"],
        "client_cpu": (b[1] - a[1]) / secs * 100,
        "broker_cpu": (b[2] - a[2]) / secs * 100,
        "broker_mb_s": (b[3] - a[3]) / secs / 1e6,
        "machine_cpu": (b[4] - a[4]) / secs * 100,
        "disk_busy": (b[5] - a[5]) / 10 / secs if device else None,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--uplink-bench", required=True)
    ap.add_argument("--rows", default="4096:100000:false,4096:200000:true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--url", default="pulsar://127.0.0.1:6650")
    a = ap.parse_args()
    broker = broker_pid()
    device = device_of(BROKER_DATA) if BROKER_DATA.exists() else ""
    java = os.environ.get("JAVA_HOME", "/usr/lib/jvm/java-17-openjdk-amd64") + "/bin/java"
    lib = subprocess.run([str(ROOT / "tests/pulsar/broker.sh"), "fetch"], capture_output=True, text=True,
                         check=True).stdout.strip().splitlines()[-1]
    run_id = int(time.time())
    res = {}
    for row in a.rows.split(","):
        size, count, batching = row.split(":")
        for rnd in range(a.rounds):
            order = ["rigd", "java"] if rnd % 2 == 0 else ["java", "rigd"]
            for client in order:
                topic = f"persistent://public/default/limits-{client}-{run_id}-{rnd}-{size}-{batching}"
                if client == "rigd":
                    cmd, skip = [a.uplink_bench, a.url, topic, size, count, "500", batching], 0
                else:
                    # A warm-up row first in the same JVM (JIT), as run.sh's rows follow each other.
                    warm = f"{size}:{max(1, int(count) // 5)}:{batching}"
                    cmd, skip = [java, "-Xmx1g", "-cp", f"{ROOT}/target/bench-java:{lib}/*", "JavaProducer",
                                 a.url, topic, "500", warm, row], 1
                m = measured(cmd, broker, device, skip)
                res.setdefault((row, client), []).append(m)
    print(f"Broker data on /dev/{device or '?'}; CPU in % of one core ({os.cpu_count()} cores: "
          f"{os.cpu_count() * 100} % is the machine full); medians of {a.rounds} rounds.")
    print()
    print("| size | batching | client | msg/s (spread) | client CPU | broker CPU | machine CPU | "
          "broker writes MB/s | disk busy |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (row, client), ms in res.items():
        size, _, batching = row.split(":")
        med = lambda k: statistics.median(m[k] for m in ms)  # noqa: E731
        rates = [m["msg_per_s"] for m in ms]
        busy = "–" if ms[0]["disk_busy"] is None else f"{med('disk_busy'):.0f} %"
        print(f"| {int(size) // 1024} KiB | {'on' if batching == 'true' else 'off'} | {client} | "
              f"{med('msg_per_s'):.0f} ({min(rates):.0f}-{max(rates):.0f}) | {med('client_cpu'):.0f} % | "
              f"{med('broker_cpu'):.0f} % | {med('machine_cpu'):.0f} % | {med('broker_mb_s'):.1f} | {busy} |")


if __name__ == "__main__":
    main()
