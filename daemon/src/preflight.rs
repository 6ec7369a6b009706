//! What the host must offer a valid config before capture starts: the files it names exist and
//! say something, the spool's path can be a directory on a filesystem larger than its reserve, the
//! web port is free. `rigd check` reports these with the config's own problems; `rigd run` refuses
//! to start on any of them, before it opens the spool or starts a source: with exit 75 when the
//! host may offer it later (a token file not yet provisioned, a spool disk not yet mounted, a port
//! still held: systemd tries again), with exit 2 when no host can (a spool path on `/proc`, or that
//! is a file or runs through one: the config must change), see [`HostProblem`].
//!
//! Each problem is `key: what is wrong`, like [`Config::problems`], so that
//! [`Config::check`] names the file and the line of the key.

use std::path::{Path, PathBuf};

use crate::config::{read_token, Config, HostProblem};
// `Fix`: the config must change (exit 2); `NotReady`: the host may offer it later (exit 75).
use HostProblem::{Config as Fix, NotReady};

/// Every problem of the host with `config` (none: the daemon can start).
pub fn problems(config: &Config) -> Vec<HostProblem> {
    host_problems(config, false)
}

/// [`problems`] for `rigd check`: the web port held by the running rigd of the config's own
/// spool is no problem there (see [`warnings`]).
pub fn check_problems(config: &Config) -> Vec<HostProblem> {
    host_problems(config, true)
}

pub use crate::config::MIN_TOKEN_CHARS;

fn host_problems(config: &Config, check: bool) -> Vec<HostProblem> {
    let mut p: Vec<HostProblem> = config.rig_problems().into_iter().map(Fix).collect();
    if let Some(path) = &config.pulsar.token_file {
        match read_token(path) {
            Err(e) => p.push(NotReady(format!("pulsar.token-file: {e}"))),
            Ok(t) => short_token(&mut p, "pulsar.token-file", path, &t),
        }
    }
    if let Some(path) = &config.web.token_file {
        // One that cannot be read is a warning (control actions stay disabled): [`warnings`].
        if let Ok(t) = read_token(path) {
            short_token(&mut p, "web.token-file", path, &t);
        }
    }
    pulsar_tls_problems(config, &mut p);
    let pulsar = &config.pulsar;
    if let (Some(file), Some(_)) = (&pulsar.encryption_key_file, &pulsar.encryption_key_name) {
        match crate::seal::load_public_key(file) {
            // Not there (yet): the host's; there and wrong (a private key, too short, not
            // RSA): the file must be replaced.
            Err(e) if std::fs::File::open(file).is_err() => {
                p.push(NotReady(format!("pulsar.encryption-key-file: {e}")))
            }
            Err(e) => p.push(Fix(format!("pulsar.encryption-key-file: {e}"))),
            Ok(_) => {
                if let Err(e) = crate::app::encryption(config) {
                    p.push(NotReady(e.to_string()));
                }
            }
        }
    }
    if let (Some(cert), Some(key)) = (&config.web.tls_cert_file, &config.web.tls_key_file) {
        match identity::pair_problem(cert, key) {
            Some((which, why)) => p.push(NotReady(format!(
                "{}: {why}",
                pair_keys(which, "web.tls-cert-file", "web.tls-key-file")
            ))),
            None => {
                if let Err(e) = crate::app::web_tls(config) {
                    p.push(NotReady(e.to_string()));
                }
            }
        }
    }
    serial_devices(config, &mut p);
    if config.was_read("spool") {
        spool_problems(config, &mut p);
    }
    if !config.was_read("web") {
        return p;
    }
    if let Some(e) = web_port_taken(config) {
        if !(check && spool_in_use(&config.spool.path)) {
            p.push(NotReady(e));
        }
    }
    p
}

use crate::uplink::identity::{self, PairFile};

/// The key a certificate/key problem is about (both when they do not match).
fn pair_keys(which: PairFile, cert: &str, key: &str) -> String {
    match which {
        PairFile::Cert => cert.to_string(),
        PairFile::Key => key.to_string(),
        PairFile::Both => format!("{cert} / {key}"),
    }
}

fn short_token(p: &mut Vec<HostProblem>, key: &str, path: &Path, token: &str) {
    let n = token.chars().count();
    if n < MIN_TOKEN_CHARS {
        p.push(Fix(format!(
            "{key}: {} holds a token of {n} characters: at least {MIN_TOKEN_CHARS} are needed (a short one is guessed); make one with `openssl rand -hex 24 > {}`",
            path.display(),
            path.display()
        )));
    }
}

/// `[pulsar]` TLS files: the CA, and the client certificate with its key, each problem named by
/// the key of the file it is about.
fn pulsar_tls_problems(config: &Config, p: &mut Vec<HostProblem>) {
    let client = crate::app::client_cert(config);
    let ca = config.pulsar.tls_ca_file.as_deref();
    // The certificates are read at start, whatever the URL says, so a file that is not
    // there fails here rather than when the URL is changed to pulsar+ssl:// later.
    let client = match client.map(|(c, k)| (c, k, identity::pair_problem(c, k))) {
        Some((_, _, Some((which, why)))) => {
            p.push(NotReady(format!(
                "{}: {why}",
                pair_keys(which, "pulsar.tls-cert-file", "pulsar.tls-key-file")
            )));
            None
        }
        Some((c, k, None)) => Some((c, k)),
        None => None,
    };
    if ca.is_none() && client.is_none() {
        return;
    }
    if let Err(e) = crate::uplink::tls_config(ca, client) {
        // The message starts with the file it is about.
        let named = |f: Option<&Path>| f.is_some_and(|f| e.starts_with(&*f.to_string_lossy()));
        let key = if named(ca) && !named(client.map(|c| c.0)) {
            "pulsar.tls-ca-file"
        } else {
            "pulsar.tls-cert-file"
        };
        p.push(NotReady(format!("{key}: {e}")));
    }
    // An expired certificate is not a reason to stop capturing: the status page and the
    // alerts say it (`identity::problem`) while frames go to the spool; `check` warns.
}

/// A serial source's device that exists and is not a terminal (a regular file, a directory,
/// `/dev/null`): no waiting makes it one, the config names the wrong file. One that does not
/// exist yet is a warning ([`warnings`]).
fn serial_devices(config: &Config, p: &mut Vec<HostProblem>) {
    for (i, s) in config.sources.iter().enumerate() {
        let crate::config::SourceKind::Serial(c) = &s.kind else {
            continue;
        };
        if c.device.contains('\0') {
            continue; // Config::problems says so
        }
        let Ok(m) = std::fs::metadata(&c.device) else {
            continue;
        };
        if let Some(why) = not_a_tty(&m) {
            p.push(Fix(format!(
                "{}.device: {} {why}: a serial source reads a terminal device (/dev/ttyUSB0, /dev/ttyACM0, /dev/serial/by-id/...)",
                config.source_key(i),
                c.device
            )));
        }
    }
}

/// Why a file with metadata `m` is not a terminal, if it is not: not a character device, or one
/// the kernel files under another class than `tty` (`/dev/null` is `mem`). Pseudo-terminals
/// (/dev/pts/*, majors 136-143) have no class directory and are terminals.
fn not_a_tty(m: &std::fs::Metadata) -> Option<String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let t = m.file_type();
    if !t.is_char_device() {
        let what = if t.is_dir() {
            "a directory"
        } else if t.is_file() {
            "a regular file"
        } else if t.is_block_device() {
            "a block device (a disk)"
        } else if t.is_fifo() {
            "a FIFO"
        } else if t.is_socket() {
            "a socket"
        } else {
            "not a device"
        };
        return Some(format!("is {what}"));
    }
    let (major, minor) = (rustix::fs::major(m.rdev()), rustix::fs::minor(m.rdev()));
    if (136..=143).contains(&major) {
        return None;
    }
    let class = std::fs::read_link(format!("/sys/dev/char/{major}:{minor}/subsystem")).ok()?;
    let class = class.file_name()?.to_string_lossy().to_string();
    (class != "tty").then(|| format!("is a character device of class `{class}`, not a terminal"))
}

/// What `rigd check` says beside the problems, without failing: what `run` copes with but an
/// operator should know before a restart. The web port held by the running rigd of this very
/// spool is one (the check of a live rig's edited config must pass, issue 32); the others are
/// a web token file that cannot be read (control actions disabled) and device paths that do not
/// exist (yet: a USB device may appear later).
pub fn warnings(config: &Config) -> Vec<String> {
    let mut w = Vec::new();
    // The LOCK probe first: the port is bound (a second time) only on a live rig.
    if config.was_read("web")
        && config.was_read("spool")
        && spool_in_use(&config.spool.path)
        && web_port_taken(config).is_some()
    {
        w.push(format!(
            "web.bind: {} is held by the running rigd of this spool (free again once it stops)",
            config.web_bind()
        ));
    }
    if let Some(path) = &config.web.token_file {
        if let Err(e) = read_token(path) {
            w.push(format!(
                "web.token-file: {e} (control actions stay disabled until it can be read)"
            ));
        }
    }
    for (i, s) in config.sources.iter().enumerate() {
        let Some(device) = s.device_file() else {
            continue;
        };
        if device.starts_with('/') && std::fs::metadata(device).is_err() {
            w.push(format!(
                "{}.device: {device} does not exist (yet: the source retries until it appears)",
                config.source_key(i)
            ));
        }
    }
    for (i, s) in config.sources.iter().enumerate() {
        let crate::config::SourceKind::Can(c) = &s.kind else {
            continue;
        };
        let net = Path::new("/sys/class/net");
        let name = &c.interface;
        if net.is_dir() && !name.contains(['/', '\0']) && !net.join(name).exists() {
            w.push(format!(
                "{}.interface: no network interface `{name}` on this host (yet: the source retries until it appears; `ip link` lists them)",
                config.source_key(i)
            ));
        }
    }
    if let Some(iface) = &config.clock.interface {
        let net = Path::new("/sys/class/net");
        if net.is_dir() && !iface.contains(['/', '\0']) && !net.join(iface).exists() {
            w.push(format!(
                "clock.interface: no network interface `{iface}` on this host (yet: PTP waits for it, the clock stays unsynced until then; `ip link` lists them)"
            ));
        }
    }
    for (key, file) in [
        ("pulsar.token-file", &config.pulsar.token_file),
        ("pulsar.tls-key-file", &config.pulsar.tls_key_file),
        ("web.token-file", &config.web.token_file),
        ("web.tls-key-file", &config.web.tls_key_file),
    ] {
        if let Some(why) = file.as_deref().and_then(secret_readable) {
            w.push(format!("{key}: {why}"));
        }
    }
    let now = rigd_drivers::realtime_ns() / 1_000_000_000;
    for (key, file, what, by) in [
        (
            "pulsar.tls-cert-file",
            &config.pulsar.tls_cert_file,
            "the client certificate",
            "the broker",
        ),
        (
            "web.tls-cert-file",
            &config.web.tls_cert_file,
            "the web certificate",
            "a browser",
        ),
    ] {
        if let Some(why) = file
            .as_deref()
            .and_then(|f| identity::dates_problem(f, what, by, now))
        {
            w.push(format!("{key}: {why} (rigd runs and spools meanwhile)"));
        }
    }
    if let Some(fs) = existing_ancestor(&config.spool.path).and_then(|d| memory_filesystem(&d)) {
        w.push(format!(
            "spool.path: {} is on {fs}, in memory: a power cut or reboot loses every spooled frame{}; put the spool on a disk",
            config.spool.path.display(),
            if config.spool.mode == crate::config::SpoolMode::Always {
                ", and with it mode = \"always\"'s promise that every frame is on disk"
            } else {
                ""
            }
        ));
    }
    w
}

/// Logs what `check` would warn of (the config's own [`Config::warnings`] and the host's
/// [`warnings`]), once at start of `run`: a daemon that starts anyway says so in its log.
pub fn log_warnings(config: &Config) {
    for w in config.warnings().into_iter().chain(warnings(config)) {
        tracing::warn!("config: {w}");
    }
}

/// Why a secret file (a token, a private key) may be read by others than the service: readable
/// by every user, or by a group that is neither this process's nor `rigd` (the documented
/// layout: root:rigd 0640). None when only its owner and the service's group may read it.
fn secret_readable(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    let mode = m.mode() & 0o777;
    let fix = format!(
        "chmod 0600 {0} (or chgrp rigd {0} && chmod 0640 {0})",
        path.display()
    );
    if mode & 0o004 != 0 {
        return Some(format!(
            "{} is readable by every user (mode {mode:04o}): any local account can read the secret; {fix}",
            path.display()
        ));
    }
    if mode & 0o040 != 0 && !own_group(m.gid()) {
        return Some(format!(
            "{} is readable by group {} (mode {mode:04o}), not the service's: its members can read the secret; {fix}",
            path.display(),
            group_name(m.gid()).unwrap_or_else(|| m.gid().to_string())
        ));
    }
    None
}

/// Whether `gid` is this process's group (primary or supplementary) or the group `rigd`.
fn own_group(gid: u32) -> bool {
    // /proc/self/status: `Gid: real effective saved fs` and `Groups: supplementary...`.
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let mine = status
        .lines()
        .filter_map(|l| l.strip_prefix("Gid:").or_else(|| l.strip_prefix("Groups:")))
        .flat_map(str::split_whitespace)
        .any(|g| g.parse() == Ok(gid));
    mine || group_name(gid).as_deref() == Some("rigd")
}

/// The name of group `gid` from /etc/group.
fn group_name(gid: u32) -> Option<String> {
    let groups = std::fs::read_to_string("/etc/group").ok()?;
    groups.lines().find_map(|l| {
        let mut f = l.split(':');
        let name = f.next()?;
        (f.nth(1)?.parse::<u32>().ok()? == gid).then(|| name.to_string())
    })
}

/// tmpfs and ramfs: filesystems in memory, gone at the next boot.
fn memory_filesystem(dir: &Path) -> Option<&'static str> {
    let st = rustix::fs::statfs(dir).ok()?;
    match st.f_type as u64 {
        0x0102_1994 => Some("tmpfs"),
        0x8584_58f6 => Some("ramfs"),
        _ => None,
    }
}

/// Why the web port cannot be bound, if it cannot.
fn web_port_taken(config: &Config) -> Option<String> {
    let bind = config.web_bind();
    config.web.bind.parse::<std::net::SocketAddr>().ok()?;
    std::net::TcpListener::bind(bind).err().map(|e| {
        format!(
            "web.bind: cannot listen on {bind}: {e} (another process, or a running rigd, holds it)"
        )
    })
}

/// Whether a running rigd has the spool at `path` open (it holds `LOCK` exclusively).
pub fn spool_in_use(path: &Path) -> bool {
    std::fs::File::open(path.join("LOCK")).is_ok_and(|f| {
        rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockShared).is_err()
    })
}

/// Whether the spool can be created and written at `spool.path`. A path that is a file, runs
/// through a file or lies on a kernel pseudo-filesystem is the config's to fix; one that cannot be
/// written yet (a disk not mounted over a root-owned or read-only mount point) is the host's.
fn spool_problems(config: &Config, p: &mut Vec<HostProblem>) {
    let path = &config.spool.path;
    if path.as_os_str().is_empty() || path.to_string_lossy().contains('\0') {
        return; // Config::problems says so
    }
    match std::fs::metadata(path) {
        Ok(m) if !m.is_dir() => {
            p.push(Fix(format!(
                "spool.path: {} exists and is not a directory",
                path.display()
            )));
            return;
        }
        Ok(_) => {}
        // Not there yet (the spool creates it), or a file on the way: said below.
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
            ) => {}
        Err(e) => {
            p.push(NotReady(format!("spool.path: {}: {e}", path.display())));
            return;
        }
    }
    // The spool creates its directory: the closest existing ancestor must be a directory.
    let Some(existing) = existing_ancestor(path) else {
        return;
    };
    if !existing.is_dir() {
        p.push(Fix(format!(
            "spool.path: cannot create {}: {} is not a directory",
            path.display(),
            existing.display()
        )));
        return;
    }
    if let Some(fs) = pseudo_filesystem(&existing) {
        p.push(Fix(format!(
            "spool.path: {} is on {fs}, not on a disk",
            path.display()
        )));
        return;
    }
    // Read-only (EROFS: a disk not mounted yet under a read-only root, or ProtectSystem) or not
    // this user's to write: the spool cannot be created or written there.
    if let Err(e) = rustix::fs::access(&existing, rustix::fs::Access::WRITE_OK) {
        p.push(NotReady(format!(
            "spool.path: {} cannot be written ({}: {})",
            path.display(),
            existing.display(),
            std::io::Error::from(e)
        )));
        return;
    }
    if let Ok(st) = rustix::fs::statvfs(&existing) {
        let size = st.f_blocks.saturating_mul(st.f_frsize);
        let reserve = config.spool.free_reserve.0;
        if size > 0 && reserve >= size {
            // Not ready rather than wrong: the disk the spool belongs on may not be mounted
            // yet, and the reserve is measured against the filesystem below it.
            p.push(NotReady(format!(
                "spool.free-reserve: {} is not below the size of the spool's filesystem ({}, at {}): every frame would be dropped",
                config.spool.free_reserve.human(),
                crate::config::ByteSize(size).human(),
                existing.display()
            )));
        }
    }
}

/// The kernel's own filesystems, which hold no files of ours (`/proc`, `/sys`, ...), by name.
fn pseudo_filesystem(dir: &Path) -> Option<&'static str> {
    let st = rustix::fs::statfs(dir).ok()?;
    Some(match st.f_type as u64 {
        0x9fa0 => "proc",
        0x6265_6572 => "sysfs",
        0x1cd1 => "devpts",
        0x6367_7270 => "cgroup2",
        0x0027_e0eb => "cgroup",
        0x6462_6720 => "debugfs",
        0x7472_6163 => "tracefs",
        0x7363_6673 => "securityfs",
        0xcafe_4a11 => "bpf",
        _ => return None,
    })
}

/// `path` itself, or its closest ancestor that exists (relative paths from the working directory).
fn existing_ancestor(path: &Path) -> Option<PathBuf> {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().ok()?.join(path)
    };
    abs.ancestors()
        .find(|a| std::fs::symlink_metadata(a).is_ok())
        .map(Path::to_path_buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(p: Vec<HostProblem>) -> Vec<String> {
        p.iter().map(|p| p.text().to_string()).collect()
    }

    fn config(dir: &Path, extra: &str) -> Config {
        let text = format!(
            "[rig]\nid = \"a\"\n[[source]]\nid = \"g\"\nkind = \"synthetic-serial\"\n[spool]\npath = \"{}/spool\"\n[web]\nbind = \"127.0.0.1:0\"\n{extra}",
            dir.display()
        );
        Config::parse(&text, "t.toml").unwrap()
    }

    #[test]
    fn a_can_interface_not_there_is_a_warning_not_a_problem() {
        let dir = tempfile::tempdir().unwrap();
        let c = Config::parse(
            &format!(
                "[rig]\nid = \"a\"\n[[source]]\nid = \"bus\"\nkind = \"can\"\ninterface = \"nocan7\"\n[spool]\npath = \"{}/spool\"\n",
                dir.path().display()
            ),
            "t",
        )
        .unwrap();
        assert_eq!(problems(&c), Vec::new());
        let w = warnings(&c).join("\n");
        if Path::new("/sys/class/net").is_dir() {
            assert!(
                w.contains("source[0].interface: no network interface `nocan7`"),
                "{w}"
            );
        }
        let lo = Config::parse(
            &format!(
                "[rig]\nid = \"a\"\n[[source]]\nid = \"bus\"\nkind = \"can\"\ninterface = \"lo\"\n[spool]\npath = \"{}/spool\"\n",
                dir.path().display()
            ),
            "t",
        )
        .unwrap();
        assert!(!warnings(&lo).join("\n").contains("interface"));
    }

    #[test]
    fn a_usable_host_has_no_problems() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(problems(&config(dir.path(), "")), Vec::new());
    }

    #[test]
    fn a_spool_path_that_is_a_file_is_the_configs_to_fix() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("spool"), b"x").unwrap();
        let p = problems(&config(dir.path(), ""));
        assert!(
            matches!(&p[..], [HostProblem::Config(l)] if l.starts_with("spool.path:")),
            "{p:?}"
        );
        std::fs::remove_file(dir.path().join("spool")).unwrap();
        std::fs::write(dir.path().join("file"), b"x").unwrap();
        let c = Config::parse(
            &format!(
                "[rig]\nid = \"a\"\n[[source]]\nid = \"g\"\nkind = \"synthetic-serial\"\n[spool]\npath = \"{}/file/spool\"\n[web]\nbind = \"127.0.0.1:0\"\n",
                dir.path().display()
            ),
            "t",
        )
        .unwrap();
        let p = problems(&c);
        assert!(
            matches!(&p[..], [HostProblem::Config(l)] if l.contains("is not a directory")),
            "{p:?}"
        );
    }

    #[test]
    fn a_spool_on_a_pseudo_filesystem_is_the_configs_to_fix() {
        // It was filed as the host's (exit 75), so systemd restarted a config no host can run.
        let c = Config::parse(
            "[rig]\nid = \"a\"\n[[source]]\nid = \"g\"\nkind = \"synthetic-serial\"\n[spool]\npath = \"/proc/rigd-spool\"\n[web]\nbind = \"127.0.0.1:0\"\n",
            "t",
        )
        .unwrap();
        let p = problems(&c);
        assert!(
            matches!(&p[..], [HostProblem::Config(l)] if l.contains("is on proc")),
            "{p:?}"
        );
    }

    #[test]
    fn missing_files_and_a_reserve_larger_than_the_disk_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = config(dir.path(), "");
        c.pulsar.token_file = Some(dir.path().join("no-token"));
        c.pulsar.tls_ca_file = Some(dir.path().join("no-ca.pem"));
        c.spool.free_reserve = crate::config::ByteSize(1 << 60);
        let p = texts(problems(&c));
        for key in [
            "pulsar.token-file:",
            "pulsar.tls-ca-file:",
            "spool.free-reserve:",
        ] {
            assert!(p.iter().any(|l| l.starts_with(key)), "{key}: {p:?}");
        }
        std::fs::write(dir.path().join("empty"), "\n").unwrap();
        c.pulsar.token_file = Some(dir.path().join("empty"));
        assert!(texts(problems(&c))
            .iter()
            .any(|l| l.starts_with("pulsar.token-file:") && l.contains("empty")));
    }

    #[test]
    fn a_busy_web_port_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = config(dir.path(), "");
        c.web.bind = held.local_addr().unwrap().to_string();
        let p = problems(&c);
        assert!(
            matches!(&p[..], [HostProblem::NotReady(l)] if l.starts_with("web.bind:")),
            "{p:?}"
        );
    }

    #[test]
    fn issue_47_a_config_without_a_source_is_the_configs_to_fix() {
        let dir = tempfile::tempdir().unwrap();
        let c = Config::parse(
            &format!(
                "[rig]\nid = \"a\"\n[spool]\npath = \"{}/spool\"\n[web]\nbind = \"127.0.0.1:0\"\n",
                dir.path().display()
            ),
            "t",
        )
        .unwrap();
        let p = problems(&c);
        assert!(
            matches!(&p[..], [HostProblem::Config(l)] if l.starts_with("source: no [[source]] table")),
            "{p:?}"
        );
    }

    #[test]
    fn issue_47_a_serial_device_that_is_not_a_terminal_is_the_configs_to_fix() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("gps.log"), b"$GPRMC\n").unwrap();
        for (device, says) in [
            ("/dev/null".to_string(), "of class `mem`"),
            (
                format!("{}/gps.log", dir.path().display()),
                "is a regular file",
            ),
            ("/dev".to_string(), "is a directory"),
        ] {
            let mut c = config(dir.path(), "");
            c = Config::parse(
                &format!(
                    "[rig]\nid = \"a\"\n[[source]]\nid = \"g\"\nkind = \"serial\"\ndevice = \"{device}\"\n[spool]\npath = \"{}\"\n[web]\nbind = \"127.0.0.1:0\"\n",
                    c.spool.path.display()
                ),
                "t",
            )
            .unwrap();
            let p = problems(&c);
            assert!(
                matches!(&p[..], [HostProblem::Config(l)] if l.starts_with("source[0].device:") && l.contains(says)),
                "{device}: {p:?}"
            );
        }
        // A pseudo-terminal is a terminal.
        let m = std::fs::metadata("/dev/ptmx").unwrap();
        assert_eq!(not_a_tty(&m), None);
    }

    #[test]
    fn issue_47_short_tokens_are_refused_and_readable_ones_warned_of() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("t.token");
        std::fs::write(&token, "short-token\n").unwrap();
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut c = config(dir.path(), "");
        c.pulsar.token_file = Some(token.clone());
        c.web.token_file = Some(token.clone());
        let p = texts(problems(&c));
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(
            p[0].starts_with("pulsar.token-file:") && p[0].contains("11 characters"),
            "{p:?}"
        );
        assert!(
            p[1].starts_with("web.token-file:") && p[1].contains("at least 16"),
            "{p:?}"
        );
        std::fs::write(&token, "0123456789abcdef\n").unwrap();
        assert_eq!(problems(&c), Vec::new());
        assert!(warnings(&c).is_empty(), "{:?}", warnings(&c));
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
        let w = warnings(&c);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(
            w.iter()
                .all(|w| w.contains("readable by every user (mode 0644)")),
            "{w:?}"
        );
    }

    #[test]
    fn issue_47_a_missing_clock_interface_is_a_warning() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = config(dir.path(), "");
        c.clock.interface = Some("rigdnoif0".into());
        let w = warnings(&c);
        assert!(
            w.len() == 1 && w[0].starts_with("clock.interface: no network interface `rigdnoif0`"),
            "{w:?}"
        );
        c.clock.interface = Some("lo".into());
        assert!(warnings(&c).is_empty());
    }

    #[test]
    fn issue_47_a_spool_in_memory_is_a_warning() {
        if memory_filesystem(Path::new("/dev/shm")).is_none() {
            return; // no tmpfs at /dev/shm here
        }
        let dir = tempfile::tempdir().unwrap();
        let mut c = config(dir.path(), "");
        assert!(warnings(&c).is_empty());
        c.spool.path = "/dev/shm/rigd-preflight-test/spool".into();
        c.spool.mode = crate::config::SpoolMode::Always;
        let w = warnings(&c);
        assert!(
            w.len() == 1
                && w[0].starts_with("spool.path:")
                && w[0].contains("tmpfs")
                && w[0].contains("always"),
            "{w:?}"
        );
    }
}
