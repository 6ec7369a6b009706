"""CAN decoding (issue 52), judged by Python `cantools` and read back with `python-can` and the
official `mcap` reader.

- test_decode_matches_cantools: a DBC drawn at random (Intel and Motorola signals of 1 to 64
  bits, signed and unsigned, IEEE floats, scaled and offset, multiplexed, standard and extended
  ids, CAN FD messages of 64 bytes) and random frames, written as a candump log; every frame goes
  through `rigd can decode` and through cantools with the same DBC text: the same messages, the
  same signals, values equal to 1e-9 relative; frames of unknown ids, remote and error frames
  are not decoded; a switch value no signal is for gives the switch alone (cantools refuses it).
- test_spool_to_mcap_and_candump: a real rigd run with a `synthetic-can` source (vehicle frames
  from examples/vehicle.dbc's messages) spools CAN records (its status shows the record rate and
  the DBC's last signal values); `rigd replay --mcap --dbc` and
  `rigd replay --out` export them. The MCAP's raw frames (channel `/{source}`, `rigd.CanFrame`)
  equal the candump log's frames as python-can reads them; every decoded message (channel
  `/{source}/{Message}`, JSON) equals cantools' decoding of the raw frame with the same
  timestamp (1e-9 relative), and every raw frame the DBC knows has its decoded message.
"""

import json
import math
import os
import random
import subprocess
import time
from pathlib import Path

import pytest

from harness import ROOT, Rigd, rigd_bin

cantools = pytest.importorskip("cantools")
can = pytest.importorskip("can")

EFF = 0x80000000
RTR = 0x40000000
ERR = 0x20000000


def close(a: float, b: float) -> bool:
    if isinstance(b, float) and not math.isfinite(b):
        return a is None or (math.isnan(b) and a is not None and math.isnan(a)) or a == b
    if a is None:
        return False
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def motorola_start(msb_linear: int) -> int:
    """DBC start bit (sawtooth) of a big-endian signal whose MSB is at linear index `msb_linear`
    (index 0: the MSB of byte 0)."""
    return 8 * (msb_linear // 8) + (7 - msb_linear % 8)


def physical_bits(start: int, length: int, intel: bool) -> set:
    """The (byte, bit) positions a signal covers."""
    if intel:
        return {((start + i) // 8, (start + i) % 8) for i in range(length)}
    msb = 8 * (start // 8) + (7 - start % 8)
    return {((msb + i) // 8, 7 - (msb + i) % 8) for i in range(length)}


def random_signal(rng: random.Random, name: str, size: int, taken: set, mux: str = ""):
    """A signal line placed on bits no signal of `taken` covers (cantools, like real DBCs, wants
    no overlaps but between the signals of different switch values); None when none fits."""
    bits = size * 8
    for _ in range(50):
        kind = rng.choice(["u", "s", "u", "s", "f32", "f64"])
        length = {"f32": 32, "f64": 64}.get(kind) or rng.choice([1, 3, 7, 8, 12, 16, 20, 31, 32, 45, 64])
        if length > bits:
            continue
        intel = rng.random() < 0.5
        pos = rng.randrange(0, bits - length + 1)
        start = pos if intel else motorola_start(pos)
        covered = physical_bits(start, length, intel)
        if covered & taken:
            continue
        taken |= covered
        sign = "-" if kind == "s" else "+"
        if kind in ("f32", "f64") or rng.random() < 0.3:
            factor, offset = 1, 0
        else:
            factor = rng.choice([0.1, 0.01, 0.5, 2, 0.0625, 1e-5, 3.7])
            offset = rng.choice([0, -40, 12.5, -1000.25])
        line = (f' SG_ {name} {mux}: {start}|{length}@{1 if intel else 0}{sign} ({factor},{offset}) '
                f'[0|0] "u{name[-1]}" ECU')
        return line, kind
    return None, None


def random_dbc(rng: random.Random):
    """DBC text and per message (frame id as Linux has it, size, name, switch values)."""
    lines = ['VERSION ""', "", "NS_ :", "", "BS_:", "", "BU_: ECU", ""]
    valtypes = []
    messages = []
    used = set()

    def add(dbc_id, name, size, taken, mux=""):
        sig, kind = random_signal(rng, name, size, taken, mux)
        if sig is None:
            return
        lines.append(sig)
        if kind in ("f32", "f64"):
            valtypes.append(f"SIG_VALTYPE_ {dbc_id} {name} : {1 if kind == 'f32' else 2};")

    for m in range(14):
        extended = rng.random() < 0.3
        while True:
            raw = rng.randrange(0x1, 0x1FFFFFFF) if extended else rng.randrange(0x1, 0x7FF)
            if raw not in used:
                used.add(raw)
                break
        size = 64 if m % 5 == 4 else 8
        dbc_id = raw | EFF if extended else raw
        name = f"Msg{m}"
        lines.append(f"BO_ {dbc_id} {name}: {size} ECU")
        plain = set()
        mux_values = []
        if m % 3 == 0:
            # A switch (Intel or Motorola, in byte 0) and signals for the values 0..2.
            if m % 2:
                lines.append(f' SG_ {name}Mux M : 0|8@1+ (1,0) [0|255] "" ECU')
            else:
                lines.append(f' SG_ {name}Mux M : 7|8@0+ (1,0) [0|255] "" ECU')
            plain |= {(0, b) for b in range(8)}
        for k in range(rng.randrange(1, 6)):
            add(dbc_id, f"{name}_s{k}", size, plain)
        if m % 3 == 0:
            mux_values = [0, 1, 2]
            for v in mux_values:
                taken = set(plain)
                for k in range(2):
                    add(dbc_id, f"{name}_m{v}_{k}", size, taken, mux=f"m{v} ")
        lines.append("")
        messages.append((dbc_id, size, name, mux_values))
    lines += valtypes
    lines.append("")
    return "\n".join(lines), messages


def candump_id(can_id: int) -> str:
    if can_id & ERR:
        return f"{can_id & (0x1FFFFFFF | ERR):08X}"
    if can_id & EFF:
        return f"{can_id & 0x1FFFFFFF:08X}"
    return f"{can_id & 0x7FF:03X}"


def test_decode_matches_cantools(tmp_path):
    rng = random.Random(52)
    text, messages = random_dbc(rng)
    dbc_path = tmp_path / "random.dbc"
    dbc_path.write_text(text)
    db = cantools.database.load_string(text, database_format="dbc", strict=False)
    frames = []  # (can_id, data, message name or None)
    t0 = 1_700_000_000
    for i in range(3000):
        can_id, size, name, mux = rng.choice(messages)
        data = bytearray(rng.randbytes(size))
        if mux:
            data[0] = rng.choice(mux + [mux[0], mux[1], 7])  # mostly known switch values
        frames.append((can_id, bytes(data), name))
    # Unknown ids, a remote request and an error frame: never decoded.
    known = {m[0] for m in messages}
    for raw in (0x7FF, 0x123, 0x1ABCDEF):
        if raw not in known and (raw | EFF) not in known:
            frames.append((raw if raw <= 0x7FF else raw | EFF, rng.randbytes(8), None))
    frames.append((messages[1][0] | RTR, b"", None))
    frames.append((ERR | 0x4, bytes(8), None))
    log = tmp_path / "drive.log"
    with log.open("w") as f:
        for n, (can_id, data, _) in enumerate(frames):
            ts = f"({t0 + n // 1000:010d}.{(n % 1000) * 1000:06d})"
            if can_id & RTR:
                body = f"{candump_id(can_id)}#R"
            elif len(data) > 8:
                body = f"{candump_id(can_id)}##0{data.hex().upper()}"
            else:
                body = f"{candump_id(can_id)}#{data.hex().upper()}"
            f.write(f"{ts} vcan0 {body}\n")
    out = subprocess.run([rigd_bin(), "can", "decode", "--dbc", str(dbc_path), "--input", str(log)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    decoded = {}
    for line in out.stdout.splitlines():
        d = json.loads(line)
        decoded[d["line"]] = d
    compared = signals = refused = 0
    for n, (can_id, data, name) in enumerate(frames, start=1):
        got = decoded.get(n)
        if name is None:
            assert got is None, f"line {n}: {can_id:#x} decoded as {got}"
            continue
        assert got is not None, f"line {n}: {name} not decoded"
        assert got["message"] == name
        assert got["id"] == can_id & 0x1FFFFFFF and got["extended"] == bool(can_id & EFF)
        msg = db.get_message_by_name(name)
        try:
            want = msg.decode(data, decode_choices=False, scaling=True)
        except cantools.database.DecodeError as e:
            # A switch value no signal is for: cantools refuses the frame; rigd gives what is
            # valid without it (the switch and the plain signals).
            assert "multiplexer" in str(e), e
            plain = {s.name for s in msg.signals if s.multiplexer_ids is None}
            assert set(got["signals"]) == plain, (n, got)
            refused += 1
            continue
        assert set(got["signals"]) == set(want), (n, name, set(got["signals"]) ^ set(want))
        for k, v in want.items():
            assert close(got["signals"][k], float(v)), (n, name, k, got["signals"][k], v, data.hex())
            signals += 1
        compared += 1
    print(f"\ncan decode: {compared} frames ({signals} signal values) equal to cantools', "
          f"{refused} frames with an unknown switch value, {len(frames)} frames in all")
    assert compared > 2000 and refused > 50
    assert "frames:" in out.stderr


VEHICLE_DBC = ROOT / "examples" / "vehicle.dbc"


def spool_config(spool: Path) -> str:
    return f"""
[rig]
id = "van-52"

[spool]
path = "{spool}"

[web]
bind = "127.0.0.1:{{WEB_PORT}}"

[[source]]
id = "vehicle"
kind = "synthetic-can"
rate-hz = 2000
fd = true
dbc = "{VEHICLE_DBC}"
"""


def mcap_messages(path: Path):
    """(topic, schema name, log time, decoded message) of every message, with the protobuf
    decoder built from the file's own descriptors."""
    from mcap.reader import make_reader
    from mcap_protobuf.decoder import DecoderFactory
    with path.open("rb") as f:
        reader = make_reader(f, decoder_factories=[DecoderFactory()])
        for schema, channel, message, decoded in reader.iter_decoded_messages():
            yield channel.topic, schema.name, message.log_time, decoded


def test_spool_to_mcap_and_candump(tmp_path):
    pytest.importorskip("mcap_protobuf.decoder")
    spool = tmp_path / "spool"
    rigd = Rigd(tmp_path, spool_config(spool))
    try:
        rigd.start()
        rigd.wait_for(lambda s: any(x["id"] == "vehicle" and x["frames"] >= 60 for x in s["sources"]),
                      timeout=30, what="2 s of CAN records")
        # The status page: the bus's frame rate and, with its DBC, the last signal values.
        src = next(x for x in rigd.status()["sources"] if x["id"] == "vehicle")
        assert src["modality"] == "can" and 25 <= src["frame_rate"] <= 35, src["frame_rate"]
        lines = src["last_records"]
        assert any(l.startswith("VehicleSpeed.Speed = ") and l.endswith(" km/h") for l in lines), lines
        assert any(l.startswith("SteeringAngle.Angle = ") for l in lines), lines
        assert rigd.stop() == 0
    finally:
        rigd.close()
    out = tmp_path / "out"
    r = subprocess.run([rigd_bin(), "replay", "--spool", str(spool), "--out", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    # The candump log as python-can reads it (its own parser of can-utils' format).
    logged = []
    with can.CanutilsLogReader(str(out / "vehicle.log")) as reader:
        for m in reader:
            logged.append(m)
    assert len(logged) > 3000, len(logged)
    assert all(m.channel == "vehicle" for m in logged)
    times = [m.timestamp for m in logged]
    assert times == sorted(times), "frames in receive order"
    mcap_file = tmp_path / "drive.mcap"
    r = subprocess.run([rigd_bin(), "replay", "--spool", str(spool), "--mcap", str(mcap_file),
                        "--dbc", str(VEHICLE_DBC)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    raw = []
    decoded = {}
    for topic, schema, log_time, msg in mcap_messages(mcap_file):
        if topic == "/vehicle":
            assert schema == "rigd.CanFrame"
            ts = msg.timestamp.seconds * 1_000_000_000 + msg.timestamp.nanos
            assert ts == log_time
            raw.append((ts, msg.id, msg.extended, msg.fd, msg.brs, msg.esi, bytes(msg.data)))
        else:
            assert topic.startswith("/vehicle/") and schema == "rigd.can." + topic.split("/")[2]
            decoded.setdefault(log_time, []).append((topic.split("/")[2], msg))
    raw.sort(key=lambda r: r[0])
    # Raw frames: the MCAP's equal the candump log's (python-can), frame by frame, at the log's
    # microsecond resolution.
    assert len(raw) == len(logged)
    for (ts, ident, ext, fd, brs, esi, data), m in zip(raw, logged):
        assert ts // 1000 == round(m.timestamp * 1e6), (ts, m.timestamp)
        assert (ident, ext, fd, brs, esi, data) == (
            m.arbitration_id, m.is_extended_id, m.is_fd, m.bitrate_switch, m.error_state_indicator,
            bytes(m.data))
    assert {r[1] for r in raw} == {0x100, 0x101, 0x102, 0x200, 0x18FEF200, 0x300}
    assert any(r[3] for r in raw) and any(r[2] for r in raw)
    # Decoded signals: each raw frame's decoded message equals cantools' decoding of its bytes.
    db = cantools.database.load_file(str(VEHICLE_DBC))
    values = 0
    for ts, ident, ext, fd, brs, esi, data in raw:
        want_msg = db.get_message_by_frame_id(ident)
        want = want_msg.decode(data, decode_choices=False)
        got = [m for name, m in decoded.get(ts, []) if name == want_msg.name]
        assert len(got) == 1, (ts, hex(ident), decoded.get(ts))
        for s in want_msg.signals:
            v = getattr(got[0], s.name)
            if s.name in want:
                assert close(v, float(want[s.name])), (ts, s.name, v, want[s.name])
                values += 1
            else:
                assert math.isnan(v), (ts, s.name, v, "a signal its switch does not select is NaN")
    n_decoded = sum(len(v) for v in decoded.values())
    assert n_decoded == len(raw)
    # The JSON encoding: the same raw frames and values (a signal not selected is left out).
    json_file = tmp_path / "drive-json.mcap"
    r = subprocess.run([rigd_bin(), "replay", "--spool", str(spool), "--mcap", str(json_file),
                        "--encoding", "json", "--dbc", f"vehicle={VEHICLE_DBC}"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    from mcap.reader import make_reader
    jraw = jdec = 0
    with json_file.open("rb") as f:
        for schema, channel, message in make_reader(f).iter_messages():
            body = json.loads(message.data)
            if channel.topic == "/vehicle":
                jraw += 1
                continue
            jdec += 1
            pb = [m for name, m in decoded[message.log_time] if f"/vehicle/{name}" == channel.topic][0]
            for k, v in body.items():
                if k != "timestamp":
                    assert v == getattr(pb, k), (channel.topic, k, v)
            assert schema.encoding == "jsonschema"
    assert (jraw, jdec) == (len(raw), n_decoded)
    print(f"\nspool -> mcap: {len(raw)} raw frames equal to the candump log's, {n_decoded} decoded "
          f"messages ({values} signal values) equal to cantools'")


def test_live_view_carries_raw_frames_and_decoded_signals(tmp_path):
    """The live view (Foxglove's own ws-protocol client, tests/web/live_client.mjs, decoding with
    the schemas rigd advertises): `/vehicle` carries the raw frames, `/vehicle/{Message}` the
    decoded signals, each equal to cantools' decoding of the raw frame of the same timestamp."""
    client = ROOT / "tests" / "web" / "live_client.mjs"
    if not (ROOT / "tests" / "web" / "node_modules").exists():
        pytest.skip("tests/web node modules not installed (tests/setup.sh)")
    rigd = Rigd(tmp_path, spool_config(tmp_path / "spool"))
    try:
        rigd.start()
        topics = ["/vehicle", "/vehicle/VehicleSpeed", "/vehicle/SteeringAngle", "/vehicle/Powertrain",
                  "/vehicle/BatteryCells"]
        args = [a for t in topics for a in ("--subscribe", t)]
        r = subprocess.run(["node", str(client), f"ws://127.0.0.1:{rigd.port}/foxglove", *args,
                            "--seconds", "2"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        seen = json.loads(r.stdout)
    finally:
        rigd.stop()
        rigd.close()
    by_topic = {}
    for m in seen["messages"]:
        by_topic.setdefault(m["topic"], []).append(m)
    chans = {c["topic"]: c["schemaName"] for c in seen["channels"]}
    assert chans["/vehicle"] == "rigd.CanFrame" and chans["/vehicle/Brake"] == "rigd.can.Brake"
    raw = {int(m["timestamp"]): m for m in by_topic.get("/vehicle", [])}
    assert len(raw) > 1000, len(raw)
    db = cantools.database.load_file(str(VEHICLE_DBC))
    checked = 0
    for topic in topics[1:]:
        msgs = by_topic.get(topic, [])
        assert msgs, f"nothing on {topic}"
        want_msg = db.get_message_by_name(topic.split("/")[2])
        for m in msgs:
            frame = raw.get(int(m["timestamp"]))
            if frame is None:
                continue  # subscribed a moment before or after /vehicle
            assert frame["id"] == want_msg.frame_id
            want = want_msg.decode(bytes.fromhex(frame["data"]), decode_choices=False)
            for name, v in m["signals"].items():
                if name in want:
                    assert close(v, float(want[name])), (topic, name, v, want[name])
                    checked += 1
                else:
                    assert v is None, (topic, name, v, "NaN where the switch does not select it")
    assert checked > 500, checked
    print(f"\nlive view: {len(raw)} raw frames, {checked} decoded signal values equal to cantools'")


def test_rigd_check_names_a_dbc_that_does_not_parse_and_its_line(tmp_path):
    bad = tmp_path / "bad.dbc"
    text = VEHICLE_DBC.read_text().replace(' SG_ Pedal : 12|1@1+', ' SG_ Pedal : 12|x@1+')
    bad.write_text(text)
    line = next(i for i, l in enumerate(text.splitlines(), 1) if "Pedal" in l)
    cfg = tmp_path / "rig.toml"
    cfg.write_text(spool_config(tmp_path / "spool").replace(str(VEHICLE_DBC), str(bad))
                   .replace("{WEB_PORT}", "18099"))
    r = subprocess.run([rigd_bin(), "check", "--config", str(cfg)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert f"{bad} line {line}: does not parse" in r.stderr, r.stderr
    assert "dbc" in r.stderr
    cfg.write_text(spool_config(tmp_path / "spool").replace("{WEB_PORT}", "18099"))
    r = subprocess.run([rigd_bin(), "check", "--config", str(cfg)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
