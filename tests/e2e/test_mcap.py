"""`rigd replay --mcap` (issue 28): protobuf messages with Foxglove's schemas, zstd/lz4 chunks,
LocationFix from NMEA, metadata, indexes. The spool comes from a real rigd run without a broker
(synthetic camera, audio and NMEA, plus a real serial source on a pty fed GGA+RMC pairs and bad
lines); the file is read back with the format's reference Python reader and
`mcap-protobuf-support` (protobuf decoding from the embedded FileDescriptorSets), NMEA checked
against pynmea2, images and PCM against `rigd replay --out`."""

import hashlib
import json
import os
import shutil
import subprocess
import threading
import time
import tty as tty_module
import urllib.request
import wave
from pathlib import Path

import pytest
from mcap.reader import make_reader

from harness import Rigd, check_synthetic_jpeg, nmea_valid, rigd_bin

mcap_protobuf = pytest.importorskip("mcap_protobuf.decoder")
pynmea2 = pytest.importorskip("pynmea2")

pytestmark = pytest.mark.xdist_group("mcap")  # one worker builds the module's spool once

RIG = "van-28"
TOKEN = "mcap-test-token-0123"  # 16 characters at least (issue 47)
FOXGLOVE = {"foxglove.CompressedImage", "foxglove.RawAudio", "foxglove.LocationFix", "foxglove.Log"}


def checksum(body: str) -> str:
    x = 0
    for ch in body.encode():
        x ^= ch
    return f"${body}*{x:02X}"


def nav_lines(n: int, t0: float) -> list[str]:
    """Epoch `n` of the pty receiver: a GGA and an RMC with the same time of fix and position,
    and now and then a line that does not parse (bad checksum, a bad latitude field)."""
    t = time.gmtime(t0 + n)
    hhmmss = time.strftime("%H%M%S", t) + ".00"
    lat = f"{3351.0 + (n % 500) * 0.0137:09.4f}"   # 33 deg 51' S and moving
    lon = f"{15112.5 + (n % 300) * 0.0211:010.4f}"  # 151 deg 12' E
    lines = [
        checksum(f"GNGGA,{hhmmss},{lat},S,{lon},E,{1 + n % 2},12,0.{7 + n % 3},{20 + n % 7}.4,M,22.1,M,,"),
        checksum(f"GNRMC,{hhmmss},A,{lat},S,{lon},E,0.0,0.0,{time.strftime('%d%m%y', t)},,,A"),
    ]
    if n % 7 == 3:
        lines.append(checksum(f"GNGGA,{hhmmss},{lat},S,{lon},E,1,12,0.7,20.4,M,22.1,M,,")[:-2] + "00")
    if n % 11 == 5:
        lines.append(checksum(f"GNGGA,{hhmmss},33x1.0,S,{lon},E,1,12,0.7,20.4,M,22.1,M,,"))
    return lines


def config(tty: str, token: Path) -> str:
    return f"""
[rig]
id = "{RIG}"

[[source]]
id = "cam"
kind = "synthetic-camera"
width = 160
height = 120
fps = 30

[[source]]
id = "mic"
kind = "synthetic-audio"
channels = 2

[[source]]
id = "gps"
kind = "synthetic-serial"
rate-hz = 20

[[source]]
id = "nav"
kind = "serial"
device = "{tty}"
baud = 115200
framing = "line"

[spool]
path = "spool"

[web]
bind = "127.0.0.1:{{WEB_PORT}}"
token-file = "{token}"
"""


def rigd(*args, timeout=120):
    return subprocess.run([rigd_bin(), *map(str, args)], capture_output=True, text=True, timeout=timeout)


def stat(spool) -> dict:
    r = rigd("spool", "stat", "--spool", spool, "--json")
    assert r.returncode == 0, r.stderr
    return {x["id"]: x for x in json.loads(r.stdout)["sources"]}


@pytest.fixture(scope="module")
def spooled(tmp_path_factory):
    """A spool from ~5 s of capture without a broker, a technician marker in it, daemon stopped."""
    work = tmp_path_factory.mktemp("mcap")
    token = work / "web.token"
    token.write_text(TOKEN)
    master, slave = os.openpty()
    tty_module.setraw(slave)  # no echo, no CR translation before rigd opens the port
    tty = os.ttyname(slave)
    stop = threading.Event()

    def feed():
        t0, n = time.time(), 0
        while not stop.is_set():
            for line in nav_lines(n, t0):
                os.write(master, (line + "\r\n").encode())
            n += 1
            time.sleep(0.1)

    feeder = threading.Thread(target=feed, daemon=True)
    d = Rigd(work, config(tty, token)).start()
    try:
        feeder.start()
        time.sleep(2.5)
        req = urllib.request.Request(d.url("/api/events"), data=json.dumps({"note": "pothole"}).encode(),
                                     headers={"Authorization": f"Bearer {TOKEN}"}, method="POST")
        with urllib.request.urlopen(req, timeout=5) as r:
            assert r.status == 201
        time.sleep(2.5)
        assert d.stop() == 0
    finally:
        stop.set()
        feeder.join(timeout=5)
        d.close()
        os.close(master)
        os.close(slave)
    spool = work / "spool"
    s = stat(spool)
    assert set(s) == {"cam", "mic", "gps", "nav", "events"}, s
    assert s["nav"]["records"] > 40, s["nav"]
    return spool


@pytest.fixture(scope="module")
def exported(spooled, tmp_path_factory):
    """The spool as files (`--out`): the truth the MCAP is checked against."""
    out = tmp_path_factory.mktemp("files") / "out"
    r = rigd("replay", "--spool", spooled, "--out", out)
    assert r.returncode == 0, r.stderr
    return out


def export_mcap(spool, path, *args):
    r = rigd("replay", "--spool", spool, "--mcap", path, "--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def decoded(path):
    """Every message, decoded with the schemas embedded in the file."""
    with open(path, "rb") as f:
        reader = make_reader(f, decoder_factories=[mcap_protobuf.DecoderFactory()])
        return list(reader.iter_decoded_messages(log_time_order=False))


def summary_of(path):
    with open(path, "rb") as f:
        reader = make_reader(f)
        return reader.get_summary(), list(reader.iter_metadata())


def test_protobuf_mcap_decodes_every_message_with_foxglove_schemas(spooled, exported, tmp_path):
    s = stat(spooled)
    path = tmp_path / "drive.mcap"
    report = export_mcap(spooled, path)
    assert report["records"] == sum(x["records"] for x in s.values())
    summary, metadata = summary_of(path)
    channels = {c.topic: c for c in summary.channels.values()}
    assert set(channels) == {"/cam", "/mic", "/gps", "/gps/fix", "/nav", "/nav/fix", "/events"}
    for c in channels.values():
        schema = summary.schemas[c.schema_id]
        assert (schema.encoding, c.message_encoding) == ("protobuf", "protobuf")
        assert schema.name in FOXGLOVE
    names = {t: summary.schemas[c.schema_id].name for t, c in channels.items()}
    assert names == {"/cam": "foxglove.CompressedImage", "/mic": "foxglove.RawAudio",
                     "/gps": "foxglove.Log", "/nav": "foxglove.Log", "/events": "foxglove.Log",
                     "/gps/fix": "foxglove.LocationFix", "/nav/fix": "foxglove.LocationFix"}
    counts = {t: summary.statistics.channel_message_counts.get(c.id, 0) for t, c in channels.items()}
    for source, x in s.items():
        assert counts[f"/{source}"] == x["records"], source

    # The truth from the files export: JPEG sha256 by (capture_ns, seq), the WAV's PCM.
    jpegs = {}
    for p in (exported / "cam").glob("*.jpg"):
        ns, seq = p.stem.split("-")
        jpegs[(int(ns), int(seq))] = hashlib.sha256(p.read_bytes()).hexdigest()
    assert len(jpegs) == s["cam"]["records"]

    seen = {t: 0 for t in channels}
    pcm = bytearray()
    records = {}  # (topic, capture_ns) -> Log text, for the fixes
    for schema, channel, message, proto in decoded(path):
        topic = channel.topic
        seen[topic] += 1
        assert message.publish_time == message.log_time
        ts = proto.timestamp.seconds * 10**9 + proto.timestamp.nanos
        assert ts == message.log_time, topic
        if topic in ("/gps/fix", "/nav/fix"):
            continue
        src = s[topic[1:]]
        assert src["first_capture_ns"] <= message.log_time <= src["last_capture_ns"], topic
        if schema.name == "foxglove.CompressedImage":
            assert proto.format == "jpeg" and proto.frame_id == "cam"
            key = (message.log_time, message.sequence)
            assert hashlib.sha256(proto.data).hexdigest() == jpegs.pop(key), key
            check_synthetic_jpeg(bytes(proto.data))
        elif schema.name == "foxglove.RawAudio":
            assert (proto.format, proto.sample_rate, proto.number_of_channels) == ("pcm-s16", 48000, 2)
            pcm += proto.data
        else:
            assert proto.name == topic[1:]
            records[(topic, message.log_time)] = proto
    assert jpegs == {}, "every spooled image is in the MCAP"
    assert seen == counts

    # RawAudio: the samples equal the spooled PCM (the WAV without the silence it puts in gaps).
    with wave.open(str(exported / "mic.wav")) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (2, 2, 48000)
        wav = w.readframes(w.getnframes())
    gaps = json.loads((exported / "mic.gaps.json").read_text())
    spooled_pcm, pos = bytearray(), 0
    for g in gaps["gaps"]:
        spooled_pcm += wav[pos * 4:g["at_frame"] * 4]
        pos = g["at_frame"] + g["silence_frames"]
    spooled_pcm += wav[pos * 4:]
    assert len(pcm) > 48000 * 4 * 3
    assert bytes(pcm) == bytes(spooled_pcm)

    # Markers: a Log line on /events and a `rigd.event` metadata record.
    events = [m for m in metadata if m.name == "rigd.event"]
    assert len(events) == 1 and events[0].metadata["event"] == "pothole", events
    assert report["mcap"]["markers"] == 1


def test_location_fixes_match_pynmea2(spooled, tmp_path):
    path = tmp_path / "fix.mcap"
    report = export_mcap(spooled, path)
    logs, fixes = {}, {"/gps/fix": [], "/nav/fix": []}
    for schema, channel, message, proto in decoded(path):
        if channel.topic in fixes:
            fixes[channel.topic].append((message, proto))
        elif channel.topic in ("/gps", "/nav"):
            logs.setdefault(channel.topic, []).append((message, proto))

    def reference(line):
        """pynmea2's reading of a line, or None where it is no valid position sentence."""
        if not nmea_valid(line):
            return None
        try:
            m = pynmea2.parse(line)
        except (pynmea2.ParseError, ValueError):
            return None
        return m

    # Every line that does not parse is a WARNING Log line and is counted.
    unparsed = 0
    for topic in ("/gps", "/nav"):
        for message, log in logs[topic]:
            ref = reference(log.message)
            # A line without `$` (the tail of a line cut when the port opened) is no sentence.
            bad = log.message.startswith("$") and (
                ref is None or (isinstance(ref, pynmea2.GGA) and not _position_ok(ref)))
            assert log.level == (3 if bad else 2), log.message
            unparsed += bad
    assert unparsed > 0
    assert report["mcap"]["nmea_unparsed"] == unparsed
    assert report["mcap"]["location_fixes"] == sum(len(v) for v in fixes.values())

    # The synthetic source sends RMC only: one fix per sentence, no altitude, covariance unknown.
    assert len(fixes["/gps/fix"]) == len(logs["/gps"])
    by_time = {m.log_time: log for m, log in logs["/gps"]}
    for message, fix in fixes["/gps/fix"]:
        ref = pynmea2.parse(by_time[message.log_time].message)
        assert abs(fix.latitude - ref.latitude) <= 1e-7 and abs(fix.longitude - ref.longitude) <= 1e-7
        assert fix.altitude != fix.altitude  # NaN
        assert fix.position_covariance_type == 0 and fix.frame_id == "gps"

    # The pty receiver: a GGA and an RMC per epoch make one fix, with the GGA's altitude and HDOP.
    ggas = {}
    for message, log in logs["/nav"]:
        ref = reference(log.message)
        if isinstance(ref, pynmea2.GGA) and _position_ok(ref):
            ggas.setdefault(ref.timestamp, ref)
    assert len(fixes["/nav/fix"]) >= len(ggas) - 1 > 30
    for message, fix in fixes["/nav/fix"]:
        ref = reference(_line_at(logs["/nav"], message.log_time))
        gga = ggas[ref.timestamp]
        assert abs(fix.latitude - ref.latitude) <= 1e-7, (fix, ref)
        assert abs(fix.longitude - ref.longitude) <= 1e-7, (fix, ref)
        assert fix.latitude < 0 < fix.longitude
        assert abs(fix.altitude - (float(gga.altitude) + float(gga.geo_sep))) < 1e-9
        assert fix.position_covariance_type == 1  # APPROXIMATED, from HDOP
        sigma = float(gga.horizontal_dil) * (4.0 if gga.gps_qual in (1, 5) else 0.1)
        assert abs(fix.position_covariance[0] - sigma**2) < 1e-9
        assert len(fix.position_covariance) == 9


def _position_ok(gga) -> bool:
    try:
        return gga.gps_qual > 0 and gga.latitude is not None and bool(gga.lat)
    except (ValueError, TypeError):
        return False


def _line_at(logs, log_time) -> str:
    return next(log.message for m, log in logs if m.log_time == log_time)


def test_metadata_names_the_rig_and_the_file_is_indexed_for_seeking(spooled, tmp_path):
    s = stat(spooled)
    path = tmp_path / "indexed.mcap"
    export_mcap(spooled, path)
    summary, metadata = summary_of(path)
    by_name = {m.name: m.metadata for m in metadata}
    assert by_name["foxglove"] == {"deviceName": RIG}
    rigd_meta = by_name["rigd"]
    assert rigd_meta["rig"] == RIG and rigd_meta["bucket-ms"] == "33"
    assert set(rigd_meta["sources"].split(",")) == set(s)
    assert int(rigd_meta["first-capture-ns"]) == min(x["first_capture_ns"] for x in s.values())
    assert int(rigd_meta["last-capture-ns"]) == max(x["last_capture_ns"] for x in s.values())
    clock = {k: json.loads(v) for k, v in by_name["rigd.clock"].items()}
    assert set(clock) == set(s)
    for source, runs in clock.items():
        assert runs[0][0] == s[source]["first_capture_ns"] and runs[-1][1] == s[source]["last_capture_ns"]
        assert all(state == "unsynced" for _, _, state in runs), runs  # no [clock] interface here

    # Summary, statistics, chunk and message indexes: a reader seeks without scanning.
    assert summary.statistics.message_count == sum(summary.statistics.channel_message_counts.values())
    assert len(summary.chunk_indexes) >= 5
    for c in summary.chunk_indexes:
        assert c.compression == "zstd"
        # 1 s of capture time; a fix that waited for its epoch's second sentence may be older.
        assert c.message_end_time - c.message_start_time < 1_200_000_000
        assert c.uncompressed_size <= 4 * 2**20 + 2**20
        assert c.message_index_offsets, "message indexes for every channel in the chunk"
    assert len(summary.metadata_indexes) >= 4  # foxglove, rigd, rigd.clock, rigd.event
    # A time-range read through the index returns exactly the messages of that range.
    mid = (summary.statistics.message_start_time + summary.statistics.message_end_time) // 2
    with open(path, "rb") as f:
        reader = make_reader(f)
        ranged = [m.log_time for _, _, m in reader.iter_messages(starting_at=mid, ending_before=mid + 10**9)]
    everything = [m.log_time for _, _, m, _ in decoded(path)]
    assert sorted(ranged) == sorted(t for t in everything if mid <= t < mid + 10**9)


@pytest.mark.parametrize("args, compression, encoding", [
    (["--compression", "lz4"], "lz4", "protobuf"),
    (["--compression", "none"], "", "protobuf"),
    (["--encoding", "json"], "zstd", "json"),
])
def test_other_compressions_and_the_json_encoding_read_back(spooled, tmp_path, args, compression, encoding):
    s = stat(spooled)
    path = tmp_path / "other.mcap"
    report = export_mcap(spooled, path, *args)
    assert report["mcap"]["encoding"] == encoding
    summary, _ = summary_of(path)
    assert {c.compression for c in summary.chunk_indexes} == {compression}
    counts = {c.topic: summary.statistics.channel_message_counts.get(c.id, 0)
              for c in summary.channels.values()}
    for source, x in s.items():
        assert counts[f"/{source}"] == x["records"], source
    if encoding == "json":
        assert all(sc.encoding == "jsonschema" for sc in summary.schemas.values())
        assert "/gps/fix" not in counts
        with open(path, "rb") as f:
            for _, ch, m in make_reader(f).iter_messages():
                assert json.loads(m.data)["seq"] == m.sequence or ch.topic == "/events"
    else:
        assert len(decoded(path)) == summary.statistics.message_count


def test_an_existing_output_needs_force(spooled, tmp_path):
    path = tmp_path / "keep.mcap"
    path.write_bytes(b"precious")
    r = rigd("replay", "--spool", spooled, "--mcap", path)
    assert r.returncode == 2 and "--force" in r.stderr, r.stderr
    assert path.read_bytes() == b"precious"
    r = rigd("replay", "--spool", spooled, "--mcap", path, "--force")
    assert r.returncode == 0, r.stderr
    summary, _ = summary_of(path)
    assert summary.statistics.message_count > 0
    # The mcap flags belong to --mcap (--force goes with --out too: a non-empty directory).
    for flag in (["--encoding", "json"], ["--compression", "lz4"]):
        r = rigd("replay", "--spool", spooled, "--out", tmp_path / "o", *flag)
        assert r.returncode == 2 and "--mcap" in r.stderr, (flag, r.stderr)


def test_corrupt_records_are_skipped_and_counted(spooled, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(spooled, copy)
    total = sum(x["records"] for x in stat(copy).values())
    seg = max((copy / "segments").glob("*.seg"), key=lambda p: p.stat().st_size)
    data = bytearray(seg.read_bytes())
    for at in (len(data) // 3, 2 * len(data) // 3):
        for i in range(at, at + 8):
            data[i] ^= 0x5A
    seg.write_bytes(bytes(data))
    path = tmp_path / "damaged.mcap"
    report = export_mcap(copy, path)
    assert 1 <= len(report["corrupt"]) <= 4, report["corrupt"]
    assert report["records"] == total - len(report["corrupt"])
    summary, _ = summary_of(path)
    logs = sum(n for c, n in ((summary.channels[i], n) for i, n in
                              summary.statistics.channel_message_counts.items())
               if not c.topic.endswith("/fix"))
    assert logs == report["records"]


def test_embedded_descriptors_agree_with_foxglove_published_schemas(spooled, tmp_path):
    """Each field rigd declares has the number, type and label of Foxglove's own descriptor
    (PyPI foxglove-schemas-protobuf); Foxglove's later optional fields may be absent."""
    official = pytest.importorskip("foxglove_schemas_protobuf")
    from google.protobuf import descriptor_pb2
    import importlib
    path = tmp_path / "schemas.mcap"
    export_mcap(spooled, path)
    summary, _ = summary_of(path)
    assert {sc.name for sc in summary.schemas.values()} == FOXGLOVE
    for sc in summary.schemas.values():
        short = sc.name.split(".")[1]
        fds = descriptor_pb2.FileDescriptorSet.FromString(sc.data)
        ours = next(m for f in fds.file if f.package == "foxglove" for m in f.message_type if m.name == short)
        theirs_proto = descriptor_pb2.DescriptorProto()
        module = importlib.import_module(f"{official.__name__}.{short}_pb2")
        getattr(module, short).DESCRIPTOR.CopyToProto(theirs_proto)
        theirs = {f.name: f for f in theirs_proto.field}
        for f in ours.field:
            t = theirs[f.name]
            assert (f.number, f.type, f.label, f.type_name) == (t.number, t.type, t.label, t.type_name), \
                (sc.name, f.name)
        assert [(e.name, [(v.name, v.number) for v in e.value]) for e in ours.enum_type] == \
            [(e.name, [(v.name, v.number) for v in e.value]) for e in theirs_proto.enum_type]


def test_an_encrypted_spool_needs_the_key_before_anything_is_written(tmp_path):
    """A spool of sealed frames (end-to-end encryption on, no broker): without --decrypt-key the
    export stops with exit 2 and creates no file; with the fleet's private key every frame is
    decrypted into the same protobuf messages."""
    priv, pub = tmp_path / "fleet.key.pem", tmp_path / "fleet.pem"
    subprocess.run(["openssl", "genrsa", "-traditional", "-out", priv, "2048"], check=True, capture_output=True)
    subprocess.run(["openssl", "rsa", "-in", priv, "-pubout", "-out", pub], check=True, capture_output=True)
    d = Rigd(tmp_path, f"""
[rig]
id = "{RIG}"
[[source]]
id = "cam"
kind = "synthetic-camera"
width = 160
height = 120
fps = 10
[[source]]
id = "gps"
kind = "synthetic-serial"
rate-hz = 10
[pulsar]
encryption-key-file = "{pub}"
encryption-key-name = "fleet-2026"
[spool]
path = "spool"
[web]
bind = "127.0.0.1:{{WEB_PORT}}"
""").start()
    try:
        d.wait_for(lambda s: all(x["frames"] >= 10 for x in s["sources"]), timeout=60, what="spooled")
        assert d.stop() == 0
    finally:
        d.close()
    spool = tmp_path / "spool"
    s = stat(spool)
    path = tmp_path / "sealed.mcap"
    r = rigd("replay", "--spool", spool, "--mcap", path)
    assert r.returncode == 2 and "--decrypt-key" in r.stderr, r.stderr
    assert not path.exists()
    report = export_mcap(spool, path, "--decrypt-key", priv)
    assert report["records"] == sum(x["records"] for x in s.values()) and not report["skipped"]
    counts = {}
    for schema, channel, message, proto in decoded(path):
        counts[channel.topic] = counts.get(channel.topic, 0) + 1
        if schema.name == "foxglove.CompressedImage":
            check_synthetic_jpeg(bytes(proto.data))
        elif channel.topic == "/gps":
            assert nmea_valid(proto.message), proto.message
    assert counts == {"/cam": s["cam"]["records"], "/gps": s["gps"]["records"], "/gps/fix": s["gps"]["records"]}


WEB = Path(__file__).resolve().parent.parent / "web"


def test_the_indexed_reader_foxglove_uses_reads_the_summary_and_seeks(spooled, tmp_path):
    """@mcap/core's McapIndexedReader (npm, what Foxglove's app reads files with; tests/web has it):
    the summary's counts equal the spool's, a time-range query returns what Python's reader
    returns for that range, and a 1-second query reads at most two chunks."""
    if shutil.which("node") is None or not (WEB / "node_modules" / "@mcap" / "core").is_dir():
        pytest.skip("node or tests/web/node_modules missing (tests/setup.sh installs them)")
    s = stat(spooled)
    path = tmp_path / "indexed.mcap"
    export_mcap(spooled, path)
    summary, _ = summary_of(path)
    chunk = sorted(summary.chunk_indexes, key=lambda c: c.message_start_time)[len(summary.chunk_indexes) // 2]
    start, end = chunk.message_start_time, chunk.message_start_time + 10**9 - 1
    r = subprocess.run(["node", WEB / "mcap_read.mjs", path, str(start), str(end)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    js = json.loads(r.stdout)
    assert {x["name"] for x in js["schemas"]} == FOXGLOVE
    assert all(x["encoding"] == "protobuf" for x in js["schemas"])
    for source, x in s.items():
        assert js["counts"][f"/{source}"] == x["records"], source
    with open(path, "rb") as f:
        expected = {}
        for _, ch, m in make_reader(f).iter_messages(starting_at=start, ending_at=end):
            expected[ch.topic] = expected.get(ch.topic, 0) + 1
    assert js["rangeCounts"] == expected and sum(expected.values()) > 0
    assert js["chunks"] >= 5
    assert 1 <= js["chunksRead"] <= 2, js
    assert {"foxglove", "rigd", "rigd.clock", "rigd.event"} <= set(js["metadata"])
