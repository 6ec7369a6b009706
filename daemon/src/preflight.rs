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

fn host_problems(config: &Config, check: bool) -> Vec<HostProblem> {
    let mut p = Vec::new();
    if let Some(path) = &config.pulsar.token_file {
        if let Err(e) = read_token(path) {
            p.push(NotReady(format!("pulsar.token-file: {e}")));
        }
    }
    let client = crate::app::client_cert(config);
    if config.pulsar.tls_ca_file.is_some() || client.is_some() {
        // The certificates are read at start, whatever the URL says, so a file that is not
        // there fails here rather than when the URL is changed to pulsar+ssl:// later.
        let ca = config.pulsar.tls_ca_file.as_deref();
        if let Err(e) = crate::uplink::tls_config(ca, client) {
            // The message starts with the file it is about.
            let named = |f: Option<&Path>| f.is_some_and(|f| e.starts_with(&*f.to_string_lossy()));
            let key = if named(ca) {
                "pulsar.tls-ca-file"
            } else if named(client.map(|c| c.1)) {
                "pulsar.tls-key-file"
            } else {
                "pulsar.tls-cert-file"
            };
            p.push(NotReady(format!("{key}: {e}")));
        }
        // An expired certificate is not a reason to stop capturing: the status page and the
        // alerts say it (`identity::problem`) while frames go to the spool.
    }
    if let Err(e) = crate::app::encryption(config) {
        p.push(NotReady(e.to_string()));
    }
    if let Err(e) = crate::app::web_tls(config) {
        p.push(NotReady(e.to_string()));
    }
    spool_problems(config, &mut p);
    if let Some(e) = web_port_taken(config) {
        if !(check && spool_in_use(&config.spool.path)) {
            p.push(NotReady(e));
        }
    }
    p
}

/// What `rigd check` says beside the problems, without failing: what `run` copes with but an
/// operator should know before a restart. The web port held by the running rigd of this very
/// spool is one (the check of a live rig's edited config must pass, issue 32); the others are
/// a web token file that cannot be read (control actions disabled) and device paths that do not
/// exist (yet: a USB device may appear later).
pub fn warnings(config: &Config) -> Vec<String> {
    let mut w = Vec::new();
    // The LOCK probe first: the port is bound (a second time) only on a live rig.
    if spool_in_use(&config.spool.path) && web_port_taken(config).is_some() {
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
                "source[{i}].device: {device} does not exist (yet: the source retries until it appears)"
            ));
        }
    }
    w
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
            "[rig]\nid = \"a\"\n[spool]\npath = \"{}/spool\"\n[web]\nbind = \"127.0.0.1:0\"\n{extra}",
            dir.display()
        );
        Config::parse(&text, "t.toml").unwrap()
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
                "[rig]\nid = \"a\"\n[spool]\npath = \"{}/file/spool\"\n[web]\nbind = \"127.0.0.1:0\"\n",
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
            "[rig]\nid = \"a\"\n[spool]\npath = \"/proc/rigd-spool\"\n[web]\nbind = \"127.0.0.1:0\"\n",
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
}
