//! Fleet simulator: N rigs x M sources of synthetic frames, each source with rigd's own producer
//! (a rig's producers sharing one connection per broker, as a rig's do; `--connection-per-producer`
//! gives each its own, as rigd did before), against a real broker or cluster.
//!
//! usage: cargo bench -p rigd --bench fleet -- --url URL --namespace TENANT/NS --rigs N
//!        [--profile NAME:HZ:BYTES,...] [--rate-scale X] [--secs S] [--drain-secs S]
//!        [--connection-per-producer]
//!
//! Sources start once every producer is connected (`{"event":"ready",...}` on stdout), run for
//! `--secs`, then wait up to `--drain-secs` for every frame to be acknowledged. A frame the
//! producer does not take (not connected, window full) waits in the source's own queue, in order,
//! as it would in the spool, and goes out when the producer takes it again; its latency counts
//! from capture. Connection changes are watched every 10 ms: each stretch during which not every
//! producer is connected prints an `{"event":"down",...}` line (wall-clock times, for the driver
//! to line up with the admin operation it made). At the end: one `{"topic":...}` line per source
//! (generated, acknowledged, refused: for the driver's consumer to judge lost and duplicated) and
//! a `{"summary":...}` line. Driven by tests/bench/fleet.py.

use bytes::Bytes;
use rigd::uplink::{Ack, Outcome, Producer, ProducerConfig, ProducerStats};
use rigd_drivers::{ClockState, Frame, Media};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::{mpsc, watch};

/// One kind of source on every rig.
#[derive(Clone)]
struct SourceKind {
    name: String,
    hz: f64,
    bytes: usize,
}

struct Args {
    url: String,
    namespace: String,
    rigs: usize,
    kinds: Vec<SourceKind>,
    secs: f64,
    drain_secs: f64,
    max_in_flight: usize,
    /// Each producer on a connection of its own (rigd before it shared one per broker).
    connection_per_producer: bool,
}

/// What one source saw, for the summary and the driver.
#[derive(Default)]
struct Tally {
    topic: String,
    rig: String,
    generated: u64,
    acked: u64,
    already: u64,
    refused: u64,
    /// Frames still unacknowledged when the run ended (queue + window).
    left: u64,
    /// Most frames waiting in the source's queue at once (the spool of a real rig).
    queued_max: usize,
    capture_to_receipt_us: Vec<u32>,
    submit_to_receipt_us: Vec<u32>,
    /// Capture-to-receipt of frames captured before the first disconnect (steady state).
    steady_us: Vec<(i64, u32)>,
}

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

fn parse_args() -> Args {
    let mut args = Args {
        url: "pulsar://127.0.0.1:6650".into(),
        namespace: "public/default".into(),
        rigs: 250,
        // A rig: a 30 fps camera of ~100 KiB JPEGs, 50 Hz audio blocks (48 kHz mono, 20 ms), a
        // 10 Hz GPS and a 100 Hz IMU over serial.
        kinds: parse_profile("camera:30:102400,audio:50:1920,gps:10:80,imu:100:48"),
        secs: 60.0,
        drain_secs: 60.0,
        max_in_flight: rigd::config::PulsarConfig::default().max_in_flight,
        connection_per_producer: false,
    };
    let mut scale = 1.0;
    let mut it = std::env::args().skip(1).filter(|a| a != "--bench");
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .unwrap_or_else(|| usage(&format!("{flag} needs a value")))
        };
        match flag.as_str() {
            "--url" => args.url = value(),
            "--namespace" => args.namespace = value(),
            "--rigs" => args.rigs = value().parse().unwrap_or_else(|_| usage("--rigs")),
            "--profile" => args.kinds = parse_profile(&value()),
            "--rate-scale" => scale = value().parse().unwrap_or_else(|_| usage("--rate-scale")),
            "--secs" => args.secs = value().parse().unwrap_or_else(|_| usage("--secs")),
            "--drain-secs" => {
                args.drain_secs = value().parse().unwrap_or_else(|_| usage("--drain-secs"))
            }
            "--max-in-flight" => {
                args.max_in_flight = value().parse().unwrap_or_else(|_| usage("--max-in-flight"))
            }
            "--connection-per-producer" => args.connection_per_producer = true,
            other => usage(&format!("unknown argument {other}")),
        }
    }
    for k in &mut args.kinds {
        k.hz *= scale;
    }
    args
}

fn parse_profile(s: &str) -> Vec<SourceKind> {
    s.split(',')
        .map(|part| {
            let f: Vec<&str> = part.split(':').collect();
            match f.as_slice() {
                [name, hz, bytes] => SourceKind {
                    name: name.to_string(),
                    hz: hz.parse().unwrap_or_else(|_| usage("profile HZ")),
                    bytes: bytes.parse().unwrap_or_else(|_| usage("profile BYTES")),
                },
                _ => usage("--profile NAME:HZ:BYTES,..."),
            }
        })
        .collect()
}

fn usage(why: &str) -> ! {
    eprintln!("fleet: {why}");
    eprintln!(
        "usage: fleet --url URL --namespace TENANT/NS --rigs N [--profile NAME:HZ:BYTES,...] \
         [--rate-scale X] [--secs S] [--drain-secs S] [--max-in-flight N]"
    );
    std::process::exit(2)
}

fn media_of(kind: &SourceKind) -> Media {
    match kind.name.as_str() {
        n if n.starts_with("camera") => Media::jpeg(1920, 1080),
        n if n.starts_with("audio") => Media::Audio {
            sample_rate: 48_000,
            channels: 1,
            frames: (kind.bytes / 2) as u32,
        },
        _ => Media::Serial { text: false },
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = parse_args();
    // RIGD_LOG=info shows every producer's connection changes (the daemon's own log lines).
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("RIGD_LOG").unwrap_or_else(|_| "error".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
    let (_stop_tx, stop) = watch::channel(false);
    let (go_tx, go) = watch::channel(false);
    let t0 = Instant::now();

    let mut links: Vec<Arc<ProducerStats>> = Vec::new();
    let mut sources = Vec::new();
    // Counts sources that closed their producer: the connection watch ends at the first.
    let closing = Arc::new(AtomicUsize::new(0));
    // `pulsar://h1:p1,h2:p2` (a cluster): every rig gets the whole service URL, as a fleet's
    // configs would, rotated by rig so that the first lookups spread over the brokers (rigd's
    // producer tries the hosts in turn and skips one that failed).
    let (scheme, hosts) = args.url.split_once("://").unwrap_or(("pulsar", &args.url));
    let hosts: Vec<&str> = hosts.split(',').collect();
    let urls: Vec<String> = (0..hosts.len())
        .map(|i| {
            let rotated: Vec<&str> = hosts[i..].iter().chain(&hosts[..i]).copied().collect();
            format!("{scheme}://{}", rotated.join(","))
        })
        .collect();
    for r in 0..args.rigs {
        let rig = format!("rig{r:05}");
        let url = &urls[r % urls.len()];
        let pool = rigd::uplink::Pool::new(None);
        for kind in &args.kinds {
            let topic = format!("persistent://{}/{rig}-{}", args.namespace, kind.name);
            let (ack_tx, acks) = mpsc::unbounded_channel();
            let producer = Producer::spawn(
                ProducerConfig {
                    max_in_flight: args.max_in_flight,
                    // new topics: nothing of an earlier run to look for
                    fresh: true,
                    pool: if args.connection_per_producer {
                        rigd::uplink::Pool::new(None)
                    } else {
                        pool.clone()
                    },
                    ..ProducerConfig::new(
                        url,
                        topic.clone(),
                        rigd::wire::producer_name(&rig, &kind.name),
                        &rig,
                        33,
                    )
                },
                ack_tx,
                stop.clone(),
            );
            links.push(producer.stats().clone());
            let source = Source {
                producer,
                acks,
                kind: kind.clone(),
                media: media_of(kind),
                payload: Bytes::from(vec![0x5a; kind.bytes]),
                go: go.clone(),
                secs: args.secs,
                drain: Duration::from_secs_f64(args.drain_secs),
                closing: closing.clone(),
                tally: Tally {
                    topic,
                    rig: rig.clone(),
                    ..Tally::default()
                },
            };
            sources.push(source);
        }
    }
    let n = links.len();
    eprintln!(
        "fleet: {n} producers spawned in {:.1} s",
        t0.elapsed().as_secs_f64()
    );

    // Connection watch: the first moment all are up, then every stretch with some down, until
    // the first source closes its producer (the end of the run).
    let first_down_ns = Arc::new(AtomicI64::new(i64::MAX));
    let watcher = tokio::spawn(watch_links(
        links.clone(),
        go_tx,
        t0,
        first_down_ns.clone(),
        closing.clone(),
    ));
    let tasks: Vec<_> = sources.into_iter().map(|s| tokio::spawn(s.run())).collect();

    let mut tallies = Vec::with_capacity(n);
    for t in tasks {
        tallies.push(t.await.expect("source task"));
    }
    let _ = watcher.await;
    // Steady state: frames captured more than a second before the first disconnect.
    let steady_before = first_down_ns
        .load(Ordering::Relaxed)
        .saturating_sub(1_000_000_000);

    let (mut capture, mut submit, mut steady) = (Vec::new(), Vec::new(), Vec::new());
    let mut total = Tally::default();
    for t in &mut tallies {
        println!(
            "{{\"topic\":\"{}\",\"rig\":\"{}\",\"generated\":{},\"acked\":{},\"already\":{},\"refused\":{},\"left\":{},\"queued_max\":{}}}",
            t.topic, t.rig, t.generated, t.acked, t.already, t.refused, t.left, t.queued_max
        );
        total.generated += t.generated;
        total.acked += t.acked;
        total.already += t.already;
        total.refused += t.refused;
        total.left += t.left;
        total.queued_max = total.queued_max.max(t.queued_max);
        capture.append(&mut t.capture_to_receipt_us);
        steady.extend(
            t.steady_us
                .iter()
                .filter(|(at, _)| *at < steady_before)
                .map(|(_, us)| *us),
        );
        submit.append(&mut t.submit_to_receipt_us);
    }
    capture.sort_unstable();
    submit.sort_unstable();
    steady.sort_unstable();
    let pct = |v: &[u32], p: f64| -> f64 {
        if v.is_empty() {
            return 0.0;
        }
        v[((v.len() as f64 * p) as usize).min(v.len() - 1)] as f64 / 1e3
    };
    let rate: f64 = args.kinds.iter().map(|k| k.hz).sum::<f64>() * args.rigs as f64;
    let bytes_per_s: f64 = args
        .kinds
        .iter()
        .map(|k| k.hz * k.bytes as f64)
        .sum::<f64>()
        * args.rigs as f64;
    println!(
        "{{\"summary\":true,\"rigs\":{},\"producers\":{n},\"offered_msg_per_s\":{rate:.1},\"offered_mb_per_s\":{:.2},\"secs\":{},\"generated\":{},\"acked\":{},\"already\":{},\"refused\":{},\"left\":{},\"queued_max\":{},\"capture_p50_ms\":{:.2},\"capture_p99_ms\":{:.2},\"capture_p9999_ms\":{:.2},\"capture_max_ms\":{:.2},\"steady_frames\":{},\"steady_p50_ms\":{:.2},\"steady_p99_ms\":{:.2},\"steady_p9999_ms\":{:.2},\"submit_p50_ms\":{:.2},\"submit_p99_ms\":{:.2},\"submit_p9999_ms\":{:.2}}}",
        args.rigs,
        bytes_per_s / 1e6,
        args.secs,
        total.generated,
        total.acked,
        total.already,
        total.refused,
        total.left,
        total.queued_max,
        pct(&capture, 0.5),
        pct(&capture, 0.99),
        pct(&capture, 0.9999),
        capture.last().copied().unwrap_or(0) as f64 / 1e3,
        steady.len(),
        pct(&steady, 0.5),
        pct(&steady, 0.99),
        pct(&steady, 0.9999),
        pct(&submit, 0.5),
        pct(&submit, 0.99),
        pct(&submit, 0.9999),
    );
}

/// Samples every producer's link every 10 ms. Prints `ready` once all are up (and lets the
/// sources start), then one `down` line per stretch during which some were not: how many went
/// down, when the last came back, and the spread of each one's time back (from the stretch's
/// start). A stretch still open at the end of the run is printed with `"unfinished":true`.
async fn watch_links(
    links: Vec<Arc<ProducerStats>>,
    go: watch::Sender<bool>,
    t0: Instant,
    first_down_ns: Arc<AtomicI64>,
    closing: Arc<AtomicUsize>,
) {
    struct Stretch {
        at_ms: u128,
        at: Instant,
        min_up: usize,
        reconnects: u64,
        /// Went down during the stretch.
        went_down: Vec<bool>,
        /// Down at the last sample.
        down: Vec<bool>,
        /// When each came back last (from the stretch's start).
        back: Vec<Option<f64>>,
    }
    let n = links.len();
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let mut ready = false;
    let mut stretch: Option<Stretch> = None;
    let mut events = 0u32;
    let report = |st: &Stretch, events: u32, still_down: usize, reconnects: u64| {
        let mut back: Vec<f64> = st.back.iter().flatten().copied().collect();
        back.sort_by(f64::total_cmp);
        let q = |p: f64| {
            back.get(((back.len() as f64 * p) as usize).min(back.len().saturating_sub(1)))
                .copied()
                .unwrap_or(0.0)
        };
        let went_down = st.went_down.iter().filter(|d| **d).count();
        println!(
            "{{\"event\":\"down\",\"n\":{events},\"down_unix_ms\":{},\"up_unix_ms\":{},\"all_up_after_s\":{:.3},\"unfinished\":{},\"still_down\":{still_down},\"went_down\":{went_down},\"min_connected\":{},\"reconnects\":{},\"back_p50_s\":{:.3},\"back_p90_s\":{:.3},\"back_p99_s\":{:.3}}}",
            st.at_ms,
            unix_ms(),
            st.at.elapsed().as_secs_f64(),
            still_down > 0,
            st.min_up,
            reconnects - st.reconnects,
            q(0.5),
            q(0.9),
            q(0.99),
        );
    };
    loop {
        tick.tick().await;
        let up: Vec<bool> = links
            .iter()
            .map(|s| s.connected.load(Ordering::Acquire))
            .collect();
        let n_up = up.iter().filter(|u| **u).count();
        let reconnects: u64 = links
            .iter()
            .map(|s| s.reconnects.load(Ordering::Relaxed))
            .sum();
        if closing.load(Ordering::Relaxed) > 0 {
            if let Some(st) = &stretch {
                events += 1;
                report(st, events, n - n_up, reconnects);
            }
            return;
        }
        if !ready {
            if n_up == n {
                ready = true;
                let _ = go.send(true);
                println!(
                    "{{\"event\":\"ready\",\"producers\":{n},\"connect_all_s\":{:.3},\"unix_ms\":{}}}",
                    t0.elapsed().as_secs_f64(),
                    unix_ms()
                );
            }
            continue;
        }
        if stretch.is_none() && n_up < n {
            let _ = first_down_ns.compare_exchange(
                i64::MAX,
                rigd_drivers::realtime_ns(),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            stretch = Some(Stretch {
                at_ms: unix_ms(),
                at: Instant::now(),
                min_up: n_up,
                reconnects,
                went_down: vec![false; n],
                down: vec![false; n],
                back: vec![None; n],
            });
        }
        let Some(st) = &mut stretch else { continue };
        st.min_up = st.min_up.min(n_up);
        let after = st.at.elapsed().as_secs_f64();
        for (i, u) in up.iter().enumerate() {
            if !u {
                st.went_down[i] = true;
                st.down[i] = true;
            } else if st.down[i] {
                st.down[i] = false;
                st.back[i] = Some(after);
            }
        }
        if n_up == n {
            events += 1;
            report(st, events, 0, reconnects);
            stretch = None;
        }
    }
}

/// One source of one rig: its frames, its producer, its queue while the producer cannot take.
struct Source {
    producer: Producer,
    acks: mpsc::UnboundedReceiver<Ack>,
    kind: SourceKind,
    media: Media,
    payload: Bytes,
    go: watch::Receiver<bool>,
    secs: f64,
    drain: Duration,
    /// Counts sources that closed their producer (the watch stops at the first).
    closing: Arc<AtomicUsize>,
    tally: Tally,
}

impl Source {
    async fn run(mut self) -> Tally {
        let _ = self.go.wait_for(|g| *g).await;
        let period = Duration::from_secs_f64(1.0 / self.kind.hz.max(1e-3));
        // Rigs are not in phase: each source starts at a random point of its period.
        let phase = period.mul_f64(rand::random::<f64>());
        let start = tokio::time::Instant::now() + phase;
        let end = start + Duration::from_secs_f64(self.secs);
        let mut tick = tokio::time::interval_at(start, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let mut queue: VecDeque<Frame> = VecDeque::new();
        let source: Arc<str> = self.kind.name.as_str().into();
        let mut drain_until = None;
        loop {
            let capturing = drain_until.is_none();
            tokio::select! {
                _ = tick.tick(), if capturing => {
                    if tokio::time::Instant::now() >= end {
                        drain_until = Some(tokio::time::Instant::now() + self.drain);
                    } else {
                        queue.push_back(Frame {
                            source: source.clone(),
                            seq: self.tally.generated,
                            capture_ns: rigd_drivers::realtime_ns(),
                            clock: ClockState::Unsynced,
                            media: self.media.clone(),
                            payload: self.payload.clone(),
                        });
                        self.tally.generated += 1;
                        self.tally.queued_max = self.tally.queued_max.max(queue.len());
                    }
                }
                ack = self.acks.recv() => {
                    if let Some(ack) = ack {
                        self.tally.count(ack);
                    }
                    while let Ok(ack) = self.acks.try_recv() {
                        self.tally.count(ack);
                    }
                }
                _ = self.producer.room() => {}
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
            while let Some(frame) = queue.pop_front() {
                if let Err(frame) = self.producer.try_submit(frame.into()) {
                    queue.push_front(frame.frame);
                    break;
                }
            }
            if let Some(until) = drain_until {
                let settled = self.tally.acked + self.tally.already + self.tally.refused;
                if settled == self.tally.generated || tokio::time::Instant::now() >= until {
                    break;
                }
            }
        }
        self.closing.fetch_add(1, Ordering::Relaxed);
        let left = self.producer.close().await;
        while let Ok(ack) = self.acks.try_recv() {
            self.tally.count(ack);
        }
        self.tally.left = (left.len() + queue.len()) as u64;
        self.tally
    }
}

impl Tally {
    fn count(&mut self, ack: Ack) {
        match ack.outcome {
            Outcome::Persisted => self.acked += 1,
            Outcome::AlreadyPersisted => self.already += 1,
            Outcome::Refused(_) => self.refused += 1,
        }
        let capture = (rigd_drivers::realtime_ns() - ack.capture_ns).max(0) / 1000;
        let capture = capture.min(u32::MAX as i64) as u32;
        self.capture_to_receipt_us.push(capture);
        self.steady_us.push((ack.capture_ns, capture));
        self.submit_to_receipt_us
            .push(ack.latency.as_micros().min(u32::MAX as u128) as u32);
    }
}
