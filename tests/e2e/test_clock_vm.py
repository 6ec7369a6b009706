"""`[clock] target = "system"` against a real kernel clock: tests/vm/clock.sh boots Debian's stock
kernel under QEMU TCG with the guest's CLOCK_REALTIME set ~7 s ahead, runs `rigd run` inside with PTP
on a tap whose far end (a network namespace on this host) runs linuxptp's ptp4l as grandmaster of
this host's clock. Every console line carries the host's time of arrival, so the judge compares the
two clocks directly; rigd's status (`/api/status` clock section) and the guest's adjtimex reading
are printed by the guest once a second. This host's own clock is never touched (checked)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from harness import ROOT
from test_camera_vm import ensure_qemu

sys.path.insert(0, str(ROOT / "tests" / "ptp"))
from ptpnet import host_clock_frequency, is_root, missing_tools  # noqa: E402

pytestmark = pytest.mark.vm  # a QEMU guest: the vm lane, one at a time

SCRIPT = ROOT / "tests/vm/clock.sh"
CONSOLE = ROOT / "target/vm-clock/console.log"


def samples() -> tuple[float, list[dict]]:
    """(guest minus host at boot in s, one dict per status sample with the host arrival time)."""
    boot_offset, out = None, []
    for line in CONSOLE.read_bytes().decode(errors="replace").split("\n"):
        arrival, _, rest = line.partition(" ")
        if not arrival.isdigit():
            continue
        m = re.search(r"RIGD-VM-CLOCK BOOTED .* time_s (\d+)", rest)
        if m:
            boot_offset = int(m.group(1)) - int(arrival) / 1e9
        m = re.search(r"RIGD-VM-CLOCK T freq (-?\d+) clock \{(.*)\}$", rest)
        if m:
            clock = json.loads("{" + m.group(2) + "}")
            clock.update(host_ns=int(arrival), kernel_freq=int(m.group(1)))
            out.append(clock)
    assert boot_offset is not None, "no BOOTED line"
    return boot_offset, out


def test_system_target_steps_and_slews_a_real_kernel_clock_onto_the_grandmaster():
    if not is_root():
        pytest.skip("needs root (network namespace, tap)")
    if missing_tools():
        pytest.skip(f"missing {missing_tools()}")
    ensure_qemu()
    freq0 = host_clock_frequency()
    t = time.monotonic()
    out = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=600)
    print(out.stderr[-4000:])
    print(f"tests/vm/clock.sh took {time.monotonic() - t:.1f} s")
    assert out.returncode == 0, f"clock.sh exit {out.returncode}\n{out.stderr[-3000:]}"
    assert host_clock_frequency() == freq0, "this host's clock frequency changed"

    boot_offset, s = samples()
    # The guest booted from the host's RTC and set itself 7 s ahead.
    assert 5.5 < boot_offset < 8.5, boot_offset
    synced = [c for c in s if c["steps"] >= 1]
    assert synced, "rigd never stepped the guest clock"
    log = CONSOLE.read_text(errors="replace")
    # The guest prints rigd's first step on its own line (the log's tail may not reach back to it).
    first_step = re.search(r"RIGD-VM-CLOCK FIRST-STEP .*clock stepped step_ns=(-?\d+)", log)
    assert first_step and -8.5e9 < int(first_step.group(1)) < -5.5e9, first_step

    # Locked, and the kernel's frequency was set through clock_adjtime (slewing, not only steps).
    assert any(c["state"] == "locked" for c in s), [c["state"] for c in s]
    assert any(c["kernel_freq"] != 0 for c in synced)
    # The guest clock now reads the host's time: frame time (which holds over a backward step, so
    # the first seconds after the 7 s step are skipped) against the console line's arrival, which
    # lags the guest by the serial line's latency (tens of ms under TCG).
    tail = s[-10:]
    assert len(s) >= 20, len(s)
    errors_ms = [(c["now_ns"] - c["host_ns"]) / 1e6 for c in tail]
    print("guest minus host (ms), last 10 samples:", [round(e, 1) for e in errors_ms])
    print("PTP offsets (us):", [round((c["offset_ns"] or 0) / 1e3, 1) for c in tail],
          "steps:", tail[-1]["steps"])
    # A console line only arrives late, never early: every sample bounds the guest's error from
    # below, and the least delayed one is the tightest. Beside the other CI lanes single lines
    # were delayed past 250 ms (3 Dec 2026: -37 to -89 ms and one beyond) while the best stayed
    # within 40 ms.
    assert all(e < 50 for e in errors_ms), errors_ms
    assert max(errors_ms) > -150, errors_ms
