//! The systemd service-manager protocol (`sd_notify`), spoken without libsystemd: `READY=1` once
//! every task has started, `STATUS=` lines saying what the daemon is doing, `STOPPING=1` on
//! SIGTERM, and `WATCHDOG=1` pings that are sent only while the pipeline makes progress.
//!
//! Messages are datagrams to `$NOTIFY_SOCKET` (a path, or an abstract name written `@name`).
//! Without that variable every call is a no-op, so `rigd run` behaves the same outside systemd.
//!
//! The watchdog is not a timer: [`Liveness`] pings only when every lane's heartbeat is recent and
//! every periodic capture source delivered a frame recently (or is backing off after a device
//! failure). A stuck lane, a capture thread wedged in a driver, or a blocked async runtime stops
//! the pings, and systemd restarts the service after `WatchdogSec`.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rigd_drivers::{SourceHealth, SourceState};

use crate::config::SourceConfig;
use crate::pipeline::LaneStats;

/// A lane or capture source without progress for this long counts as stalled (more for sources
/// whose frames are further apart, see [`Liveness::capture`]).
pub const SOURCE_STALL_AFTER: Duration = Duration::from_secs(5);

/// How often STATUS= is refreshed.
const STATUS_EVERY: Duration = Duration::from_secs(5);

/// A connection to the service manager, or nothing when not started by one.
#[derive(Debug)]
pub struct Notifier {
    target: Option<(UnixDatagram, SocketAddr)>,
    watchdog: Option<Duration>,
}

impl Notifier {
    /// Reads `$NOTIFY_SOCKET`, `$WATCHDOG_USEC` and `$WATCHDOG_PID`.
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok();
        Self::from_vars(
            var("NOTIFY_SOCKET").as_deref(),
            var("WATCHDOG_USEC").as_deref(),
            var("WATCHDOG_PID").as_deref(),
            std::process::id(),
        )
    }

    /// As [`Notifier::from_env`], from given values (`pid` is this process).
    pub fn from_vars(
        socket: Option<&str>,
        watchdog_usec: Option<&str>,
        watchdog_pid: Option<&str>,
        pid: u32,
    ) -> Self {
        let target = socket.and_then(|s| match socket_addr(s) {
            Ok(addr) => match UnixDatagram::unbound() {
                Ok(sock) => Some((sock, addr)),
                Err(e) => {
                    tracing::warn!(error = %e, "sd_notify: cannot create a socket");
                    None
                }
            },
            Err(e) => {
                tracing::warn!(notify_socket = s, error = %e, "sd_notify: unusable NOTIFY_SOCKET");
                None
            }
        });
        // The watchdog is meant for us only when WATCHDOG_PID is absent or names this process.
        let ours = watchdog_pid.is_none_or(|p| p.trim().parse::<u32>() == Ok(pid));
        let watchdog = watchdog_usec
            .and_then(|u| u.trim().parse::<u64>().ok())
            .filter(|&u| u > 0 && ours && target.is_some())
            .map(Duration::from_micros);
        Self { target, watchdog }
    }

    /// True when a service manager listens.
    pub fn enabled(&self) -> bool {
        self.target.is_some()
    }

    /// The watchdog interval systemd expects pings within, when it asked for them.
    pub fn watchdog(&self) -> Option<Duration> {
        self.watchdog
    }

    /// Sends one message (newline-separated `KEY=value` assignments); failures are logged only.
    pub fn send(&self, msg: &str) {
        if let Some((sock, addr)) = &self.target {
            if let Err(e) = sock.send_to_addr(msg.as_bytes(), addr) {
                tracing::debug!(error = %e, "sd_notify: send failed");
            }
        }
    }

    pub fn ready(&self, status: &str) {
        self.send(&format!("READY=1\nSTATUS={}", one_line(status)));
    }

    pub fn status(&self, status: &str) {
        self.send(&format!("STATUS={}", one_line(status)));
    }

    pub fn stopping(&self, status: &str) {
        self.send(&format!("STOPPING=1\nSTATUS={}", one_line(status)));
    }

    pub fn watchdog_ping(&self) {
        self.send("WATCHDOG=1");
    }
}

/// `@name` is an abstract socket; anything else must be an absolute path.
fn socket_addr(s: &str) -> std::io::Result<SocketAddr> {
    if let Some(name) = s.strip_prefix('@') {
        SocketAddr::from_abstract_name(name.as_bytes())
    } else if s.starts_with('/') {
        SocketAddr::from_pathname(s)
    } else {
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "only unix socket paths and @abstract names are supported",
        ))
    }
}

fn one_line(s: &str) -> String {
    s.replace('\n', " ")
}

/// Watches one capture source's frame counter.
struct CaptureWatch {
    id: Arc<str>,
    health: Arc<SourceHealth>,
    /// Stalled after this long without a new frame; `None`: frames need not come at a rate.
    stall_after: Option<Duration>,
    frames: u64,
    since: Instant,
}

/// The stall rule (the watchdog's, and the status page's `stall_after_ms`): a source whose frames
/// come at a rate has stalled after [`SOURCE_STALL_AFTER`] without a frame, or four frame intervals when
/// that is longer. Serial devices have no rate (`None`): a quiet line is not a hung daemon.
pub fn stall_after(cfg: &SourceConfig, bucket_ms: u32) -> Option<Duration> {
    cfg.frame_interval(bucket_ms)
        .map(|i| SOURCE_STALL_AFTER.max(i.saturating_mul(4)))
}

/// Decides whether the pipeline is alive: every lane beat recently, every periodic capture source
/// delivered a frame recently or is backing off.
pub struct Liveness {
    lanes: Vec<(Arc<str>, Arc<LaneStats>)>,
    captures: Vec<CaptureWatch>,
}

impl Default for Liveness {
    fn default() -> Self {
        Self::new()
    }
}

impl Liveness {
    pub fn new() -> Self {
        Self {
            lanes: Vec::new(),
            captures: Vec::new(),
        }
    }

    /// Watches a lane through its heartbeat.
    pub fn lane(&mut self, id: Arc<str>, stats: Arc<LaneStats>) {
        self.lanes.push((id, stats));
    }

    /// Watches a capture source through its frame counter, by [`stall_after`].
    pub fn capture(
        &mut self,
        id: Arc<str>,
        health: Arc<SourceHealth>,
        cfg: &SourceConfig,
        bucket_ms: u32,
    ) {
        let stall_after = stall_after(cfg, bucket_ms);
        self.captures.push(CaptureWatch {
            id,
            frames: health.frames(),
            health,
            stall_after,
            since: Instant::now(),
        });
    }

    /// `Ok` when alive, else what is stalled and for how long. Call it regularly: a source's
    /// stall clock restarts whenever its counter moves or it is not running.
    pub fn check(&mut self, now: Instant) -> Result<(), String> {
        let mut stalled = Vec::new();
        for (id, lane) in &self.lanes {
            let age = lane.heartbeat.age();
            if age > SOURCE_STALL_AFTER {
                stalled.push(format!("lane {id} ({:.1} s)", age.as_secs_f64()));
            }
        }
        for c in &mut self.captures {
            let frames = c.health.frames();
            if frames != c.frames || c.health.state() != SourceState::Running {
                c.frames = frames;
                c.since = now;
                continue;
            }
            if let Some(limit) = c.stall_after {
                let quiet = now.saturating_duration_since(c.since);
                if quiet > limit {
                    stalled.push(format!("capture {} ({:.1} s)", c.id, quiet.as_secs_f64()));
                }
            }
        }
        if stalled.is_empty() {
            Ok(())
        } else {
            Err(format!("stalled: {}", stalled.join(", ")))
        }
    }
}

/// The STATUS= text, e.g. `locked, 3 sources running, uplink up, spool 2.1 GiB draining`.
pub fn status_line(s: &rigd_web::Status) -> String {
    let mut out = s.clock.state.clone();
    let n = s.sources.len();
    let not_running: Vec<String> = s
        .sources
        .iter()
        .filter(|x| x.state != "running")
        .map(|x| format!("{} {}", x.id, x.state))
        .collect();
    let plural = if n == 1 { "" } else { "s" };
    if not_running.is_empty() {
        out.push_str(&format!(", {n} source{plural} running"));
    } else {
        out.push_str(&format!(
            ", {n} source{plural} ({})",
            not_running.join(", ")
        ));
    }
    let up = s.uplink.configured && s.uplink.connected;
    out.push_str(match (s.uplink.configured, up) {
        (false, _) => ", no uplink",
        (true, true) => ", uplink up",
        (true, false) => ", uplink down",
    });
    if s.spool.records == 0 {
        out.push_str(", spool empty");
    } else {
        // Without an uplink the spool is the destination, not a backlog.
        let what = match (s.uplink.configured, up) {
            (false, _) => "",
            (true, true) => " draining",
            (true, false) => " holding",
        };
        out.push_str(&format!(
            ", spool {} in {} records{what}",
            crate::config::ByteSize(s.spool.bytes).human(),
            s.spool.records
        ));
    }
    if s.spool.dropped > 0 {
        out.push_str(&format!(", {} dropped", s.spool.dropped));
    }
    out
}

/// Runs until aborted: refreshes STATUS= every few seconds and pings the watchdog (at half its
/// interval) while `liveness` says the pipeline is alive. Runs on the async runtime on purpose: a
/// blocked runtime stops the pings too.
pub async fn supervise(
    notifier: Arc<Notifier>,
    status: Arc<dyn rigd_web::StatusSource>,
    mut liveness: Liveness,
) {
    let tick = notifier
        .watchdog()
        .map(|w| (w / 2).min(Duration::from_secs(1)))
        .unwrap_or(Duration::from_secs(1));
    let mut timer = tokio::time::interval(tick);
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_status: Option<Instant> = None;
    let mut was_stalled = false;
    loop {
        timer.tick().await;
        let now = Instant::now();
        let verdict = liveness.check(now);
        let stalled = verdict.is_err();
        match &verdict {
            Ok(()) => {
                if notifier.watchdog().is_some() {
                    notifier.watchdog_ping();
                }
                if was_stalled {
                    tracing::info!("pipeline progressing again; watchdog pings resume");
                }
            }
            Err(what) if !was_stalled => {
                tracing::error!(what = %what, "pipeline stalled; watchdog pings withheld");
            }
            Err(_) => {}
        }
        if stalled != was_stalled || last_status.is_none_or(|t| now - t >= STATUS_EVERY) {
            let mut line = status_line(&status.status());
            if let Err(what) = verdict {
                line = format!("{what}; {line}");
            }
            notifier.status(&line);
            last_status = Some(now);
        }
        was_stalled = stalled;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listener() -> (tempfile::TempDir, UnixDatagram, String) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let sock = UnixDatagram::bind(&path).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        (dir, sock, path.display().to_string())
    }

    fn recv(sock: &UnixDatagram) -> String {
        let mut buf = [0u8; 4096];
        let n = sock.recv(&mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[test]
    fn sends_to_a_path_socket() {
        let (_dir, sock, path) = listener();
        let n = Notifier::from_vars(Some(&path), None, None, 1);
        assert!(n.enabled());
        n.ready("locked,\n3 sources");
        assert_eq!(recv(&sock), "READY=1\nSTATUS=locked, 3 sources");
        n.stopping("bye");
        assert_eq!(recv(&sock), "STOPPING=1\nSTATUS=bye");
    }

    #[test]
    fn sends_to_an_abstract_socket() {
        let name = format!("rigd-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let sock = UnixDatagram::bind_addr(&addr).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let n = Notifier::from_vars(Some(&format!("@{name}")), Some("1000000"), None, 7);
        n.watchdog_ping();
        assert_eq!(recv(&sock), "WATCHDOG=1");
        assert_eq!(n.watchdog(), Some(Duration::from_secs(1)));
    }

    #[test]
    fn without_a_socket_nothing_is_enabled() {
        let n = Notifier::from_vars(None, Some("1000000"), None, 1);
        assert!(!n.enabled());
        assert_eq!(n.watchdog(), None);
        n.ready("x");
        let n = Notifier::from_vars(Some("relative/path"), None, None, 1);
        assert!(!n.enabled());
    }

    #[test]
    fn watchdog_pid_must_name_this_process() {
        let (_dir, _sock, path) = listener();
        let other = Notifier::from_vars(Some(&path), Some("2000000"), Some("41"), 42);
        assert_eq!(other.watchdog(), None);
        let ours = Notifier::from_vars(Some(&path), Some("2000000"), Some("42"), 42);
        assert_eq!(ours.watchdog(), Some(Duration::from_secs(2)));
        let zero = Notifier::from_vars(Some(&path), Some("0"), None, 42);
        assert_eq!(zero.watchdog(), None);
    }

    fn camera(fps: f64) -> SourceConfig {
        let text = format!(
            "[rig]\nid = \"r\"\n[[source]]\nid = \"cam\"\nkind = \"synthetic-camera\"\nfps = {fps}\n"
        );
        crate::config::Config::parse(&text, "t").unwrap().sources[0].clone()
    }

    #[test]
    fn a_capture_source_without_frames_stalls_unless_backing_off() {
        let health = Arc::new(SourceHealth::default());
        let mut l = Liveness::new();
        l.capture("cam".into(), health.clone(), &camera(30.0), 33);
        let t0 = Instant::now();
        assert!(l.check(t0).is_ok());
        assert!(l.check(t0 + Duration::from_secs(4)).is_ok());
        let err = l.check(t0 + Duration::from_secs(6)).unwrap_err();
        assert!(err.contains("capture cam"), "{err}");
        // Backing off after a device failure is progress of a kind; the clock restarts.
        health.set_state(SourceState::Retrying, "unplugged");
        assert!(l.check(t0 + Duration::from_secs(7)).is_ok());
        health.set_state(SourceState::Running, "");
        assert!(l.check(t0 + Duration::from_secs(11)).is_ok());
        assert!(l.check(t0 + Duration::from_secs(13)).is_err());
    }

    #[test]
    fn slow_sources_get_four_frame_intervals() {
        let health = Arc::new(SourceHealth::default());
        let mut l = Liveness::new();
        l.capture("cam".into(), health, &camera(0.1), 33);
        let t0 = Instant::now();
        assert!(l.check(t0 + Duration::from_secs(39)).is_ok());
        assert!(l.check(t0 + Duration::from_secs(41)).is_err());
    }

    #[test]
    fn a_lane_that_beat_recently_is_alive() {
        let mut l = Liveness::new();
        l.lane("front".into(), Arc::new(LaneStats::default()));
        assert!(l.check(Instant::now()).is_ok());
    }

    #[test]
    fn status_line_says_what_the_daemon_does() {
        let mut s = rigd_web::Status::default();
        s.clock.state = "locked".into();
        for id in ["a", "b", "c"] {
            s.sources.push(rigd_web::SourceStatus {
                id: id.into(),
                state: "running".into(),
                ..Default::default()
            });
        }
        s.uplink.configured = true;
        s.uplink.connected = true;
        s.spool.bytes = 2_254_857_830;
        s.spool.records = 1200;
        assert_eq!(
            status_line(&s),
            "locked, 3 sources running, uplink up, spool 2.1 GiB in 1200 records draining"
        );
        s.sources[1].state = "retrying".into();
        s.uplink.connected = false;
        s.spool.records = 0;
        assert_eq!(
            status_line(&s),
            "locked, 3 sources (b retrying), uplink down, spool empty"
        );
    }
}
