"""rigd with synthetic camera, audio and serial sources publishes to the real broker; the official
Python client is the judge of the wire format (SPEC.md)."""

import io
import time

from PIL import Image

from harness import Rigd, check_synthetic_jpeg, consume, nmea_valid, unique

CONFIG = """
[rig]
id = "{rig}"

[[source]]
id = "front"
kind = "synthetic-camera"
width = 320
height = 240
fps = 15

[[source]]
id = "mic"
kind = "synthetic-audio"
sample-rate = 48000
channels = 2

[[source]]
id = "gps"
kind = "synthetic-serial"
rate-hz = 20

[pulsar]
url = "{url}"

[spool]
path = "spool"

[web]
bind = "127.0.0.1:{WEB_PORT}"
"""

REQUIRED = {"rig", "source", "modality", "seq", "capture-ns", "bucket", "bucket-ms", "clock", "content-type"}


def test_synthetic_rig_publishes_the_spec_wire_format(broker, tmp_path):
    rig = unique("e2e")
    d = Rigd(tmp_path, CONFIG.replace("{rig}", rig).replace("{url}", broker)).start()
    try:
        d.wait_for(lambda s: s["uplink"]["connected"], timeout=60, what="uplink connected")
        t0 = time.time()
        time.sleep(5)
        assert d.stop() == 0, d.log()[-3000:]
        elapsed = time.time() - t0
    finally:
        d.close()
    assert "spooled_records=0" in d.log(), "frames left unpublished at shutdown:\n" + d.log()[-3000:]

    topics = {s: f"persistent://public/default/{rig}-{s}" for s in ("front", "mic", "gps")}
    by_source = {}
    for source, topic in topics.items():
        msgs = consume(broker, [topic], idle_timeout_s=5)
        assert msgs, f"nothing on {topic}"
        by_source[source] = msgs
        seqs = [int(m["properties"]["seq"]) for m in msgs]
        assert sorted(seqs) == list(range(len(seqs))), f"{source}: seq gaps or duplicates: {seqs[:20]}..."
        for m in msgs:
            p = m["properties"]
            assert REQUIRED <= p.keys(), f"missing properties: {REQUIRED - p.keys()}"
            assert p["rig"] == rig and p["source"] == source
            assert p["clock"] == "unsynced"
            capture_ms = int(p["capture-ns"]) // 1_000_000
            assert m["event_timestamp"] == capture_ms
            assert m["key"] == str(m["event_timestamp"] // 33) == p["bucket"]
            assert p["bucket-ms"] == "33"
    # Messages of one producer arrive in seq order on a single consumer.
    for source, msgs in by_source.items():
        seqs = [int(m["properties"]["seq"]) for m in msgs]
        assert seqs == sorted(seqs), f"{source} out of order"

    for m in by_source["front"]:
        p = m["properties"]
        assert p["modality"] == "camera" and p["content-type"] == "image/jpeg"
        img = Image.open(io.BytesIO(m["payload"]))
        img.load()
        assert img.size == (320, 240) == (int(p["width"]), int(p["height"]))
        check_synthetic_jpeg(m["payload"])
    for m in by_source["mic"]:
        p = m["properties"]
        assert p["modality"] == "audio"
        assert p["content-type"] == "audio/L16;rate=48000;channels=2"
        assert int(p["frames"]) == 1584
        assert m["payload_len"] == int(p["frames"]) * int(p["channels"]) * 2
        # Audio blocks are stamped at their bucket's start.
        assert int(p["capture-ns"]) % 33_000_000 == 0
    for m in by_source["gps"]:
        p = m["properties"]
        assert p["modality"] == "serial" and p["content-type"] == "text/plain"
        assert nmea_valid(m["payload"].decode()), m["payload"]

    rates = {s: len(msgs) / elapsed for s, msgs in by_source.items()}
    print(f"\nframes/s published per source over {elapsed:.1f}s: " +
          ", ".join(f"{s} {r:.1f}" for s, r in rates.items()))
