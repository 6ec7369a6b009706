"""The rig clock against a real grandmaster: linuxptp's ptp4l in network namespaces this test
creates (and deletes, also on failure), rigd in its own namespace disciplining its virtual clock.

Ground truth: every namespace shares the host's CLOCK_REALTIME, which ptp4l serves, so
`clock.realtime_error_ns` in rigd's status (rig clock minus CLOCK_REALTIME, computed inside rigd at
request time) is the true error. On a 2-core machine CPU contention produces occasional outliers in
software timestamps, so accuracy is judged on the median and the 90th percentile of the samples,
with the maximum reported, not asserted.

The host clock is never adjusted: ptp4l runs master-only with free_running 1 and rigd steers only
its own clock; each test checks adjtimex's frequency (read with modes = 0) is unchanged."""

from __future__ import annotations

import sys
import time

import pytest

from harness import ROOT, rigd_bin

sys.path.insert(0, str(ROOT / "tests" / "ptp"))

from ptpnet import (PtpNet, RigInNetns, host_clock_frequency, is_root, missing_tools,  # noqa: E402
                    remove_stale, stats_ns)

pytestmark = [
    pytest.mark.skipif(not is_root(), reason="PTP tests need root (network namespaces, ports 319/320)"),
    pytest.mark.skipif(bool(missing_tools()), reason=f"PTP tests need {missing_tools()} (tests/setup.sh installs linuxptp)"),
]

LIMIT_NS = 5_000
MIN_SAMPLES = 20  # a judged stretch of status reads


@pytest.fixture
def host_clock():
    """The kernel clock's frequency must be the same after the test as before."""
    before = host_clock_frequency()
    yield before
    assert host_clock_frequency() == before, "the host clock's frequency was adjusted"


def make_net(tmp_path, transport="udp4", bridged=False):
    remove_stale()
    return PtpNet(tmp_path, transport, bridged=bridged)


def locked(c):
    return c["state"] == "locked"


def judge(samples: list[dict], what: str) -> dict:
    errs = [s["realtime_error_ns"] for s in samples]
    st = stats_ns(errs)
    within = sum(1 for e in errs if abs(e) < LIMIT_NS) / max(1, len(errs))
    print(f"{what}: n={st['n']} rms={st['rms']:.0f}ns median={st['median']}ns p95={st['p95']}ns "
          f"max={st['max']}ns within 5us={within:.0%}")
    assert st["n"] >= MIN_SAMPLES, "too few status samples"
    assert st["median"] < LIMIT_NS, st
    assert within >= 0.9, f"{within:.0%} of samples within 5 us: {st}"
    return st


@pytest.mark.parametrize("transport", ["udp4", "l2"])
def test_locks_to_ptp4l_within_5us(transport, tmp_path, host_clock):
    net = make_net(tmp_path, transport)
    try:
        net.up()
        net.start_gm("gm1", priority1=10)
        rig = RigInNetns(net, rigd_bin()).start()
        t0 = time.time()
        c = rig.wait_clock(locked, 45, "lock")
        print(f"{transport}: locked {time.time() - t0:.1f}s after start, master {c['master']}")
        assert c["master"] == net.gm_identity("gm1")
        assert c["port_state"] == "slave"
        assert c["path_delay_ns"] is not None and 0 <= c["path_delay_ns"] < 1_000_000
        # 20 s: a CI run (2 cores, broker and suite around) once caught a 1.3 s excursion to 5.5 us
        # within a 10 s window (87 % within 5 us); a quiet run stays under 2 us throughout.
        judge(rig.sample_errors(20, at_least=MIN_SAMPLES), f"{transport} after lock")
        c = rig.clock()
        assert c["state"] == "locked" and c["steps"] == 0, c
        status = rig.status()
        assert status["sources"][0]["frames"] > 0
        assert rig.stop() == 0
        log = rig.log()
        assert "PTP master selected" in log and 'to="locked"' in log
    finally:
        net.down()


def test_300ms_off_and_50ppm_fast_steps_once_then_slews_and_never_goes_back(tmp_path, host_clock):
    net = make_net(tmp_path)
    try:
        net.up()
        net.start_gm("gm1", priority1=10)
        # 300 ms ahead: the one step is backwards, the hard case for frame timestamps.
        rig = RigInNetns(net, rigd_bin(), offset_ns=300_000_000, ppm=50.0).start()
        c = rig.clock()
        assert c["state"] == "unsynced" and abs(c["realtime_error_ns"] - 300_000_000) < 5_000_000
        last_now = c["now_ns"]
        seen_states = []
        deadline = time.time() + 60
        while time.time() < deadline:
            c = rig.clock()
            assert c["now_ns"] >= last_now, f"rig clock went back: {last_now} -> {c['now_ns']}"
            last_now = c["now_ns"]
            if not seen_states or seen_states[-1] != c["state"]:
                seen_states.append(c["state"])
            if c["state"] == "locked" and c["steps"] == 1 and abs(c["realtime_error_ns"]) < LIMIT_NS:
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"no lock: {c}\n{rig.log()[-3000:]}")
        print("states:", seen_states, "frequency_ppm:", c["frequency_ppm"])
        assert seen_states[0] == "unsynced" and "locking" in seen_states
        samples = rig.sample_errors(8)
        for s in samples:
            assert s["now_ns"] >= last_now
            last_now = s["now_ns"]
        judge(samples, "after step and slew")
        c = rig.clock()
        assert c["steps"] == 1, f"expected exactly one step, got {c['steps']}"
        # The correction compensates the simulated +50 ppm oscillator. Each reading also holds the
        # servo's proportional term for the last offset (ppm for a microsecond at 8 Hz), so the
        # learned frequency is the mean over the samples.
        freq = sum(s["frequency_ppm"] for s in samples) / len(samples)
        print(f"mean frequency_ppm over {len(samples)} samples: {freq:.3f}")
        assert abs(freq + 50.0) < 1.0, (freq, c)
        assert rig.stop() == 0
        assert rig.log().count("clock stepped") == 1
    finally:
        net.down()


def test_grandmaster_lost_holdover_then_locked_again(tmp_path, host_clock):
    net = make_net(tmp_path)
    try:
        net.up()
        net.start_gm("gm1", priority1=10)
        rig = RigInNetns(net, rigd_bin(), ppm=20.0).start()
        rig.wait_clock(locked, 45, "lock")
        time.sleep(3)  # let the frequency estimate settle
        net.gms["gm1"].kill()  # SIGKILL by pid: the master vanishes without a word
        net.gms.pop("gm1").wait()
        c = rig.wait_clock(lambda c: c["state"] == "holdover", 15, "holdover")
        assert c["estimated_drift_ns"] is not None
        # Holdover keeps the learned frequency: over 5 s the +20 ppm oscillator would drift 100 us;
        # disciplined it stays within a few microseconds.
        samples = rig.sample_errors(5, period=0.25)
        worst = max(abs(s["realtime_error_ns"]) for s in samples)
        states = {s["state"] for s in samples}
        print(f"holdover: worst error {worst} ns over 5 s, estimated drift "
              f"{samples[-1]['estimated_drift_ns']} ns, states {states}")
        assert states == {"holdover"}
        assert worst < 20_000
        assert samples[-1]["estimated_drift_ns"] >= c["estimated_drift_ns"]
        net.start_gm("gm1", priority1=10)
        c = rig.wait_clock(locked, 45, "lock after the master came back")
        assert c["steps"] == 0, "no step needed after a short holdover"
        judge(rig.sample_errors(5, at_least=MIN_SAMPLES), "relocked")
        assert rig.stop() == 0
        log = rig.log()
        assert 'to="holdover"' in log and "PTP master lost" in log
    finally:
        net.down()


def test_better_grandmaster_appears_bmca_switches(tmp_path, host_clock):
    net = make_net(tmp_path, bridged=True)
    try:
        net.up()
        net.start_gm("gm1", priority1=20)
        # Software timestamps through a Linux bridge jitter by several microseconds (docs/CLOCK.md):
        # 16 samples in a row within the default 1 us can take minutes there (one CI run: not in
        # 45 s). A path like this one is configured with a lock threshold it can keep.
        rig = RigInNetns(net, rigd_bin(), clock_extra="lock-threshold-ns = 5000\nunlock-threshold-ns = 20000").start()
        c = rig.wait_clock(lambda c: locked(c) and c["master"] == net.gm_identity("gm1"), 60,
                           "lock to gm1")
        net.start_gm("gm2", priority1=5)
        c = rig.wait_clock(lambda c: c["master"] == net.gm_identity("gm2"), 30,
                           "BMCA to select gm2 (better priority1)")
        assert c["master_changes"] == 1
        c = rig.wait_clock(locked, 45, "lock to gm2")
        # through the bridge the error is larger (asymmetric forwarding) but still microseconds
        assert abs(c["realtime_error_ns"]) < 50_000, c
        assert rig.stop() == 0
        log = rig.log()
        assert "PTP master changed (BMCA)" in log
        assert net.gm_identity("gm2") in log
    finally:
        net.down()
