//! The PTP port task: a slave-only statime port on one interface (UDPv4 or L2), its sockets with
//! kernel software timestamps, its timers and BMCA, feeding the lock tracker and the status report.
//! It runs on its own thread with a single-threaded runtime, so its CPU time is its own
//! (`task_cpu_ms` in the status) and busy capture or uplink tasks do not delay it.
//!
//! statime does no I/O: every call on the port returns actions (send this, reset that timer) that
//! this module carries out; send timestamps go back to the port once the action list is done.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::time::Duration as StdDuration;

use rand::{rngs::SmallRng, SeedableRng};
use rigd_drivers::ClockState;
use statime::config::{
    AcceptAnyMaster, ClockIdentity, DelayMechanism as PtpDelay, InstanceConfig, PortConfig,
    PtpMinorVersion, TimePropertiesDS, TimeSource,
};
use statime::observability::port::PortState;
use statime::port::{NoForwardedTLVs, PortAction, PortActionIterator, TimestampContext};
use statime::time::{Duration, Interval, Time};
use statime::PtpInstance;
use timestamped_socket::interface::{interfaces, InterfaceName};
use timestamped_socket::networkaddress::{EthernetAddress, MacAddress};
use timestamped_socket::socket::{
    open_interface_ethernet, open_interface_udp4, InterfaceTimestampMode, Open, Socket, Timestamp,
};
use tokio::sync::watch;
use tokio::time::Instant;

use super::disciplined::PortClock;
use super::lock::{LockTracker, Transition};
use super::servo::{PiFilter, ServoConfig};
use super::{format_identity, Ptp};
use crate::config::{ClockConfig, DelayMechanism, Transport};

const EVENT_PORT: u16 = 319;
const GENERAL_PORT: u16 = 320;
const PRIMARY_V4: Ipv4Addr = Ipv4Addr::new(224, 0, 1, 129);
const PDELAY_V4: Ipv4Addr = Ipv4Addr::new(224, 0, 0, 107);
const PTP_ETHERTYPE: u16 = 0x88f7;
const PRIMARY_MAC: [u8; 6] = [0x01, 0x1b, 0x19, 0x00, 0x00, 0x00];
const PDELAY_MAC: [u8; 6] = [0x01, 0x80, 0xc2, 0x00, 0x00, 0x0e];
/// Largest PTP message statime handles, with room for TLVs on general messages.
const BUF: usize = 2048;

/// Why the port stopped; every kind is retried with backoff by [`supervise`].
#[derive(Debug, thiserror::Error)]
pub enum PortError {
    #[error("interface `{interface}`: {reason}")]
    Interface { interface: String, reason: String },
    #[error("{what} on {interface}: {source}")]
    Socket {
        what: &'static str,
        interface: String,
        source: std::io::Error,
    },
}

/// The port's sockets: two UDP sockets (event 319 with timestamps, general 320) or one raw
/// Ethernet socket for both.
enum Net {
    Udp {
        event: Socket<SocketAddrV4, Open>,
        general: Socket<SocketAddrV4, Open>,
    },
    L2 {
        socket: Socket<EthernetAddress, Open>,
        ifindex: i32,
    },
}

/// A received message: in which buffer, how long, whether it is an event message, its RX time.
struct Received {
    in_general_buf: bool,
    len: usize,
    event: bool,
    timestamp: Option<Timestamp>,
}

impl Net {
    fn open(interface: &str, transport: Transport) -> Result<Self, PortError> {
        let name: InterfaceName = interface.parse().map_err(|_| PortError::Interface {
            interface: interface.to_string(),
            reason: "not a valid interface name".into(),
        })?;
        let sock_err = |what: &'static str| {
            let interface = interface.to_string();
            move |source| PortError::Socket {
                what,
                interface,
                source,
            }
        };
        match transport {
            Transport::Udp4 => {
                let event = open_interface_udp4(
                    name,
                    EVENT_PORT,
                    InterfaceTimestampMode::SoftwareAll,
                    None,
                )
                .map_err(sock_err("opening UDP port 319"))?;
                let general =
                    open_interface_udp4(name, GENERAL_PORT, InterfaceTimestampMode::None, None)
                        .map_err(sock_err("opening UDP port 320"))?;
                for s in [&event, &general] {
                    for group in [PRIMARY_V4, PDELAY_V4] {
                        s.join_multicast(SocketAddrV4::new(group, 0), name)
                            .map_err(sock_err("joining the PTP multicast groups"))?;
                    }
                }
                Ok(Net::Udp { event, general })
            }
            Transport::L2 => {
                let ifindex = name.get_index().ok_or_else(|| PortError::Interface {
                    interface: interface.to_string(),
                    reason: "no such interface".into(),
                })? as i32;
                let socket = open_interface_ethernet(
                    name,
                    PTP_ETHERTYPE,
                    InterfaceTimestampMode::SoftwareAll,
                    None,
                )
                .map_err(sock_err("opening a raw socket for ethertype 0x88f7"))?;
                for mac in [PRIMARY_MAC, PDELAY_MAC] {
                    socket
                        .join_multicast(
                            EthernetAddress::new(PTP_ETHERTYPE, MacAddress::new(mac), 0),
                            name,
                        )
                        .map_err(sock_err("joining the PTP multicast MACs"))?;
                }
                Ok(Net::L2 { socket, ifindex })
            }
        }
    }

    /// Waits for the next message (cancel-safe: readiness-based).
    async fn recv(&self, ev: &mut [u8], gen: &mut [u8]) -> std::io::Result<Received> {
        match self {
            Net::Udp { event, general } => {
                tokio::select! {
                    r = event.recv(ev) => r.map(|r| Received {
                        in_general_buf: false,
                        len: r.bytes_read,
                        event: true,
                        timestamp: r.timestamp_data.selected_timestamp(),
                    }),
                    r = general.recv(gen) => r.map(|r| Received {
                        in_general_buf: true,
                        len: r.bytes_read,
                        event: false,
                        timestamp: None,
                    }),
                }
            }
            Net::L2 { socket, .. } => {
                let r = socket.recv(ev).await?;
                // messageType in the low nibble of the first byte: 0..=3 are event messages.
                let event = r.bytes_read > 0 && ev[0] & 0x0f < 0x8;
                Ok(Received {
                    in_general_buf: false,
                    len: r.bytes_read,
                    event,
                    timestamp: r.timestamp_data.selected_timestamp(),
                })
            }
        }
    }

    /// Sends one message; for event messages, returns the kernel's TX timestamp.
    async fn send(
        &mut self,
        data: &[u8],
        event: bool,
        link_local: bool,
    ) -> std::io::Result<Option<Timestamp>> {
        match self {
            Net::Udp { event: ev, general } => {
                let group = if link_local { PDELAY_V4 } else { PRIMARY_V4 };
                if event {
                    let ts = ev
                        .send_to(data, SocketAddrV4::new(group, EVENT_PORT))
                        .await?;
                    Ok(ts.selected_timestamp())
                } else {
                    general
                        .send_to(data, SocketAddrV4::new(group, GENERAL_PORT))
                        .await?;
                    Ok(None)
                }
            }
            Net::L2 { socket, ifindex } => {
                let mac = if link_local { PDELAY_MAC } else { PRIMARY_MAC };
                let to = EthernetAddress::new(PTP_ETHERTYPE, MacAddress::new(mac), *ifindex);
                let ts = socket.send_to(data, to).await?;
                Ok(if event { ts.selected_timestamp() } else { None })
            }
        }
    }
}

/// The five port timers, as deadlines.
#[derive(Default)]
struct Timers {
    announce: Option<Instant>,
    sync: Option<Instant>,
    delay_request: Option<Instant>,
    announce_receipt: Option<Instant>,
    filter_update: Option<Instant>,
}

fn after(d: core::time::Duration) -> Option<Instant> {
    Some(Instant::now() + d)
}

async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

fn raw_ns(ts: Timestamp) -> i64 {
    ts.seconds * 1_000_000_000 + ts.nanos as i64
}

fn to_time(ns: i64) -> Time {
    Time::from_nanos(ns.max(0) as u64)
}

/// Carries out a port's actions, then hands each send timestamp back to the port and carries out
/// what that asks for, until the port waits for none (actions borrow the port, hence a macro).
macro_rules! perform_all {
    ($port:expr, $actions:expr, $net:expr, $timers:expr, $ptp:expr, $err:expr) => {{
        let mut pending = perform($actions, $net, $timers, $ptp).await.map_err($err)?;
        while let Some((ctx, ts)) = pending.take() {
            let a = $port.handle_send_timestamp(ctx, ts);
            pending = perform(a, $net, $timers, $ptp).await.map_err($err)?;
        }
    }};
}

/// Carries out a list of port actions; returns the send timestamp the port is waiting for.
async fn perform(
    actions: PortActionIterator<'_>,
    net: &mut Net,
    timers: &mut Timers,
    ptp: &Ptp,
) -> std::io::Result<Option<(TimestampContext, Time)>> {
    let mut pending = None;
    for action in actions {
        match action {
            PortAction::SendEvent {
                context,
                data,
                link_local,
            } => match net.send(data, true, link_local).await? {
                Some(ts) => pending = Some((context, to_time(ptp.clock.ptp_at(raw_ns(ts))))),
                None => tracing::warn!("no transmit timestamp for a PTP event message"),
            },
            PortAction::SendGeneral { data, link_local } => {
                net.send(data, false, link_local).await?;
            }
            PortAction::ResetAnnounceTimer { duration } => timers.announce = after(duration),
            PortAction::ResetSyncTimer { duration } => timers.sync = after(duration),
            PortAction::ResetDelayRequestTimer { duration } => {
                timers.delay_request = after(duration)
            }
            PortAction::ResetAnnounceReceiptTimer { duration } => {
                timers.announce_receipt = after(duration)
            }
            PortAction::ResetFilterUpdateTimer { duration } => {
                timers.filter_update = after(duration)
            }
            PortAction::ForwardTLV { .. } => {}
        }
    }
    Ok(pending)
}

/// Runs the port, reopening it with backoff after failures, until shutdown.
pub async fn supervise(cfg: ClockConfig, ptp: Arc<Ptp>, mut shutdown: watch::Receiver<bool>) {
    let origin = Instant::now();
    let mut tracker = LockTracker::new(super::lock_policy(&cfg));
    let seed = std::process::id() as u64 ^ rigd_drivers::realtime_ns() as u64;
    let mut backoff =
        crate::backoff::Backoff::new(StdDuration::from_secs(2), StdDuration::from_secs(30), seed);
    loop {
        let started = Instant::now();
        let r = run_port(&cfg, &ptp, &mut tracker, origin, &mut shutdown).await;
        match r {
            Ok(()) => return,
            Err(e) => {
                let t = tracker.on_master_lost(origin.elapsed().as_secs_f64());
                note_transition(&ptp, t, None);
                ptp.clock.set_state(tracker.state());
                if started.elapsed() > StdDuration::from_secs(60) {
                    backoff.reset();
                }
                let delay = backoff.next_delay();
                tracing::warn!(interface = cfg.interface.as_deref().unwrap_or(""), error = %e,
                    retry_in_ms = delay.as_millis() as u64, "PTP port failed; reopening");
                ptp.update(|r| {
                    r.error = Some(e.to_string());
                    r.port_state = "faulty".into();
                });
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = shutdown.changed() => return,
                }
            }
        }
    }
}

fn note_transition(ptp: &Ptp, t: Option<Transition>, offset_ns: Option<i64>) {
    if let Some(t) = t {
        ptp.clock.set_state(t.to);
        tracing::info!(
            from = t.from.as_str(),
            to = t.to.as_str(),
            reason = t.reason,
            offset_ns,
            steps = ptp.clock.steps(),
            "clock state changed"
        );
    }
}

/// What the status knows of the port and master, compared after every wake-up.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    slave: bool,
    port_state: PortState,
    grandmaster: ClockIdentity,
    parent: (ClockIdentity, u16),
}

fn clock_identity(interface: &str) -> ClockIdentity {
    let mac = interfaces()
        .ok()
        .and_then(|all| {
            all.into_iter()
                .find(|(n, _)| n.as_str() == interface)
                .and_then(|(_, d)| d.mac())
        })
        .filter(|m| m.iter().any(|b| *b != 0));
    let m = mac.unwrap_or_else(|| {
        // No MAC (e.g. a tunnel): a random, locally administered one.
        let r = rigd_drivers::realtime_ns().to_le_bytes();
        [0x02, r[0], r[1], r[2], r[3], r[4]]
    });
    // EUI-48 to EUI-64 as IEEE 1588 suggests: insert ff:fe in the middle.
    ClockIdentity([m[0], m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]])
}

async fn run_port(
    cfg: &ClockConfig,
    ptp: &Ptp,
    tracker: &mut LockTracker,
    origin: Instant,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<(), PortError> {
    let interface = cfg.interface.clone().unwrap_or_default();
    let io_err = |what: &'static str| {
        let interface = interface.clone();
        move |source| PortError::Socket {
            what,
            interface,
            source,
        }
    };
    let mut net = Net::open(&interface, cfg.transport)?;
    let identity = clock_identity(&interface);
    let instance = PtpInstance::<PiFilter>::new(
        InstanceConfig {
            clock_identity: identity,
            priority_1: 255,
            priority_2: 255,
            domain_number: cfg.domain,
            sdo_id: Default::default(),
            slave_only: true,
            path_trace: false,
        },
        TimePropertiesDS::new_arbitrary_time(false, false, TimeSource::InternalOscillator),
    );
    let delay_interval = Interval::from_log_2(cfg.log_min_delay_req_interval);
    let port_config = PortConfig {
        acceptable_master_list: AcceptAnyMaster,
        delay_mechanism: match cfg.delay_mechanism {
            DelayMechanism::E2e => PtpDelay::E2E {
                interval: delay_interval,
            },
            DelayMechanism::P2p => PtpDelay::P2P {
                interval: delay_interval,
            },
        },
        announce_interval: Interval::from_log_2(cfg.log_announce_interval),
        announce_receipt_timeout: cfg.announce_receipt_timeout,
        sync_interval: Interval::from_log_2(cfg.log_sync_interval),
        master_only: false,
        delay_asymmetry: Duration::ZERO,
        minor_ptp_version: PtpMinorVersion::One,
    };
    let filter = ServoConfig {
        step_threshold_ns: cfg.step_threshold_ns as f64,
        sync_interval_s: 2f64.powi(cfg.log_sync_interval.into()),
        delay_interval_s: 2f64.powi(cfg.log_min_delay_req_interval.into()),
    };
    let rng = SmallRng::seed_from_u64(rigd_drivers::realtime_ns() as u64);
    let port = instance.add_port(port_config, filter, PortClock(ptp.clock.clone()), rng);
    let (mut port, actions) = port.end_bmca();
    let mut timers = Timers::default();
    perform_all!(port, actions, &mut net, &mut timers, ptp, io_err("sending"));
    tracing::info!(interface = %interface, transport = ?cfg.transport, domain = cfg.domain,
        identity = %format_identity(&identity.0), "PTP port listening");
    ptp.update(|r| {
        r.error = None;
        r.port_state = "listening".into();
        r.identity = Some(format_identity(&identity.0));
    });

    let mut ev = [0u8; BUF];
    let mut gen = [0u8; BUF];
    let mut bmca_at = Instant::now() + instance.bmca_interval();
    let mut tick_at = Instant::now() + StdDuration::from_secs(1);
    let mut seen: Option<Seen> = None;
    let mut last_adjustments = ptp.clock.adjustments();
    let mut last_steps = ptp.clock.steps();

    enum Wake {
        Packet(Received),
        Announce,
        Sync,
        DelayRequest,
        AnnounceReceipt,
        FilterUpdate,
        Bmca,
        Tick,
        Shutdown,
    }

    loop {
        let wake = tokio::select! {
            r = net.recv(&mut ev, &mut gen) => Wake::Packet(r.map_err(io_err("receiving"))?),
            _ = until(timers.announce) => { timers.announce = None; Wake::Announce }
            _ = until(timers.sync) => { timers.sync = None; Wake::Sync }
            _ = until(timers.delay_request) => { timers.delay_request = None; Wake::DelayRequest }
            _ = until(timers.announce_receipt) => { timers.announce_receipt = None; Wake::AnnounceReceipt }
            _ = until(timers.filter_update) => { timers.filter_update = None; Wake::FilterUpdate }
            _ = tokio::time::sleep_until(bmca_at) => Wake::Bmca,
            _ = tokio::time::sleep_until(tick_at) => Wake::Tick,
            r = shutdown.changed() => { if r.is_ok() && !*shutdown.borrow() { continue; } Wake::Shutdown }
        };
        let mut is_receive = false;
        let actions: PortActionIterator<'_> = match wake {
            Wake::Shutdown => return Ok(()),
            Wake::Packet(p) => {
                is_receive = true;
                let buf = if p.in_general_buf {
                    &gen[..p.len]
                } else {
                    &ev[..p.len]
                };
                if !statime::port::is_message_buffer_compatible(buf) {
                    PortActionIterator::empty()
                } else if p.event {
                    match p.timestamp {
                        Some(ts) => {
                            let t = to_time(ptp.clock.ptp_at(raw_ns(ts)));
                            port.handle_event_receive(buf, t)
                        }
                        None => {
                            tracing::warn!("PTP event message without a receive timestamp");
                            PortActionIterator::empty()
                        }
                    }
                } else {
                    port.handle_general_receive(buf)
                }
            }
            Wake::Announce => port.handle_announce_timer(&mut NoForwardedTLVs),
            Wake::Sync => port.handle_sync_timer(),
            Wake::DelayRequest => port.handle_delay_request_timer(),
            Wake::AnnounceReceipt => port.handle_announce_receipt_timer(),
            Wake::FilterUpdate => port.handle_filter_update_timer(),
            Wake::Bmca => {
                let mut in_bmca = port.start_bmca();
                instance.bmca(&mut [&mut in_bmca]);
                let (p, a) = in_bmca.end_bmca();
                port = p;
                bmca_at = Instant::now() + instance.bmca_interval();
                perform_all!(port, a, &mut net, &mut timers, ptp, io_err("sending"));
                PortActionIterator::empty()
            }
            Wake::Tick => {
                tick_at += StdDuration::from_secs(1);
                let now_s = origin.elapsed().as_secs_f64();
                note_transition(ptp, tracker.tick(now_s), tracker.last_offset_ns());
                let cpu = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
                ptp.update(|r| {
                    r.task_cpu_ns = cpu.tv_sec as u64 * 1_000_000_000 + cpu.tv_nsec as u64;
                    r.fill_times(tracker, now_s);
                });
                PortActionIterator::empty()
            }
        };
        perform_all!(port, actions, &mut net, &mut timers, ptp, io_err("sending"));

        let now_s = origin.elapsed().as_secs_f64();
        let state_before = tracker.state();
        // Port state and master: BMCA and the announce-receipt timer change them.
        let pds = port.port_ds();
        let parent = instance.parent_ds();
        let now_seen = Seen {
            slave: port.is_steering(),
            port_state: pds.port_state,
            grandmaster: parent.grandmaster_identity,
            parent: (
                parent.parent_port_identity.clock_identity,
                parent.parent_port_identity.port_number,
            ),
        };
        if seen.as_ref() != Some(&now_seen) {
            on_port_change(ptp, tracker, seen.as_ref(), &now_seen, &parent, now_s);
            seen = Some(now_seen);
            // Frequency changes done during the change (the old filter handing over) are not samples.
            last_adjustments = ptp.clock.adjustments();
        }

        let steps = ptp.clock.steps();
        if steps != last_steps {
            last_steps = steps;
            note_transition(ptp, tracker.on_step(now_s), None);
        }
        let adjustments = ptp.clock.adjustments();
        if is_receive && adjustments != last_adjustments && port.is_steering() {
            last_adjustments = adjustments;
            // A fresh filter (or one that just stepped) reports exactly 0: no information yet.
            let estimate = port
                .port_current_ds_contribution()
                .filter(|e| e.offset_from_master.nanos_rounded() != 0);
            if let Some(est) = estimate {
                let offset = est.offset_from_master.nanos_rounded() as i64;
                let delay = est.mean_delay.nanos_rounded() as i64;
                note_transition(ptp, tracker.on_sample(now_s, offset), Some(offset));
                ptp.update(|r| {
                    r.offset_ns = Some(offset);
                    r.path_delay_ns = Some(delay);
                    r.samples += 1;
                    r.frequency_ppm = Some(ptp.clock.correction_ppm());
                    r.fill_times(tracker, now_s);
                });
            }
        }
        if tracker.state() != state_before {
            // Holdover and lock times must show at once, not at the next tick.
            ptp.update(|r| r.fill_times(tracker, now_s));
        }
    }
}

fn on_port_change(
    ptp: &Ptp,
    tracker: &mut LockTracker,
    before: Option<&Seen>,
    now: &Seen,
    parent: &statime::observability::parent::ParentDS,
    now_s: f64,
) {
    let was_slave = before.is_some_and(|b| b.slave);
    let gm = format_identity(&now.grandmaster.0);
    let state = format!("{:?}", now.port_state).to_lowercase();
    if now.slave {
        let new_master = !was_slave || before.is_some_and(|b| b.parent != now.parent);
        if new_master {
            // A new statime filter takes over from here: keep what the old one learned.
            ptp.clock.rebase_frequency();
            let previous = ptp.report().master;
            let changed = previous.as_deref().is_some_and(|p| p != gm);
            if changed {
                tracing::info!(from = previous.as_deref().unwrap_or(""), to = %gm,
                    priority1 = parent.grandmaster_priority_1, priority2 = parent.grandmaster_priority_2,
                    "PTP master changed (BMCA)");
            } else {
                tracing::info!(master = %gm, priority1 = parent.grandmaster_priority_1,
                    parent_port = now.parent.1, "PTP master selected");
            }
            ptp.update(|r| {
                if changed {
                    r.master_changes += 1;
                }
                r.master = Some(gm.clone());
            });
        }
    } else if was_slave {
        tracing::info!(port_state = %state, "PTP master lost");
        note_transition(ptp, tracker.on_master_lost(now_s), tracker.last_offset_ns());
    }
    ptp.update(|r| r.port_state = state);
    ptp.clock.set_state(tracker.state());
    if tracker.state() == ClockState::Unsynced {
        ptp.update(|r| r.offset_ns = None);
    }
}
