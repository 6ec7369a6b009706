#!/usr/bin/env python3
"""Startup to READY (sd_notify) with an empty spool and with a large one: rigd is started with a
NOTIFY_SOCKET this script binds, and the time from exec to READY=1 is measured, with the page cache
warm and (as root) dropped, median of three starts each.

usage: tests/bench/startup.py --spool-bytes N --rigd target/release/rigd --filler BENCH_BINARY
"""

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def ready_ms(rigd, config, env, crash=False):
    """Exec to READY=1 in ms; then SIGTERM (a clean shutdown) or, with crash, SIGKILL (so the next
    start is an unclean one, which walks the spool index)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "notify")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        sock.settimeout(60)
        t0 = time.monotonic()
        proc = subprocess.Popen([rigd, "run", "--config", str(config)], env={**env, "NOTIFY_SOCKET": path},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while True:
                msg = sock.recv(4096).decode()
                if "READY=1" in msg.split("\n"):
                    return (time.monotonic() - t0) * 1e3
        finally:
            proc.send_signal(signal.SIGKILL if crash else signal.SIGTERM)
            proc.wait(timeout=60)
            sock.close()


def drop_caches():
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spool-bytes", type=int, required=True)
    ap.add_argument("--rigd", required=True)
    ap.add_argument("--filler", required=True, help="the spool bench binary (its --fill mode)")
    ap.add_argument("--dir", default="target/bench-startup")
    a = ap.parse_args()
    base = Path(a.dir).resolve()
    base.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "RIGD_LOG": "warn"}
    print("| spool | records | READY, warm cache (median of 3) | READY, caches dropped (median of 3) |")
    print("|---|---|---|---|")
    for label, size in [("empty", 0), (f"{a.spool_bytes / 2**30:.1f} GiB", a.spool_bytes)]:
        spool = base / "spool"
        records = 0
        if size:
            out = subprocess.run([a.filler, "--fill", str(spool), str(size)], check=True, capture_output=True, text=True)
            records = json.loads([l for l in out.stdout.splitlines() if l.startswith("{")][-1])["records"]
        else:
            subprocess.run(["rm", "-rf", str(spool)], check=True)
        config = base / "rigd.toml"
        # One slow source so the spool barely grows between starts; no broker: nothing drains.
        config.write_text(f'[rig]\nid = "startup"\n[[source]]\nid = "gps"\nkind = "synthetic-serial"\nrate-hz = 1\n'
                          f'[spool]\npath = "{spool}"\nmax-bytes = "{max(size * 2, 1 << 30)}"\nfree-reserve = "1MiB"\n'
                          f'[web]\nbind = "127.0.0.1:0"\n')
        rows = [(label if not size else f"{label}, after a clean shutdown", False)]
        if size:
            rows.append((f"{label}, after a crash (kill -9)", True))
        for row, crash in rows:
            if crash:
                ready_ms(a.rigd, config, env, crash=True)  # leaves the spool unclean
            warm = [ready_ms(a.rigd, config, env, crash) for _ in range(3)]
            cold = []
            for _ in range(3):
                if not drop_caches():
                    break
                cold.append(ready_ms(a.rigd, config, env, crash))
            cold_s = f"{statistics.median(cold):.0f} ms" if cold else "not measured (needs root)"
            print(f"| {row} | {records} | {statistics.median(warm):.0f} ms | {cold_s} |")
    subprocess.run(["rm", "-rf", str(base)], check=True)


if __name__ == "__main__":
    sys.exit(main())
