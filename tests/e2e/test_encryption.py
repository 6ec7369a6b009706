"""End-to-end encryption and device identity (issue 19), judged by the official Python client.

rigd encrypts in Pulsar's own format: the Python client (the C++ library underneath) with a
CryptoKeyReader holding the fleet's private key decrypts; without it, it gets nothing readable.
The spool holds only ciphertext, and its sealed frames republish as they are. Mutual TLS: a broker
that requires client certificates (TLS authentication provider) takes rigd's and refuses others."""

import datetime
import re
import subprocess
import time
from pathlib import Path

import pulsar

from harness import (Rigd, TlsBroker, admin, check_synthetic_jpeg, consume, namespace_with_dedup, nmea_valid,
                     rigd_bin, unique)

CAM_BYTES = 12 * 1024 * 1024

SOURCES = f"""
[[source]]
id = "cam"
kind = "synthetic-camera"
width = 320
height = 240
fps = 1
frame-bytes = {CAM_BYTES}

[[source]]
id = "mic"
kind = "synthetic-audio"
channels = 1

[[source]]
id = "gps"
kind = "synthetic-serial"
rate-hz = 200
"""


def fleet_key(tmp_path: Path) -> tuple[Path, Path]:
    """An RSA fleet key pair as an operator makes one: private key (PKCS#1) and its public key."""
    priv, pub = tmp_path / "fleet.key.pem", tmp_path / "fleet.pem"
    subprocess.run(["openssl", "genrsa", "-traditional", "-out", str(priv), "2048"], check=True,
                   capture_output=True)
    subprocess.run(["openssl", "rsa", "-in", str(priv), "-pubout", "-out", str(pub)], check=True,
                   capture_output=True)
    return pub, priv


def config(rig, pub, url=None, ns="public/default", spool="spool", extra=""):
    pulsar_cfg = f'url = "{url}"\ntopic = "persistent://{ns}/{{rig}}-{{source}}"\n' if url else ""
    return f"""
[rig]
id = "{rig}"
{SOURCES}
[pulsar]
{pulsar_cfg}compression = "lz4"
batch-delay-ms = 40
encryption-key-file = "{pub}"
encryption-key-name = "fleet-2026"
{extra}
[spool]
path = "{spool}"
max-bytes = "512MiB"

[web]
bind = "127.0.0.1:{{WEB_PORT}}"
"""


def seqs(msgs):
    return sorted(int(m["properties"]["seq"]) for m in msgs)


def check_decrypted(url, ns, rig, reader, min_frames):
    """Every source's frames, decrypted by the official consumer, exactly once and intact."""
    out = {}
    for src in ("cam", "mic", "gps"):
        msgs = consume(url, [f"persistent://{ns}/{rig}-{src}"], idle_timeout_s=8, crypto_key_reader=reader)
        s = seqs(msgs)
        assert s == list(range(len(s))), f"{src}: gaps or duplicates {s[:20]}"
        assert len(s) >= min_frames[src], (src, len(s))
        for m in msgs:
            if src == "cam":
                assert m["payload_len"] == CAM_BYTES
                check_synthetic_jpeg(m["payload"])
            elif src == "mic":
                assert m["payload_len"] == int(m["properties"]["frames"]) * 2
            else:
                assert nmea_valid(m["payload"].decode()), m["payload"][:80]
        out[src] = msgs
    return out


def test_the_official_consumer_with_the_private_key_decrypts_every_frame(broker, tmp_path):
    """Chunked 12 MiB camera frames, audio blocks and batched serial lines, compressed then
    encrypted; a consumer without the key gets nothing, or only ciphertext when told to consume it."""
    pub, priv = fleet_key(tmp_path)
    ns = namespace_with_dedup(unique("enc"))
    rig = unique("enc")
    d = Rigd(tmp_path, config(rig, pub, broker, ns)).start()
    try:
        d.wait_for(lambda s: all(x["published"] >= 4 for x in s["sources"]), timeout=90, what="published")
        assert d.stop() == 0
    finally:
        d.close()
    reader = pulsar.CryptoKeyReader(str(pub), str(priv))
    got = check_decrypted(broker, ns, rig, reader, {"cam": 4, "mic": 50, "gps": 100})
    # Serial lines went out in batches (one broker entry holds several), encrypted as a whole, and
    # each decrypted above (about three lines per 33 ms bucket at 100 Hz; fewer when a loaded
    # machine spools some, as frames sealed in the spool go one per entry: 1.9 per entry measured
    # beside the other CI lanes, 1.05 in a slower fresh-clone run). At least one entry of several.
    stats = admin("GET", f"/admin/v2/persistent/{ns}/{rig}-gps/internalStats")
    print(f"gps: {len(got['gps'])} lines in {stats['numberOfEntries']} entries")
    assert stats["numberOfEntries"] < len(got["gps"]), (stats["numberOfEntries"], len(got["gps"]))
    # Without the key: the default (fail) delivers nothing; `consume` hands over the ciphertext.
    none = consume(broker, [f"persistent://{ns}/{rig}-gps"], idle_timeout_s=4)
    assert none == [], f"{len(none)} messages delivered to a consumer without the key"
    raw = consume(broker, [f"persistent://{ns}/{rig}-gps"], idle_timeout_s=5,
                  crypto_failure_action=pulsar.ConsumerCryptoFailureAction.CONSUME)
    assert raw, "the undecryptable messages are there"
    assert not any(b"$GP" in m["payload"] for m in raw)


def test_the_spool_holds_only_ciphertext_and_republishes_it_as_it_is(broker, tmp_path):
    """Spooled with no broker: no NMEA sentence anywhere in the spool's files; stat and verify work
    without the key, export needs it; then the next start publishes the sealed frames as they
    are and the official consumer decrypts every one of them."""
    pub, priv = fleet_key(tmp_path)
    rig = unique("sealed")
    d = Rigd(tmp_path, config(rig, pub, spool="spool"), name="offline").start()
    try:
        d.wait_for(lambda s: all(x["frames"] >= 4 for x in s["sources"]), timeout=60, what="spooled")
        assert d.stop() == 0
    finally:
        d.close()
    spool = tmp_path / "spool"
    run = lambda *a: subprocess.run([rigd_bin(), *map(str, a)], capture_output=True, text=True, timeout=120)
    v = run("spool", "verify", "--spool", spool)
    assert v.returncode == 0, v.stdout + v.stderr
    out = tmp_path / "export"
    e = run("replay", "--spool", spool, "--out", out)
    assert e.returncode == 2 and "--decrypt-key" in e.stderr, e.stderr
    e = run("replay", "--spool", spool, "--out", out, "--decrypt-key", priv)
    assert e.returncode == 0, e.stderr
    exported = b"".join(p.read_bytes() for p in out.rglob("*") if p.is_file() and "gps" in str(p))
    sentences = set(re.findall(rb"\$GP[A-Z]{3},[^\"\\]{20,}", exported))
    assert len(sentences) >= 100, exported[:300]
    # The plaintext the export recovered is nowhere in the spool's files (segments, index, the
    # rest): not one of its sentences.
    files = [p for p in spool.rglob("*") if p.is_file()]
    assert files
    for p in files:
        data = p.read_bytes()
        found = [x for x in sentences if x in data]
        assert not found, f"{found[:3]} in {p.relative_to(tmp_path)}"
    ns = namespace_with_dedup(unique("sealed"))
    d = Rigd(tmp_path, config(rig, pub, broker, ns, spool="spool"), name="online").start()
    try:
        d.wait_for(lambda s: s["spool"]["records"] == 0, timeout=120, what="the spool drained")
        assert d.stop() == 0
    finally:
        d.close()
    check_decrypted(broker, ns, rig, pulsar.CryptoKeyReader(str(pub), str(priv)),
                    {"cam": 4, "mic": 50, "gps": 100})


def test_a_namespace_that_requires_encryption_takes_rigds_producers_and_names_the_policy_in_clear(broker, tmp_path):
    """Issue 31.8: the producer says it encrypts (CommandProducer.encrypted), so a namespace whose
    policy requires encryption takes it and every frame arrives, decrypted by the official client;
    a rig publishing in clear there is refused, and its status names the policy, not an outage."""
    pub, priv = fleet_key(tmp_path)
    ns = namespace_with_dedup(unique("encreq"))
    admin("POST", f"/admin/v2/namespaces/{ns}/encryptionRequired", True)
    rig = unique("encreq")
    d = Rigd(tmp_path, config(rig, pub, broker, ns), name="encrypting").start()
    try:
        d.wait_for(lambda s: all(x["published"] >= 4 for x in s["sources"]), timeout=90, what="published")
        assert d.stop() == 0
    finally:
        d.close()
    check_decrypted(broker, ns, rig, pulsar.CryptoKeyReader(str(pub), str(priv)),
                    {"cam": 4, "mic": 50, "gps": 100})
    clear = config(unique("clear"), pub, broker, ns, spool="clear-spool")
    clear = "\n".join(x for x in clear.splitlines() if not x.startswith("encryption-key-"))
    d = Rigd(tmp_path, clear, name="clear").start()
    try:
        s = d.wait_for(lambda s: s["uplink"].get("policy"), timeout=60, what="the policy refusal in status")
        assert "encryption-key-file" in s["uplink"]["policy"], s["uplink"]
        assert not s["uplink"]["connected"] and all(x["published"] == 0 for x in s["sources"])
        texts = [a["text"] for a in s["alerts"]]
        assert any("namespace policy" in t and "encryption" in t for t in texts), texts
        assert d.stop() == 0
    finally:
        d.close()


def _cert(tls: Path, name: str, *, days_valid=(-1, 365), ca=("ca.pem", "ca.key.pem")):
    """A client certificate signed by `ca`, valid from/to the given days relative to now."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    ca_cert = x509.load_pem_x509_certificate((tls / ca[0]).read_bytes())
    ca_key = serialization.load_pem_private_key((tls / ca[1]).read_bytes(), None)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now + datetime.timedelta(days=days_valid[0]))
            .not_valid_after(now + datetime.timedelta(days=days_valid[1]))
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    (tls / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tls / f"{name}.key.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))


def _self_signed_ca(dir: Path):
    dir.mkdir()
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(dir / "ca.key.pem"),
                    "-out", str(dir / "ca.pem"), "-days", "30", "-subj", "/CN=not-the-fleet-ca"],
                   check=True, capture_output=True)


def test_mutual_tls_the_broker_takes_the_rigs_certificate_and_refuses_others(tmp_path):
    """A broker whose TLS port requires a client certificate from the fleet CA (and maps it to a
    role with the TLS authentication provider): rigd with its certificate and no token
    publishes; a certificate from another CA is refused; an expired one is refused and said so
    on the status page and in the alerts, while capture goes on into the spool."""
    b = TlsBroker(tmp_path, PULSAR_TLS_CLIENT_AUTH="1")
    tls, run, url = b.tls, b.run, b.url
    _cert(tls, "expired", days_valid=(-30, -1))
    _self_signed_ca(tmp_path / "other")
    _cert(tls, "stranger", ca=("../other/ca.pem", "../other/ca.key.pem"))
    run("start")
    try:
        rig = unique("mtls")

        def cfg(name):
            return b.rig_config(rig, f"spool-{name}", 20, f'tls-cert-file = "{tls / (name + ".pem")}"\n'
                                f'tls-key-file = "{tls / (name + ".key.pem")}"')

        for name in ("stranger", "expired"):
            d = Rigd(tmp_path, cfg(name), name=name).start()
            try:
                s = d.wait_for(lambda s: s["uplink"]["last_error"], timeout=60, what="a refused handshake")
                assert not s["uplink"]["connected"]
                time.sleep(3)
                s = d.status()
                assert not s["uplink"]["connected"] and s["uplink"]["published"] == 0
                assert s["sources"][0]["frames"] > 20, "capture goes on, into the spool"
                alerts = " ".join(a["text"] for a in s["alerts"])
                # The credentials alert itself, not the unreachable one that quotes the TLS error.
                assert "refuses the rig's credentials" in alerts, alerts
                assert s["uplink"]["credentials"], s["uplink"]
                if name == "expired":
                    assert "expired" in (s["uplink"]["credentials"] or ""), s["uplink"]
                assert d.stop() == 0
            finally:
                d.close()
        # `always` mode and kill -9 twice: each start finds frames the broker acknowledged still in
        # the spool, and this broker keeps no deduplication state (off), so the probe reads the
        # topic's last entry, over mutual TLS with the rig's certificate (issue 31.4: it had
        # none, never connected, and every such frame arrived twice).
        always = cfg("client").replace('path = "spool-client"', 'path = "spool-client"\nmode = "always"')
        good = Rigd(tmp_path, always, name="client")
        try:
            for secs in (1.3, 2.1, None):
                good.start()
                s = good.wait_for(lambda s: s["uplink"]["connected"] and s["uplink"]["published"] > 40,
                                  timeout=60, what="publishing with the client certificate")
                assert s["uplink"]["credentials"] is None
                if secs is None:
                    assert good.stop() == 0
                else:
                    time.sleep(secs)
                    good.kill9()
            log = good.log()
            assert log.count("the topic's last message decides") == 2, log[-4000:]
            assert "cannot read the topic's last message" not in log, log[-4000:]
        finally:
            good.close()
        token = run("token", "admin")
        msgs = consume(url, [f"persistent://public/default/{rig}-gps"], idle_timeout_s=5, token=token,
                       tls_trust_certs_file_path=str(tls / "ca.pem"),
                       tls_certificate_file_path=str(tls / "client.pem"),
                       tls_private_key_file_path=str(tls / "client.key.pem"),
                       consumer_type=pulsar.ConsumerType.Exclusive)
        s = seqs(msgs)
        assert len(s) > 40 and s == list(range(len(s)))
    finally:
        b.stop()
