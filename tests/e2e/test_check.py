"""`rigd check` as an operator meets it (issue 47): the real binary on a config file, its exit code
and the line naming the key. The cases exited 0 before (or said something no one could act on);
every problem and every warning now comes in one run. Needs no broker: the Pulsar URLs here are
never contacted (`check` does not connect), and every web bind is port 0."""

import datetime
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from harness import Rigd, rigd_bin

RIG = '[rig]\nid = "chk"\n'
GPS = '[[source]]\nid = "gps"\nkind = "synthetic-serial"\n'
CAM = '[[source]]\nid = "cam"\nkind = "synthetic-camera"\n'
GOOD_TOKEN = "0123456789abcdef0123"


def check(tmp_path: Path, text: str, name: str = "rigd.toml"):
    """Runs `rigd check` on `text` (with a spool in tmp_path and web port 0 unless it has its own
    [spool] / [web]); returns (config path, exit code, stderr lines)."""
    if "[spool]" not in text:
        text += f'[spool]\npath = "{tmp_path}/spool"\n'
    if "[web]" not in text:
        text += '[web]\nbind = "127.0.0.1:0"\n'
    cfg = tmp_path / name
    cfg.write_text(text)
    r = subprocess.run([rigd_bin(), "check", "--config", str(cfg)], capture_output=True, text=True, timeout=30)
    return cfg, r.returncode, r.stderr.strip().splitlines()


def line_of(cfg: Path, needle: str) -> int:
    """The line (from 1) of the config that contains `needle`."""
    for n, line in enumerate(cfg.read_text().splitlines(), 1):
        if needle in line:
            return n
    raise AssertionError(f"{needle!r} not in {cfg}")


def problems(lines):
    return [l for l in lines if ": warning: " not in l]


def warnings(lines):
    return [l for l in lines if ": warning: " in l]


def assert_says(lines, prefix: str, *words: str):
    hit = [l for l in lines if l.startswith(prefix)]
    assert hit, f"no line starts with {prefix!r}:\n" + "\n".join(lines)
    for w in words:
        assert w in hit[0], f"{w!r} not in {hit[0]!r}"
    return hit[0]


# --- keys and certificates, made here (cryptography, as a fleet's PKI would with openssl) -------

def key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def self_signed(d: Path, name: str, days_from: float = -1, days_to: float = 30) -> tuple[Path, Path]:
    """A self-signed v3 certificate valid from now + days_from to now + days_to, and its key."""
    d.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    who = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(who).issuer_name(who).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now + datetime.timedelta(days=days_from))
            .not_valid_after(now + datetime.timedelta(days=days_to))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .sign(key, hashes.SHA256()))
    (d / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (d / f"{name}.key.pem").write_bytes(key_pem(key))
    (d / f"{name}.key.pem").chmod(0o600)
    return d / f"{name}.pem", d / f"{name}.key.pem"


def v1_cert(d: Path) -> tuple[Path, Path]:
    """An X.509 version 1 certificate (`openssl x509 -req` without extensions makes one)."""
    d.mkdir(parents=True, exist_ok=True)
    run = lambda *a: subprocess.run(["openssl", *a], cwd=d, check=True, capture_output=True)
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "v1.key.pem",
        "-out", "v1.csr", "-subj", "/CN=rig")
    run("x509", "-req", "-in", "v1.csr", "-signkey", "v1.key.pem", "-out", "v1.pem", "-days", "30")
    assert "Version: 1 (0x0)" in subprocess.run(["openssl", "x509", "-in", d / "v1.pem", "-noout", "-text"],
                                                capture_output=True, text=True, check=True).stdout
    (d / "v1.key.pem").chmod(0o600)
    return d / "v1.pem", d / "v1.key.pem"


def rsa_files(d: Path, bits: int) -> tuple[Path, Path]:
    """An RSA key pair: (public key PEM, private key PEM)."""
    d.mkdir(parents=True, exist_ok=True)
    key = rsa.generate_private_key(public_exponent=65537, key_size=bits)
    pub = d / f"rsa{bits}.pub.pem"
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    priv = d / f"rsa{bits}.key.pem"
    priv.write_bytes(key_pem(key))
    priv.chmod(0o600)
    return pub, priv


def secret(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text + "\n")
    path.chmod(mode)
    return path


# --- what exited 0 before and must not -----------------------------------------------------------

ERRORS = {
    # name: (config text, key the line starts with, words it says)
    "allow-from empty": (RIG + GPS + '[web]\nbind = "127.0.0.1:0"\nallow-from = []\n', "web.allow-from",
                         ["empty list refuses every client"]),
    "pulsar port 0": (RIG + GPS + '[pulsar]\nurl = "pulsar://broker.invalid:0"\n', "pulsar.url",
                      ["port 0", "6650"]),
    "pulsar port 0 in a cluster": (RIG + GPS + '[pulsar]\nurl = "pulsar+ssl://a.invalid:6651,b.invalid:0"\n',
                                   "pulsar.url", ["`b.invalid` has port 0", "6651"]),
    "fps 1e-9": (RIG + CAM + "fps = 1e-9\n", "source[0].fps", ["0.01 to 1000"]),
    "fps above 1000": (RIG + CAM + "fps = 100000\n", "source[0].fps", ["0.01 to 1000"]),
    "v4l fps 1e-9": (RIG + '[[source]]\nid = "v"\nkind = "v4l"\ndevice = "/dev/video-not-here"\nfps = 1e-9\n',
                     "source[0].fps", ["0.01 to 1000"]),
    "rate-hz 1e-9": (RIG + GPS + "rate-hz = 1e-9\n", "source[0].rate-hz", ["0.01 to 10000"]),
    "tone above nyquist": (RIG + '[[source]]\nid = "m"\nkind = "synthetic-audio"\nsample-rate = 8000\ntone-hz = 5000\n',
                           "source[0].tone-hz", ["1 to 4000"]),
    "serial device /dev/null": (RIG + '[[source]]\nid = "g"\nkind = "serial"\ndevice = "/dev/null"\n',
                                "source[0].device", ["/dev/null is a character device of class `mem`", "terminal"]),
    "serial device a regular file": (RIG + '[[source]]\nid = "g"\nkind = "serial"\ndevice = "{tmp}/gps.log"\n',
                                     "source[0].device", ["is a regular file"]),
    "serial device a directory": (RIG + '[[source]]\nid = "g"\nkind = "serial"\ndevice = "/dev"\n',
                                  "source[0].device", ["is a directory"]),
    # Messages a user could not act on (issue 47, "Messages").
    "priority -1": (RIG + CAM + "priority = -1\n", "source[0].priority", ["from 0 (first) to 9"]),
    "priority a word": (RIG + CAM + 'priority = "high"\n', "source[0].priority", ["from 0 (first) to 9"]),
    "clock domain 300": (RIG + GPS + "[clock]\ndomain = 300\n", "clock.domain", ["from 0 to 255"]),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_check_refuses_what_it_passed_naming_the_key(case, tmp_path):
    text, key, words = ERRORS[case]
    (tmp_path / "gps.log").write_text("$GPRMC\n")
    cfg, code, lines = check(tmp_path, text.replace("{tmp}", str(tmp_path)))
    assert code == 2, (case, lines)
    errs = problems(lines)
    assert len(errs) == 1, errs
    written = key.split(".")[-1].split("[")[0]
    at = line_of(cfg, f"{written} =") if key != "pulsar.url" else line_of(cfg, "url =")
    line = assert_says(errs, f"{cfg}:{at}: {key}: ", *words)
    assert "u8" not in line and "Some(" not in line, line


def test_no_source_at_all_is_refused(tmp_path):
    cfg, code, lines = check(tmp_path, RIG)
    assert code == 2, lines
    assert_says(problems(lines), f"{cfg}: source: no [[source]] table", "captures nothing")


def test_an_integer_id_is_one_problem_not_also_a_missing_field(tmp_path):
    cfg, code, lines = check(tmp_path, RIG + '[[source]]\nid = 7\nkind = "synthetic-serial"\n')
    assert code == 2, lines
    assert problems(lines) == [l for l in lines if l.startswith(f"{cfg}:4: source[0].id: invalid type: integer `7`")], lines
    assert not any("missing field" in l for l in lines), lines


# --- warnings: `run` starts on these, `check` says what an operator should know ------------------

@pytest.mark.parametrize("open_net", ["0.0.0.0/0", "::/0"])
def test_an_open_network_among_narrow_ones_is_a_warning(open_net, tmp_path):
    cfg, code, lines = check(tmp_path, RIG + GPS + f'[web]\nbind = "127.0.0.1:0"\n'
                                                  f'allow-from = ["192.168.7.0/24", "{open_net}"]\n')
    assert code == 0, lines
    assert_says(warnings(lines), f"{cfg}:8: warning: web.allow-from: {open_net} admits every address",
                "open to everyone", "192.168.7.0/24 restrict nothing")
    # Alone they are a choice (documented as "answers everyone"), not a slip.
    cfg, code, lines = check(tmp_path, RIG + GPS + '[web]\nbind = "127.0.0.1:0"\nallow-from = ["0.0.0.0/0", "::/0"]\n')
    assert code == 0 and not [l for l in lines if "allow-from" in l], lines


def test_on_request_without_a_broker_is_a_warning_in_check_and_in_the_log_of_run(tmp_path):
    text = RIG + GPS + 'upload = "on-request"\n'
    cfg, code, lines = check(tmp_path, text)
    assert code == 0, lines
    assert_says(warnings(lines), f"{cfg}:6: warning: source[0].upload: \"on-request\" without [pulsar] url",
                "no recall can ever reach this rig")
    # `run` starts, and says it in its log (nothing was said at run time before).
    d = Rigd(tmp_path / "run", text + '[spool]\npath = "spool"\n[web]\nbind = "127.0.0.1:{WEB_PORT}"\n').start()
    try:
        assert "config: source[0].upload: \"on-request\" without [pulsar] url" in d.log(), d.log()[-2000:]
        assert d.stop() == 0
    finally:
        d.close()


def test_a_clock_interface_that_does_not_exist_is_a_warning(tmp_path):
    cfg, code, lines = check(tmp_path, RIG + GPS + '[clock]\ninterface = "rigdnoif0"\n')
    assert code == 0, lines
    assert_says(warnings(lines), f"{cfg}:7: warning: clock.interface: no network interface `rigdnoif0`")
    cfg, code, lines = check(tmp_path, RIG + GPS + '[clock]\ninterface = "lo"\n')
    assert code == 0 and not warnings(lines), lines


@pytest.mark.skipif(not os.path.isdir("/dev/shm") or
                    subprocess.run(["stat", "-f", "-c", "%T", "/dev/shm"], capture_output=True,
                                   text=True).stdout.strip() != "tmpfs",
                    reason="/dev/shm is not a tmpfs here")
@pytest.mark.parametrize("mode", ["on-outage", "always"])
def test_a_spool_on_tmpfs_is_a_warning(mode, tmp_path):
    spool = f"/dev/shm/rigd-check-{os.getpid()}-{mode}/spool"
    cfg, code, lines = check(tmp_path, RIG + GPS + f'[spool]\npath = "{spool}"\nmode = "{mode}"\n')
    assert code == 0, lines
    line = assert_says(warnings(lines), f"{cfg}:7: warning: spool.path: {spool} is on tmpfs",
                       "a power cut or reboot loses every spooled frame")
    assert ("always" in line) == (mode == "always"), line
    assert not Path(spool).exists()


# --- certificates and keys -----------------------------------------------------------------------

def pulsar_tls(cert: Path, key: Path, ca: Path | None = None) -> str:
    ca_line = f'tls-ca-file = "{ca}"\n' if ca else ""
    return (f'[pulsar]\nurl = "pulsar+ssl://broker.invalid:6651"\n{ca_line}'
            f'tls-cert-file = "{cert}"\ntls-key-file = "{key}"\n')


def web_tls(cert: Path, key: Path) -> str:
    return f'[web]\nbind = "127.0.0.1:0"\ntls-cert-file = "{cert}"\ntls-key-file = "{key}"\n'


def test_certificate_dates_are_warnings_naming_the_key(tmp_path):
    expired, expired_key = self_signed(tmp_path / "pki", "expired", days_from=-30, days_to=-1)
    future, future_key = self_signed(tmp_path / "pki", "future", days_from=2, days_to=30)
    cfg, code, lines = check(tmp_path, RIG + GPS + pulsar_tls(expired, expired_key, ca=expired)
                             + web_tls(future, future_key))
    assert code == 0, lines
    w = warnings(lines)
    at_client, at_web = line_of(cfg, f'tls-cert-file = "{expired}"'), line_of(cfg, f'tls-cert-file = "{future}"')
    assert_says(w, f"{cfg}:{at_client}: warning: pulsar.tls-cert-file: {expired}: the client certificate expired at",
                "the broker refuses it")
    assert_says(w, f"{cfg}:{at_web}: warning: web.tls-cert-file: {future}: the web certificate is valid only from",
                "clock")


def test_a_client_certificate_and_a_key_that_do_not_match_name_both_not_the_ca(tmp_path):
    rig, _ = self_signed(tmp_path / "pki", "rig")
    _, other_key = self_signed(tmp_path / "pki", "other")
    cfg, code, lines = check(tmp_path, RIG + GPS + pulsar_tls(rig, other_key, ca=rig))
    assert code == 2, lines
    line = assert_says(problems(lines), f"{cfg}:{line_of(cfg, 'tls-cert-file')}: pulsar.tls-cert-file / pulsar.tls-key-file: ",
                       "do not match")
    assert not any("tls-ca-file" in l for l in lines), lines
    # The web server's pair the same way.
    cfg, code, lines = check(tmp_path, RIG + GPS + web_tls(rig, other_key))
    assert code == 2, lines
    assert_says(problems(lines), f"{cfg}:{line_of(cfg, 'tls-cert-file')}: web.tls-cert-file / web.tls-key-file: ",
                "do not match")


def test_an_x509_v1_certificate_is_said_in_words(tmp_path):
    cert, key = v1_cert(tmp_path / "pki")
    for text, k in ((pulsar_tls(cert, key), "pulsar"), (web_tls(cert, key), "web")):
        cfg, code, lines = check(tmp_path, RIG + GPS + text)
        assert code == 2, lines
        line = assert_says(problems(lines), f"{cfg}:{line_of(cfg, 'tls-cert-file')}: {k}.tls-cert-file: {cert}: ",
                           "X.509 version 1 certificate", "version 3")
        assert not re.search(r"\w+\(\w+", line), f"Rust debug output: {line}"


def test_encryption_keys_a_private_key_and_a_short_one_are_refused(tmp_path):
    pub1024, priv1024 = rsa_files(tmp_path / "keys", 1024)
    pub2048, priv2048 = rsa_files(tmp_path / "keys", 2048)
    enc = '[pulsar]\nencryption-key-file = "{}"\nencryption-key-name = "fleet"\n'
    cfg, code, lines = check(tmp_path, RIG + GPS + enc.format(priv2048))
    assert code == 2, lines
    line = assert_says(problems(lines), f"{cfg}:7: pulsar.encryption-key-file: {priv2048}: this is a private key: "
                                        "it must not be on a rig", "give the fleet's public key")
    assert "expecting" not in line, line
    cfg, code, lines = check(tmp_path, RIG + GPS + enc.format(pub1024))
    assert code == 2, lines
    assert_says(problems(lines), f"{cfg}:7: pulsar.encryption-key-file: {pub1024}: a 1024-bit RSA key", "at least 2048")
    cfg, code, lines = check(tmp_path, RIG + GPS + enc.format(pub2048))
    assert code == 0 and not lines, lines


# --- weak secrets (issue 47 item 4) ---------------------------------------------------------------

def test_short_tokens_are_refused_and_readable_secrets_are_warned_of(tmp_path):
    short = secret(tmp_path / "short.token", "hunter2")
    cfg, code, lines = check(tmp_path, RIG + GPS + f'[pulsar]\nurl = "pulsar://broker.invalid:6650"\ntoken-file = "{short}"\n'
                                                  f'[web]\nbind = "127.0.0.1:0"\ntoken-file = "{short}"\n')
    assert code == 2, lines
    errs = problems(lines)
    assert_says(errs, f"{cfg}:8: pulsar.token-file: {short} holds a token of 7 characters", "at least 16")
    assert_says(errs, f"{cfg}:11: web.token-file: {short} holds a token of 7 characters", "at least 16")
    # `run` refuses it too, before anything starts (exit 2: the file must be replaced).
    r = subprocess.run([rigd_bin(), "run", "--config", str(cfg)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "web.token-file" in r.stderr, r.stderr

    token = secret(tmp_path / "web.token", GOOD_TOKEN, 0o644)
    _, key = self_signed(tmp_path / "pki", "web")
    key.chmod(0o604)
    cert = tmp_path / "pki" / "web.pem"
    cfg, code, lines = check(tmp_path, RIG + GPS + f'[web]\nbind = "127.0.0.1:0"\ntoken-file = "{token}"\n'
                                                  f'tls-cert-file = "{cert}"\ntls-key-file = "{key}"\n')
    assert code == 0, lines
    w = warnings(lines)
    assert_says(w, f"{cfg}:8: warning: web.token-file: {token} is readable by every user (mode 0644)", "chmod 0600")
    assert_says(w, f"{cfg}:10: warning: web.tls-key-file: {key} is readable by every user (mode 0604)")
    token.chmod(0o600)
    key.chmod(0o600)
    cfg, code, lines = check(tmp_path, cfg.read_text())
    assert code == 0 and not warnings(lines), lines


# --- every problem in one run ---------------------------------------------------------------------

def test_every_problem_and_every_warning_in_one_run(tmp_path):
    """Before, a table that did not parse hid every other table's problems and every source's, and
    warnings waited for a clean config: an operator fixed one line per run."""
    text = (RIG
            + CAM + 'width = "wide"\n'                                 # 6: a wrong type in a source
            + '[[source]]\nid = "c2"\nkind = "synthetic-camera"\nfps = 1e-9\nupload = "on-request"\n'  # 10, 11
            + '[[source]]\nid = "g"\nkind = "serial"\ndevice = "/dev/ttyRIGD-NOT-HERE"\n'  # 15: a warning
            + f'[spool]\npath = "{tmp_path}/spool"\nfsync-ms = "often"\n'  # 18: a wrong type in a table
            + '[pulsar]\nmax-in-flight = 0\n'                         # 20: a value in another
            + '[clock]\ninterface = "rigdnoif0"\n')                   # 22: a warning
    cfg, code, lines = check(tmp_path, text)
    assert code == 2, lines
    errs, warns = problems(lines), warnings(lines)
    for prefix in (f"{cfg}:6: source[0].width: invalid type", f"{cfg}:10: source[1].fps: ",
                   f"{cfg}:18: spool.fsync-ms: invalid type", f"{cfg}:20: pulsar.max-in-flight: "):
        assert_says(errs, prefix)
    assert len(errs) == 4, errs
    for prefix in (f"{cfg}:11: warning: source[1].upload: ", f"{cfg}:15: warning: source[2].device: ",
                   f"{cfg}:22: warning: clock.interface: "):
        assert_says(warns, prefix)
    # `run` refuses with the same problems, before anything starts.
    r = subprocess.run([rigd_bin(), "run", "--config", str(cfg)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == errs
    assert not (tmp_path / "spool").exists()
