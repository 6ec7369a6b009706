"""Proxy-first video (issue 49.1, docs/DRIVERS.md "Proxy", docs/RECALL.md "Recall by the proxy"):
an H.264 camera held on the rig (`upload = "on-request"`) with a small proxy published live as a
source of its own (`cam-proxy`). A range read off the proxy, as an operator would choose it, is
recalled with `rigd recall`, and the full-resolution frames that arrive are exactly the frames the
proxy showed in that range. Judged by the official Python client and PyAV (libavcodec), never by
rigd's own decoder."""

import collections
import json
import os
import subprocess
import time

import pulsar
import pytest

from harness import BROKER_URL, ROOT, Rigd, namespace_with_dedup, rigd_bin, unique
from test_video import decode_group, nal_types

GOP = 10  # buckets: a group every 330 ms
FULL = (640, 360)
PROXY = (320, 180)
PROXY_KBIT = 150
S = 1_000_000_000
# The "done when": a 10 s range of a 1080p30 camera with its 854x480 proxy at 300 kbit/s.
HD = dict(full=(1920, 1080), proxy=(854, 480), proxy_kbit=300, bitrate="2mbit", range_s=10)
SMALL = dict(full=FULL, proxy=PROXY, proxy_kbit=PROXY_KBIT, bitrate="1500kbit", range_s=3)


def config(ns: str, rig: str, full=FULL, proxy=PROXY, proxy_kbit=PROXY_KBIT, bitrate="1500kbit") -> str:
    return f"""
[rig]
id = "{rig}"

[[source]]
id = "cam"
kind = "synthetic-camera"
codec = "h264"
width = {full[0]}
height = {full[1]}
fps = 30
bitrate = "{bitrate}"
gop = {GOP}
upload = "on-request"
retain-age = "10m"
proxy = {{ width = {proxy[0]}, height = {proxy[1]}, bitrate = "{proxy_kbit}kbit" }}

[pulsar]
url = "{BROKER_URL}"
topic = "persistent://{ns}/{{rig}}-{{source}}"

[spool]
path = "spool"

[web]
bind = "127.0.0.1:{{WEB_PORT}}"
"""


def frame(m) -> dict:
    p = m.properties()
    return {"capture": int(p["capture-ns"]), "seq": int(p["seq"]), "key": p["keyframe"] == "true",
            "group": p["group"], "bucket": p["bucket"], "props": p, "data": m.data()}


def receive_span(consumer, span_ns: int, limit_s: float) -> list[dict]:
    """Proxy frames as they arrive, until they cover `span_ns` of capture time."""
    got, deadline = [], time.time() + limit_s
    while time.time() < deadline:
        try:
            m = consumer.receive(timeout_millis=1000)
        except pulsar.Timeout:
            continue
        consumer.acknowledge(m)
        got.append(frame(m))
        if got[-1]["capture"] - got[0]["capture"] >= span_ns:
            return got
    raise AssertionError(f"the proxy covered only {len(got)} frames in {limit_s} s")


def decode_groups(frames: list[dict], size: tuple[int, int]) -> int:
    """Every group decoded from its keyframe by a fresh PyAV decoder; every frame a picture of
    `size`. Returns the pictures decoded."""
    groups = collections.defaultdict(list)
    for f in frames:
        groups[f["group"]].append(f)
    decoded = 0
    for g, fs in groups.items():
        fs.sort(key=lambda f: f["seq"])
        assert fs[0]["key"] and 5 in nal_types(fs[0]["data"]), f"group {g} starts without its keyframe"
        pictures = decode_group([f["data"] for f in fs])
        assert len(pictures) == len(fs), f"group {g}: {len(pictures)} of {len(fs)} decoded"
        assert all((p.width, p.height) == size for p in pictures), (g, pictures[0].width, pictures[0].height)
        decoded += len(pictures)
    return decoded


@pytest.mark.parametrize("case", [SMALL, HD], ids=["640x360-3s", "1080p-10s"])
def test_a_range_read_off_the_proxy_recalls_exactly_its_frames_at_full_resolution(broker, tmp_path, case):
    FULL, PROXY, PROXY_KBIT, range_s = case["full"], case["proxy"], case["proxy_kbit"], case["range_s"]
    ns = namespace_with_dedup(unique("proxy"))
    rig = unique("prx")
    d = Rigd(tmp_path, config(ns, rig, FULL, PROXY, PROXY_KBIT, case["bitrate"]))
    client = pulsar.Client(BROKER_URL, log_conf_file_path=None)
    try:
        proxy_topic = f"persistent://{ns}/{rig}-cam-proxy"
        live = client.subscribe(proxy_topic, "viewer", consumer_type=pulsar.ConsumerType.Exclusive,
                                initial_position=pulsar.InitialPosition.Earliest)
        d.start()
        d.wait_for(lambda s: s["uplink"]["connected"], timeout=60, what="uplink connected")
        # What a viewer sees: the range and 2.5 s more of the proxy, live.
        seen = receive_span(live, (range_s + 2.5) * S, limit_s=range_s + 40)
        s = d.status()
        cards = {c["id"]: c for c in s["sources"]}
        assert cards["cam-proxy"]["kind"] == "proxy", cards["cam-proxy"]
        assert cards["cam-proxy"]["upload"] == "live" and cards["cam-proxy"]["published"] > 0, cards["cam-proxy"]
        assert cards["cam-proxy"]["priority"] == cards["cam"]["priority"]
        assert cards["cam"]["upload"] == "on-request" and cards["cam"]["published"] == 0, cards["cam"]
        # `encoder = "auto"` (the default) on a machine without an M2M H.264 encoder: software.
        for card in ("cam", "cam-proxy"):
            assert "encoder software (OpenH264)" in cards[card]["detail"], cards[card]
        # The operator's choice: from a proxy keyframe at least a second in, `range_s` (to the
        # proxy frame that many seconds later, excluded).
        keys = [f for f in seen if f["key"] and f["capture"] >= seen[0]["capture"] + S]
        assert keys, "no proxy keyframe a second in"
        frm = keys[0]["capture"]
        to = next(f["capture"] for f in seen if f["capture"] >= frm + range_s * S)
        chosen = [f for f in seen if frm <= f["capture"] < to]
        cli = subprocess.run([rigd_bin(), "recall", "--pulsar", BROKER_URL, "--rig", rig,
                              "--control-topic", f"persistent://{ns}/{{rig}}-control", "--source", "cam",
                              "--from", str(frm), "--to", str(to), "--wait", "--json", "--timeout", "40"],
                             capture_output=True, text=True, timeout=60)
        assert cli.returncode == 0, cli.stderr[-3000:]
        answers = [json.loads(line) for line in cli.stdout.splitlines()]
        done = answers[-1]
        assert done["state"] == "done", answers
        assert not done.get("from_keyframe"), f"the range starts on a keyframe: nothing to extend: {done}"
        # The proxy's rate, by capture time over what the viewer received (the last frame closes
        # the span).
        span = (seen[-1]["capture"] - seen[0]["capture"]) / S
        kbit = sum(len(f["data"]) for f in seen[:-1]) * 8 / span / 1000
        assert d.stop() == 0
    finally:
        d.close()
        client.close()
    full_topic = f"persistent://{ns}/{rig}-cam"
    reader = pulsar.Client(BROKER_URL, log_conf_file_path=None)
    try:
        c = reader.subscribe(full_topic, "check", consumer_type=pulsar.ConsumerType.Exclusive,
                             initial_position=pulsar.InitialPosition.Earliest)
        full = []
        while True:
            try:
                m = c.receive(timeout_millis=4000)
            except pulsar.Timeout:
                break
            c.acknowledge(m)
            full.append(frame(m))
    finally:
        reader.close()
    recalled = [f for f in full if f["props"].get("recall") == done["id"]]
    assert len(recalled) == len(full), "only the recall's frames on the camera's topic (nothing live)"
    # Exactly the frames the proxy showed in the range: 0 missing, 0 extra, each once.
    want = collections.Counter(f["capture"] for f in chosen)
    got = collections.Counter(f["capture"] for f in recalled)
    missing, extra = want - got, got - want
    assert not missing and not extra, f"{len(missing)} missing, {len(extra)} extra"
    assert max(got.values()) == 1 and len({f["seq"] for f in recalled}) == len(recalled), "a frame twice"
    assert done["sent"]["frames"] == len(recalled), done
    # Same capture stamp, same bucket, same group, keyframes on the same group starts.
    by_capture = {f["capture"]: f for f in recalled}
    for p in chosen:
        f = by_capture[p["capture"]]
        assert (f["bucket"], f["group"], f["key"]) == (p["bucket"], p["group"], p["key"]), (f["props"], p["props"])
        assert (f["props"]["width"], f["props"]["height"]) == tuple(map(str, FULL))
        assert (p["props"]["width"], p["props"]["height"]) == tuple(map(str, PROXY))
    full_pictures = decode_groups(recalled, FULL)
    first_key = next(i for i, f in enumerate(seen) if f["key"])
    proxy_pictures = decode_groups(seen[first_key:], PROXY)
    print(f"proxy {PROXY[0]}x{PROXY[1]}: {kbit:.0f} kbit/s over {span:.1f} s ({proxy_pictures} pictures decoded); "
          f"range {(to - frm) / S:.2f} s read off the proxy: {len(chosen)} proxy frames, "
          f"{len(recalled)} full {FULL[0]}x{FULL[1]} frames recalled, {full_pictures} decoded")
    # Exactly the proxy's frames, each decoded. The count only says the range held a real stream:
    # the synthetic 1080p camera draws and encodes in software and skips the pictures it cannot
    # make in time (300 of 10 s at 30 fps alone, 181 and 140 in loaded fresh-clone runs beside the
    # other lanes and a QEMU guest), so at least 10 per second.
    assert full_pictures == len(chosen) >= 10 * range_s
    assert kbit < 2 * PROXY_KBIT, f"the proxy runs at {kbit:.0f} kbit/s for {PROXY_KBIT}kbit"


def test_check_refuses_a_proxy_it_cannot_make(tmp_path):
    """`rigd check` names the key of each proxy it cannot make (exit 2), and passes a good one."""
    base = ('[rig]\nid = "a"\n[[source]]\nid = "cam"\nkind = "synthetic-camera"\nwidth = 640\nheight = 360\n'
            'codec = "h264"\n')
    for extra, says in [
        ('proxy = { width = 320, height = 180 }\n', None),
        ('clip = "/dev/null"\nproxy = {}\n', "source[0].proxy: needs the camera's pictures encoded on the rig"),
        ('proxy = { width = 1280, height = 180 }\n', "source[0].proxy.width: 1280 is above the camera's width (640)"),
        ('proxy = { width = 320, height = 181 }\n', "source[0].proxy.height: 181 must be even"),
        ('proxy = { bitrate = "5kbit", width = 320, height = 180 }\n', "source[0].proxy.bitrate:"),
        ('proxy = { width = 320, height = 180 }\n[[source]]\nid = "cam-proxy"\nkind = "synthetic-serial"\n',
         "source[1].id: `cam-proxy` is the id of source[0]'s proxy"),
    ]:
        p = tmp_path / "p.toml"
        p.write_text(base + extra)
        r = subprocess.run([rigd_bin(), "check", "--config", str(p)], capture_output=True, text=True)
        if says is None:
            assert r.returncode == 0, (extra, r.stdout, r.stderr)
        else:
            assert r.returncode == 2 and says in r.stdout + r.stderr, (extra, r.stdout, r.stderr)
    p.write_text(base.replace('codec = "h264"\n', "") + 'proxy = { width = 320, height = 180 }\n')
    r = subprocess.run([rigd_bin(), "check", "--config", str(p)], capture_output=True, text=True)
    assert r.returncode == 2 and 'source[0].proxy: needs codec = "h264"' in r.stdout + r.stderr, r.stdout + r.stderr


PAGE_LINKS = """
import { chromium } from "playwright-core";
const browser = await chromium.launch({ executablePath: process.env.CHROMIUM,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"] });
const page = await browser.newPage();
await page.goto(process.argv[1], { waitUntil: "domcontentloaded" });
await page.waitForFunction(() => [...document.querySelectorAll(".proxy-link")].filter((a) => !a.hidden).length === 2,
  null, { timeout: 15000 });
const links = await page.$$eval(".proxy-link", (as) => Object.fromEntries(as.filter((a) => !a.hidden)
  .map((a) => [a.closest("[data-source]").dataset.source, [a.textContent, a.getAttribute("href")]])));
process.stdout.write(JSON.stringify(links));
await browser.close();
"""


def page_links(url: str) -> dict:
    """The camera/proxy links the status page shows, read by headless Chromium (playwright-core,
    as tests/web/browser.mjs drives it): {card: [text, href]}."""
    from test_web import chromium
    r = subprocess.run(["node", "--input-type=module", "-e", PAGE_LINKS, url], cwd=ROOT / "tests" / "web",
                       capture_output=True, text=True, timeout=60, env={**os.environ, "CHROMIUM": chromium()})
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def test_the_encoder_each_stream_uses_is_on_its_card(tmp_path):
    """`encoder = "software"` runs both streams on OpenH264 and their cards say so (this machine
    has no M2M H.264 encoder, so "auto" is the same: the recall test above checks it); the status
    page, in headless Chromium, links the camera's card to its proxy's and back."""
    d = Rigd(tmp_path, f"""
[rig]
id = "{unique('enc')}"

[[source]]
id = "cam"
kind = "synthetic-camera"
codec = "h264"
width = 320
height = 180
gop = 10
encoder = "software"
proxy = {{ width = 160, height = 90, bitrate = "100kbit" }}

[spool]
path = "spool"

[web]
bind = "127.0.0.1:{{WEB_PORT}}"
""")
    try:
        d.start()
        s = d.wait_for(lambda s: all(c["detail"] for c in s["sources"]), timeout=20, what="both cards' detail")
        cards = {c["id"]: c for c in s["sources"]}
        assert cards["cam"]["detail"] == "320x180, encoder software (OpenH264)", cards["cam"]
        assert cards["cam-proxy"]["detail"] == "160x90, encoder software (OpenH264)", cards["cam-proxy"]
        # The status page, in headless Chromium: each card links the other (and says so).
        links = page_links(d.url(""))
        assert links == {"cam": ["live proxy: cam-proxy", "#source-cam-proxy"],
                         "cam-proxy": ["proxy of cam (full resolution: recall)", "#source-cam"]}, links
        assert d.stop() == 0
    finally:
        d.close()


def test_check_refuses_an_encoder_that_is_not_an_m2m_h264_encoder(tmp_path):
    """`encoder` is "auto", "software" or an M2M H.264 encoder's node; anything else is refused
    by `rigd check` (exit 2) naming the key and saying what the node is instead."""
    base = ('[rig]\nid = "a"\n[[source]]\nid = "cam"\nkind = "synthetic-camera"\nwidth = 640\nheight = 360\n'
            'codec = "h264"\nproxy = { width = 320, height = 180 }\n')
    p = tmp_path / "e.toml"
    for value, says in [
        ("auto", None),
        ("software", None),
        ("/dev/null", 'source[0].encoder: "/dev/null" is not a V4L2 memory-to-memory H.264 encoder '
                      '(/dev/null: not a V4L2 device)'),
        ("/dev/video-missing", 'source[0].encoder: "/dev/video-missing" is not a V4L2 memory-to-memory H.264 '
                               'encoder (/dev/video-missing: No such file or directory'),
        ("hardware", 'source[0].encoder: encoder `hardware`: must be "auto", "software" or a device path'),
    ]:
        p.write_text(base + f'encoder = "{value}"\n')
        r = subprocess.run([rigd_bin(), "check", "--config", str(p)], capture_output=True, text=True)
        if says is None:
            assert r.returncode == 0, (value, r.stdout, r.stderr)
        else:
            assert r.returncode == 2 and says in r.stdout + r.stderr, (value, r.stdout, r.stderr)
    # On a JPEG camera there is nothing to choose.
    p.write_text(base.replace('codec = "h264"\n', "").replace("proxy = { width = 320, height = 180 }\n", "")
                 + 'encoder = "software"\n')
    r = subprocess.run([rigd_bin(), "check", "--config", str(p)], capture_output=True, text=True)
    assert r.returncode == 2 and "source[0].encoder: chooses the H.264 encoder" in r.stdout + r.stderr, r.stderr
    # `rigd run` refuses it as well, before capturing anything.
    p.write_text(base + 'encoder = "/dev/null"\n')
    r = subprocess.run([rigd_bin(), "run", "--config", str(p)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and 'source[0].encoder: "/dev/null"' in r.stdout + r.stderr, (r.returncode, r.stderr)
