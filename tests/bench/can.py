#!/usr/bin/env python3
"""The CAN bus's cost (issue 52): rigd with synthetic CAN buses publishing live to the broker, at
2,000 frames/s on one bus and at 8,000 frames/s over two busy buses (4,000 each), beside a
baseline rig with one 1 Hz serial source; rigd's CPU (% of one core) and peak RSS over the window.

The buses are `synthetic-can` (examples/vehicle.dbc's messages with moving values): the frames are
made in the process, so what is measured is rigd's own path per frame (batching into one record per
bucket, the record's encoding, spool and uplink, the status preview), not the kernel's receive. The
SocketCAN driver adds one recvmsg per frame (docs/PERFORMANCE.md says what that costs).

    python3 tests/bench/can.py [--secs 30] [--url pulsar://127.0.0.1:6650] [--quick]"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import ROOT, Rigd, unique  # noqa: E402
from rig_profile import cpu_seconds, status_kb  # noqa: E402

HEAD = """
[rig]
id = "{rig}"
worker-threads = 2
[[source]]
id = "gps"
kind = "synthetic-serial"
rate-hz = 1
"""
BUS = """
[[source]]
id = "bus{n}"
kind = "synthetic-can"
rate-hz = {rate}
dbc = "{dbc}"
"""
TAIL = """
[pulsar]
url = "{url}"
[spool]
path = "spool"
[web]
bind = "127.0.0.1:{{WEB_PORT}}"
"""

PROFILES = [("baseline: one 1 Hz serial source", []),
            ("one bus at 2,000 frames/s", [2000]),
            ("two buses at 4,000 frames/s each (8,000 in all)", [4000, 4000])]


def profile(a, name, rates) -> dict:
    rig = unique("canbench")
    dbc = ROOT / "examples/vehicle.dbc"
    cfg = (HEAD.format(rig=rig) + "".join(BUS.format(n=n, rate=r, dbc=dbc) for n, r in enumerate(rates))
           + TAIL.format(url=a.url))
    with tempfile.TemporaryDirectory() as tmp:
        d = Rigd(Path(tmp), cfg).start()
        try:
            d.wait_for(lambda s: s["uplink"]["connected"], timeout=60, what="connected")
            time.sleep(2)
            pid = d.proc.pid
            s0, c0, t0 = d.status(), cpu_seconds(pid), time.time()
            time.sleep(a.secs)
            s1, c1, t1 = d.status(), cpu_seconds(pid), time.time()
            rows = {"profile": name,
                    "rigd CPU (% of one core)": f"{100 * (c1 - c0) / (t1 - t0):.2f} %",
                    "rigd peak RSS (VmHWM)": f"{status_kb(pid, 'VmHWM') / 1024:.1f} MiB"}
            buses = [(x0, x1) for x0, x1 in zip(s0["sources"], s1["sources"]) if x1["id"].startswith("bus")]
            records = sum(x1["frames"] - x0["frames"] for x0, x1 in buses) / (t1 - t0)
            mb = sum(x1["bytes"] - x0["bytes"] for x0, x1 in buses) / (t1 - t0) / 1e6
            rows["CAN records/s, MB/s"] = f"{records:.1f}, {mb:.3f}" if buses else "—"
            rows["published in the window"] = str(s1["uplink"]["published"] - s0["uplink"]["published"])
            rows["drops"] = str(sum(x1["drops"] - x0["drops"] for x0, x1 in buses))
            assert d.stop() == 0
        finally:
            d.close()
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--secs", type=float, default=30)
    ap.add_argument("--url", default="pulsar://127.0.0.1:6650")
    ap.add_argument("--quick", action="store_true", help="3 s windows (the smoke: no figure means anything)")
    a = ap.parse_args()
    if a.quick:
        a.secs = 3
    cols = [profile(a, name, rates) for name, rates in PROFILES]
    keys = [k for k in cols[0] if k != "profile"]
    print("| metric | " + " | ".join(c["profile"] for c in cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for k in keys:
        print(f"| {k} | " + " | ".join(c.get(k, "—") for c in cols) + " |")


if __name__ == "__main__":
    main()
