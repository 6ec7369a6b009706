//! The link's capacity, estimated from rigd's own sends and the broker's receipts
//! (`pulsar.max-bandwidth = "auto"`): a delay-based estimator in the family of BBR, LEDBAT and
//! GCC. Pure: time is an input, no clock, lock or socket.
//!
//! Inputs, per SEND: its size on the wire, when its last byte was written to the socket, and when
//! its receipt came ([`Estimator::on_receipt`]). From them:
//! - the **delivery rate**: bytes receipted between the receipt that came last before the SEND
//!   was written and this receipt, over that time (BBR's rate sample), over at least
//!   [`MIN_SAMPLE`] so that a few large SENDs do not make it jump;
//! - the **base RTT**: the smallest write-to-receipt time of the last [`BASE_WINDOW`] (the link
//!   and the broker's own persist time, no queue);
//! - the **queueing delay**: the smallest write-to-receipt time of the last [`RECENT`] less the
//!   base, i.e. how long bytes wait in the socket's buffer and the modem's queue now.
//!
//! The estimate is the largest delivery rate of the last [`BW_WINDOW`]; the budget paces at the
//! estimate times a gain ([`Estimator::pacing`]):
//! - `Cruise`: 1.0, and every [`PROBE_EVERY`] a `Probe` round at [`PROBE_GAIN`] (more capacity
//!   shows as a higher delivery rate), then a `Drain` round at [`DRAIN_GAIN`] that empties what the
//!   probe queued;
//! - `Grow`: a probe that raised the estimate by [`GREW`] or more is followed at once by rounds at
//!   [`GROW_GAIN`] while the estimate keeps growing (the start, and a link that got faster: 2 -> 8
//!   Mbit/s in a few seconds rather than a 25 % step every few seconds);
//! - `Backoff`: the queueing delay above `target` where the link holds it (a link that got
//!   slower, or an estimate above it): the estimate drops to the delivery rate measured now (a
//!   busy link delivers its capacity; the cut and the first sample after it at most halve it
//!   each, [`MAX_CUT`]), the
//!   samples of SENDs written before the cut are ignored, and the budget paces at
//!   [`BACKOFF_GAIN`] of the lesser of the estimate and that delivery rate (unbounded by
//!   [`MAX_CUT`]: the queue drains from the cut on) until the delay is below half the target (the
//!   queue drained), then cruises. Still above the target a round and an RTT later: cut again.
//!
//! Receipts late while the connection's kernel sees no queue on the path ([`Queued`]: its
//! smoothed RTT at its smallest, nothing waiting in the socket) are a broker slow to answer (its
//! JVM starved, its disk slow), not a link's queue: the estimate is not cut
//! ([`Reading::broker_delays`] counts them). A cut for them cascaded in a loaded CI run (8.6 -> 1.3
//! Mbit/s, regrown only by probes) and paced the rig at a fraction of a link with nothing queued.
//!
//! A sample whose interval had every writer of the link idle, nothing to write
//! ([`Estimator::writer`]), for [`APP_LIMITED`] of it or more is app-limited: it counts only above
//! the estimate (BBR's rule), so a link that carried little, or bursts with idle time between
//! them, keeps what it was seen to carry. A writer that waits for the budget or for the socket is
//! busy: its samples measure the link.
//!
//! A round is [`ROUND`], the base RTT plus the target, and two of the largest recent SENDs' writes
//! at the estimate (each counted up to [`MAX_SEND_TIME`]: a SEND's sample covers its whole write),
//! whichever is longest. The estimate and the pacing stay within `[min, max]` (`max`:
//! `max-bandwidth-cap`).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

pub use rigd_drivers::tcp::Queued;

/// Delivery rate samples are taken over at least this long.
pub const MIN_SAMPLE: Duration = Duration::from_millis(500);
/// The base RTT is the smallest of this long.
pub const BASE_WINDOW: Duration = Duration::from_secs(10);
/// The current RTT is the smallest of this long (one late receipt is no queue).
pub const RECENT: Duration = Duration::from_millis(100);
/// The estimate is the largest delivery rate of this long.
pub const BW_WINDOW: Duration = Duration::from_secs(4);
/// A cruise probes for more after this long.
pub const PROBE_EVERY: Duration = Duration::from_secs(2);
/// The shortest round (probe, drain, growth step).
pub const ROUND: Duration = Duration::from_millis(300);
/// Rounds span two of the largest recent SENDs' writes, each counted up to this long: at an
/// estimate far below the link (a cold start cut down by a loaded broker's late receipts: 305
/// kbit/s in one CI run) a 200 kB SEND is 5 s, and growth at such rounds took most of a minute.
pub const MAX_SEND_TIME: Duration = Duration::from_millis(500);
pub const PROBE_GAIN: f64 = 1.25;
pub const GROW_GAIN: f64 = 1.4;
pub const DRAIN_GAIN: f64 = 0.8;
pub const BACKOFF_GAIN: f64 = 0.5;
/// A backoff below the target (not yet half of it) ends after this many rounds.
pub const BACKOFF_ROUNDS: u32 = 4;
/// Between probes: a little below the estimate, so that what a probe queued drains.
pub const CRUISE_GAIN: f64 = 0.95;
/// A probe or growth round that raised the estimate by this factor grows on.
pub const GREW: f64 = 1.1;
/// A cut, and the first sample after it, at most halve the estimate each: a stall's sample (no
/// receipt for a while: a broker's pause, a starved host) is no measure of the link. A link that
/// did fall further is cut again when its queue still stands after the backoff.
pub const MAX_CUT: f64 = 0.5;
/// A rate sample is app-limited when every writer was idle for this share of its interval or more
/// (the moments between a producer's turns, when its writer has written what it was given, are
/// not).
pub const APP_LIMITED: f64 = 0.1;
/// The default queueing delay target.
pub const TARGET: Duration = Duration::from_millis(120);

/// Receipts kept for rate samples.
const HISTORY: Duration = Duration::from_secs(10);

/// What the estimator is given at start.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Bytes per second before the first sample.
    pub start: f64,
    /// The least it paces at, bytes per second.
    pub min: f64,
    /// The most (the cap), bytes per second.
    pub max: f64,
    /// Queueing delay above this: back off.
    pub target: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Grow,
    Cruise,
    Probe,
    Drain,
    Backoff,
}

impl Mode {
    pub fn name(&self) -> &'static str {
        match self {
            Mode::Grow => "grow",
            Mode::Cruise => "cruise",
            Mode::Probe => "probe",
            Mode::Drain => "drain",
            Mode::Backoff => "backoff",
        }
    }
}

/// What status shows of the estimate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    /// The link's estimated capacity, bytes per second.
    pub estimate: f64,
    /// What the budget paces at now, bytes per second.
    pub pacing: f64,
    /// The smallest write-to-receipt time of the last [`BASE_WINDOW`] (None: no receipt yet).
    pub base_rtt: Option<Duration>,
    /// The current write-to-receipt time less the base.
    pub queueing: Duration,
    pub mode: Mode,
    /// Times the receipts came later than the target while the connection's kernel saw no
    /// queue on the path: a broker slow to answer, no cut.
    pub broker_delays: u64,
    /// The queue the kernel saw on the path at the last late receipt (None: none late yet).
    pub path_queue: Option<Duration>,
}

/// The estimator. Pure.
#[derive(Debug)]
pub struct Estimator {
    s: Settings,
    /// Each receipt's (time, bytes receipted so far, the writers' idle time so far) of the last
    /// [`HISTORY`] (the newest is never dropped: [`Estimator::delivered`]).
    history: VecDeque<(Instant, u64, Duration)>,
    /// Write-to-receipt times, as monotonic deques: smallest first.
    base: MinWindow,
    recent: MinWindow,
    /// Delivery rate samples, largest first.
    bw: MaxWindow,
    /// SEND sizes of the last [`BW_WINDOW`], largest first: a round lasts as long as two of the
    /// largest take to write ([`Estimator::round`]).
    sends: MaxWindow,
    /// A rate sample came since the mode began (a growth round without one judges nothing).
    sampled: bool,
    /// The link's writers that have something to write (each connection's, [`Estimator::writer`]).
    writers: usize,
    /// Since when none has (None: one has), and how long none had before: samples of an
    /// interval idle for [`APP_LIMITED`] of it are app-limited (the link carried what it was
    /// given, not what it can).
    idle_since: Option<Instant>,
    idle: Duration,
    estimate: f64,
    mode: Mode,
    /// When the mode began, and the estimate then.
    since: Instant,
    estimate_then: f64,
    /// The last cut: samples of SENDs written before it are ignored.
    cut: Option<Instant>,
    /// A sample of a SEND written since the last cut came.
    fresh: bool,
    /// What the link delivered when the last cut came (unbounded by [`MAX_CUT`]): a backoff
    /// paces below it.
    drain: f64,
    queueing: Duration,
    /// The receipts are late but the path holds no queue ([`Queued`]): no cut.
    broker_late: bool,
    broker_delays: u64,
    path_queue: Option<Duration>,
}

impl Estimator {
    pub fn new(s: Settings, now: Instant) -> Self {
        let estimate = s.start.clamp(s.min, s.max);
        Estimator {
            s,
            history: VecDeque::new(),
            base: MinWindow::min(BASE_WINDOW),
            recent: MinWindow::min(RECENT),
            bw: MaxWindow::max(BW_WINDOW),
            sends: MaxWindow::max(BW_WINDOW),
            sampled: false,
            writers: 0,
            idle_since: Some(now),
            idle: Duration::ZERO,
            estimate,
            mode: Mode::Grow,
            since: now,
            estimate_then: estimate,
            cut: None,
            fresh: true,
            drain: estimate,
            queueing: Duration::ZERO,
            broker_late: false,
            broker_delays: 0,
            path_queue: None,
        }
    }

    /// A receipt for a SEND of `bytes` whose last byte was written at `written`; `path`: where the
    /// connection's kernel sees its bytes wait now, asked only when the receipt is late.
    pub fn on_receipt(
        &mut self,
        bytes: usize,
        written: Instant,
        now: Instant,
        path: impl FnOnce() -> Option<Queued>,
    ) {
        // Write to receipt, less the SEND's own time on a link of the estimated rate: what is
        // left is the link's and the broker's latency and the wait behind other bytes (a large
        // SEND's own transmission is no queue, and it grows as the link slows).
        let own = Duration::from_secs_f64(bytes as f64 / self.estimate.max(1.0));
        let rtt = now.saturating_duration_since(written).saturating_sub(own);
        // The last receipt before the SEND was written, and at least MIN_SAMPLE ago.
        let bound = now
            .checked_sub(MIN_SAMPLE)
            .map_or(written, |b| b.min(written));
        let before = self
            .history
            .partition_point(|(t, _, _)| *t <= bound)
            .checked_sub(1)
            .and_then(|i| self.history.get(i).copied());
        let delivered = self.delivered() + bytes as u64;
        let idle = self.idle_so_far(now);
        self.history.push_back((now, delivered, idle));
        while self
            .history
            .front()
            .is_some_and(|(t, _, _)| now.saturating_duration_since(*t) > HISTORY)
        {
            self.history.pop_front();
        }
        self.base.push(now, rtt);
        self.recent.push(now, rtt);
        self.sends.push(now, bytes as f64);
        if let (Some(base), Some(current)) = (self.base.get(now), self.recent.get(now)) {
            self.queueing = current.saturating_sub(base);
        }
        self.judge_lateness(path);
        let fresh = self.cut.is_none_or(|c| written >= c);
        if let Some((t0, d0, idle0)) = before.filter(|_| fresh) {
            let secs = now.saturating_duration_since(t0).as_secs_f64();
            if secs > 0.0 {
                let rate = (delivered - d0) as f64 / secs;
                if self.mode == Mode::Backoff && !self.fresh {
                    // The first sample of the link since the cut replaces the cut's guess: while
                    // the queue drains, the link is busy and delivers its capacity.
                    self.fresh = true;
                    self.bw.reset(now, rate.max(self.estimate * MAX_CUT));
                } else if (idle - idle0).as_secs_f64() < APP_LIMITED * secs
                    || rate > self.bw.get(now).unwrap_or(self.estimate)
                {
                    // An app-limited sample (every writer idle for a share of its interval: its
                    // rate counts idle time) only counts when it is more than the estimate: a
                    // link that carried little keeps what it was last seen to carry (BBR's
                    // rule), and one that has carried nothing yet keeps its start.
                    self.bw.push(now, rate);
                }
                self.sampled = true;
                self.estimate = self
                    .bw
                    .get(now)
                    .unwrap_or(self.estimate)
                    .clamp(self.s.min, self.s.max);
            }
        }
        self.advance(now);
    }

    /// Receipts later than the target: where did their bytes wait? A path whose kernel sees less
    /// than half the target queued (its smoothed RTT over its smallest, and what waits unsent in
    /// the socket at the estimate) holds no queue: the broker was slow to answer. A backoff
    /// under way is a queue already seen: not asked again.
    fn judge_lateness(&mut self, path: impl FnOnce() -> Option<Queued>) {
        let was = self.broker_late;
        self.broker_late = false;
        if self.queueing <= self.s.target || self.mode == Mode::Backoff {
            return;
        }
        let Some(q) = path() else { return };
        let queued =
            q.rtt_over_min + Duration::from_secs_f64(q.notsent as f64 / self.estimate.max(1.0));
        self.path_queue = Some(queued);
        self.broker_late = queued <= self.s.target / 2;
        if self.broker_late && !was {
            self.broker_delays += 1;
        }
    }

    /// One of the link's writers has something to write from now (`busy`; waiting for the budget
    /// or the socket counts), or nothing left (every `true` is followed by a `false`).
    pub fn writer(&mut self, busy: bool, now: Instant) {
        if busy {
            if let Some(since) = self.idle_since.take() {
                self.idle += now.saturating_duration_since(since);
            }
            self.writers += 1;
        } else {
            self.writers = self.writers.saturating_sub(1);
            if self.writers == 0 {
                self.idle_since = Some(now);
            }
        }
    }

    /// How long every writer was idle, in all, up to `now`.
    fn idle_so_far(&self, now: Instant) -> Duration {
        self.idle
            + self
                .idle_since
                .map_or(Duration::ZERO, |s| now.saturating_duration_since(s))
    }

    /// Bytes per second receipted over the last `span` (None: no receipt that long ago).
    fn recent_rate(&self, now: Instant, span: Duration) -> Option<f64> {
        let from = now.checked_sub(span)?;
        let i = self
            .history
            .partition_point(|(t, _, _)| *t <= from)
            .checked_sub(1)?;
        let (t0, d0, _) = self.history[i];
        let secs = now.saturating_duration_since(t0).as_secs_f64();
        (secs > 0.0).then(|| (self.delivered() - d0) as f64 / secs)
    }

    /// Bytes receipted so far.
    fn delivered(&self) -> u64 {
        self.history.back().map_or(0, |(_, d, _)| *d)
    }

    /// How long the largest recent SEND takes to write at the estimate: a SEND's rate sample
    /// covers its whole write, so a round that changes the pace must span whole SENDs to see
    /// its own effect (a 200 kB camera frame is 0.8 s at 2 Mbit/s).
    fn send_time(&mut self, now: Instant) -> Duration {
        let largest = self.sends.get(now).unwrap_or(0.0);
        Duration::from_secs_f64(largest / self.estimate.max(1.0)).min(MAX_SEND_TIME)
    }

    /// The rounds' length now: at least [`ROUND`], the base RTT and the target, and two of the
    /// largest recent SENDs' writes.
    fn round(&mut self, now: Instant) -> Duration {
        let writes = self.send_time(now) * 2;
        ROUND
            .max(self.base.get(now).unwrap_or_default() + self.s.target)
            .max(writes)
    }

    /// A growth round: long enough for a rate sample of its own ([`MIN_SAMPLE`], or two of the
    /// largest SENDs' writes, and the RTT).
    fn growth_round(&mut self, now: Instant) -> Duration {
        let writes = self.send_time(now) * 2;
        MIN_SAMPLE.max(writes) + self.base.get(now).unwrap_or_default()
    }

    fn enter(&mut self, mode: Mode, now: Instant) {
        // A drain after a probe still judges the probe: its samples come a round late.
        if !(mode == Mode::Drain && self.mode == Mode::Probe) {
            self.estimate_then = self.estimate;
        }
        self.mode = mode;
        self.since = now;
        self.sampled = false;
    }

    /// The modes' clock: called with every receipt and every look at the pacing.
    fn advance(&mut self, now: Instant) {
        let round = self.round(now);
        let elapsed = now.saturating_duration_since(self.since);
        if self.queueing > self.s.target && !self.broker_late {
            if self.mode != Mode::Backoff {
                // The link delivers its capacity while a queue stands: what it delivered over the
                // last round says it, unless the latest sample says less.
                let now_rate = self
                    .recent_rate(now, round)
                    .unwrap_or(self.estimate)
                    .min(self.bw.latest().unwrap_or(self.estimate));
                // The drain paces below what the link delivers now, even where the estimate's
                // cut is held to half: the queue empties from the cut on, not a round later.
                self.drain = now_rate.clamp(self.s.min, self.s.max);
                self.estimate = now_rate
                    .min(self.estimate)
                    .max(self.estimate * MAX_CUT)
                    .clamp(self.s.min, self.s.max);
                self.bw.reset(now, self.estimate);
                self.cut = Some(now);
                self.fresh = false;
                self.enter(Mode::Backoff, now);
            }
            return;
        }
        let grew = self.estimate >= self.estimate_then * GREW;
        let growth_round = self.growth_round(now);
        match self.mode {
            // Drained; or below the target for a while (what stays is not a queue).
            Mode::Backoff
                if self.queueing <= self.s.target / 2 || elapsed >= round * BACKOFF_ROUNDS =>
            {
                self.enter(Mode::Cruise, now)
            }
            Mode::Cruise if elapsed >= PROBE_EVERY => self.enter(Mode::Probe, now),
            Mode::Probe if elapsed >= round => self.enter(Mode::Drain, now),
            // A growth round without a sample (nothing to send yet: the start of a link that
            // carries nothing) says nothing of the link: growth goes on.
            Mode::Grow if elapsed >= growth_round && self.sampled => {
                let next = if grew { Mode::Grow } else { Mode::Drain };
                self.enter(next, now);
            }
            Mode::Drain if grew => self.enter(Mode::Grow, now),
            Mode::Drain if elapsed >= round => self.enter(Mode::Cruise, now),
            _ => {}
        }
    }

    /// Bytes per second the budget is to pace at now.
    pub fn pacing(&mut self, now: Instant) -> f64 {
        self.advance(now);
        let gain = match self.mode {
            Mode::Grow => GROW_GAIN,
            Mode::Probe => PROBE_GAIN,
            Mode::Cruise => CRUISE_GAIN,
            Mode::Drain => DRAIN_GAIN,
            Mode::Backoff => BACKOFF_GAIN,
        };
        let base = match self.mode {
            Mode::Backoff => self.estimate.min(self.drain),
            _ => self.estimate,
        };
        (base * gain).clamp(self.s.min, self.s.max)
    }

    pub fn reading(&mut self, now: Instant) -> Reading {
        let pacing = self.pacing(now);
        Reading {
            estimate: self.estimate,
            pacing,
            base_rtt: self.base.get(now),
            queueing: self.queueing,
            mode: self.mode,
            broker_delays: self.broker_delays,
            path_queue: self.path_queue,
        }
    }
}

/// The best value of a sliding window (a monotonic deque): the smallest ([`Extreme::min`]) or
/// the largest ([`Extreme::max`]), and the latest value pushed (always the deque's back).
#[derive(Debug)]
struct Extreme<T> {
    span: Duration,
    q: VecDeque<(Instant, T)>,
    /// `v` is at least as good as `b`: `b` can never be the window's best again.
    at_least: fn(&T, &T) -> bool,
}

type MinWindow = Extreme<Duration>;
type MaxWindow = Extreme<f64>;

impl Extreme<Duration> {
    fn min(span: Duration) -> Self {
        Extreme::new(span, |v, b| v <= b)
    }
}

impl Extreme<f64> {
    fn max(span: Duration) -> Self {
        Extreme::new(span, |v, b| v >= b)
    }
}

impl<T: Copy> Extreme<T> {
    fn new(span: Duration, at_least: fn(&T, &T) -> bool) -> Self {
        Extreme {
            span,
            q: VecDeque::new(),
            at_least,
        }
    }

    fn push(&mut self, now: Instant, v: T) {
        while self.q.back().is_some_and(|(_, b)| (self.at_least)(&v, b)) {
            self.q.pop_back();
        }
        self.q.push_back((now, v));
    }

    /// The best of the window; the latest value when the window holds nothing newer.
    fn get(&mut self, now: Instant) -> Option<T> {
        while self.q.len() > 1
            && self
                .q
                .front()
                .is_some_and(|(t, _)| now.saturating_duration_since(*t) > self.span)
        {
            self.q.pop_front();
        }
        self.q.front().map(|(_, v)| *v)
    }

    fn latest(&self) -> Option<T> {
        self.q.back().map(|(_, v)| *v)
    }

    /// Forgets every sample: `v` is the window's value from now.
    fn reset(&mut self, now: Instant, v: T) {
        self.q.clear();
        self.q.push_back((now, v));
    }
}

/// Which SENDs of a producer's connection wait for their receipt, and since when their last byte
/// was written (the estimator's per-SEND timing). The producer notes each SEND as it is encoded
/// (its end in the connection's byte stream for this producer), the bytes the connection wrote,
/// and each receipt or refusal (one per SEND, in order). Pure.
#[derive(Debug, Default)]
pub struct Sends {
    /// (end offset, bytes, written at).
    q: VecDeque<(u64, usize, Option<Instant>)>,
    /// How many SENDs at the front of `q` have their write time (those written whole): a write
    /// looks only at the ones behind them.
    stamped: usize,
    /// Bytes of SENDs noted so far (the next SEND's start).
    end: u64,
}

impl Sends {
    /// A SEND of `bytes` is queued behind the others.
    pub fn sent(&mut self, bytes: usize) {
        self.end += bytes as u64;
        self.q.push_back((self.end, bytes, None));
    }

    /// The connection wrote `total` bytes of this producer so far, at `now`.
    pub fn wrote(&mut self, total: u64, now: Instant) {
        for (end, _, at) in self.q.range_mut(self.stamped..) {
            if *end > total {
                break;
            }
            *at = Some(now);
            self.stamped += 1;
        }
    }

    /// The next SEND's receipt (or refusal): its size and when its last byte was written (None
    /// when nothing was waiting for one, or its write was not seen whole).
    pub fn answered(&mut self) -> Option<(usize, Instant)> {
        let (_, bytes, at) = self.q.pop_front()?;
        self.stamped = self.stamped.saturating_sub(1);
        Some((bytes, at?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MBIT: f64 = 1e6 / 8.0;

    /// A simulated bottleneck: a sender paced by the estimator (a token bucket at its pacing, as
    /// the budget is), always with data (or at `demand` bytes/s), SENDs of `send` bytes, a
    /// drop-tail queue of `queue` bytes that holds the writer back when full (the socket's buffer
    /// and the modem's queue), served at the capacity of the moment, a receipt `base` after a
    /// SEND leaves the queue. 1 ms steps.
    struct Sim {
        est: Estimator,
        t0: Instant,
        now: Instant,
        tokens: f64,
        backlog: f64,
        /// SENDs of this many bytes...
        send: usize,
        /// ...written in pieces as the tokens allow (the budget's grants); what is left of the
        /// one being written.
        writing: usize,
        queue: VecDeque<Piece>,
        queued: usize,
        head_left: f64,
        receipts: VecDeque<(Instant, usize, Instant)>,
        /// Demand in bursts instead: (bytes, every so many seconds), the first at once.
        bursts: Option<(f64, f64)>,
        next_burst: f64,
        /// The writer has something to write (told to the estimator as it changes).
        busy: bool,
        /// The broker stalls its receipts (not its reads) for `.1` s every `.0` s from `.2` s on:
        /// a receipt due in a stall comes at its end.
        stalls: Option<(f64, f64, f64)>,
        /// The kernel's view of the path is given (the queue's oldest byte's wait); false: none.
        kernel: bool,
        /// (secs, capacity, estimate, pacing, queueing delay of a SEND leaving the queue).
        trace: Vec<(f64, f64, f64, f64, f64)>,
        delivered: Vec<(f64, usize)>,
    }

    /// A piece in the link's queue: (bytes, queued at, the SEND's size and the write of its last
    /// byte when this piece ends it, bytes left to serve).
    type Piece = (usize, Instant, Option<(usize, Instant)>, f64);

    const SEND: usize = 30_000;
    /// A grant of the budget, a write to the socket.
    const PIECE: usize = 16_384;
    const QUEUE: usize = 500_000;
    const BASE: Duration = Duration::from_millis(30);

    impl Sim {
        fn new(start: f64) -> Self {
            let t0 = Instant::now();
            Sim {
                est: Estimator::new(
                    Settings {
                        start,
                        min: 8_000.0,
                        max: 1e9,
                        target: TARGET,
                    },
                    t0,
                ),
                t0,
                now: t0,
                tokens: 0.0,
                backlog: 0.0,
                send: SEND,
                writing: 0,
                queue: VecDeque::new(),
                queued: 0,
                head_left: 0.0,
                receipts: VecDeque::new(),
                bursts: None,
                next_burst: 0.0,
                busy: false,
                stalls: None,
                kernel: true,
                trace: Vec::new(),
                delivered: Vec::new(),
            }
        }

        fn run(&mut self, secs: f64, capacity: f64, demand: Option<f64>) {
            let dt = 0.001;
            let steps = (secs / dt) as usize;
            let mut last_delay = 0.0;
            for _ in 0..steps {
                self.now += Duration::from_millis(1);
                let now = self.now;
                // What the kernel sees: the wait of the queue's oldest byte (TCP's RTT grows
                // with the queue; the broker's pace is not in it).
                let path = self.kernel.then(|| Queued {
                    rtt_over_min: self
                        .queue
                        .front()
                        .map_or(Duration::ZERO, |p| now.saturating_duration_since(p.1)),
                    notsent: 0,
                });
                while self.receipts.front().is_some_and(|r| r.0 <= now) {
                    let (_, bytes, written) = self.receipts.pop_front().unwrap();
                    self.est.on_receipt(bytes, written, now, || path);
                }
                let pacing = self.est.pacing(now);
                self.tokens = (self.tokens + pacing * dt).min((pacing / 10.0).max(16384.0));
                let secs = now.duration_since(self.t0).as_secs_f64();
                self.backlog = match (self.bursts, demand) {
                    (Some((bytes, every)), _) if secs >= self.next_burst => {
                        self.next_burst += every;
                        self.backlog + bytes
                    }
                    (Some(_), _) => self.backlog,
                    (None, Some(d)) => self.backlog + d * dt,
                    (None, None) => f64::MAX,
                };
                while self.tokens > 0.0 && self.queued + PIECE <= QUEUE {
                    if self.writing == 0 {
                        if self.backlog < self.send as f64 {
                            break;
                        }
                        self.backlog -= self.send as f64;
                        self.writing = self.send;
                    }
                    let piece = PIECE.min(self.writing);
                    self.tokens -= piece as f64;
                    self.writing -= piece;
                    let last = (self.writing == 0).then_some((self.send, now));
                    self.queue.push_back((piece, now, last, piece as f64));
                    self.queued += piece;
                }
                let busy = self.writing > 0 || self.backlog >= self.send as f64;
                if busy != self.busy {
                    self.busy = busy;
                    self.est.writer(busy, now);
                }
                let mut budget = capacity * dt + self.head_left;
                self.head_left = 0.0;
                while let Some(front) = self.queue.front_mut() {
                    if budget >= front.3 {
                        budget -= front.3;
                        let (bytes, queued_at, last, _) = self.queue.pop_front().unwrap();
                        self.queued -= bytes;
                        last_delay = now.saturating_duration_since(queued_at).as_secs_f64();
                        if let Some((send, written)) = last {
                            let at = self.receipt_due(now + BASE);
                            self.receipts.push_back((at, send, written));
                        }
                        self.delivered
                            .push((now.duration_since(self.t0).as_secs_f64(), bytes));
                    } else {
                        front.3 -= budget;
                        break;
                    }
                }
                let r = self.est.reading(now);
                self.trace.push((
                    now.duration_since(self.t0).as_secs_f64(),
                    capacity,
                    r.estimate,
                    r.pacing,
                    last_delay,
                ));
            }
        }

        /// When a receipt due at `due` comes: at the end of the broker's stall it falls in.
        fn receipt_due(&self, due: Instant) -> Instant {
            let Some((every, len, from)) = self.stalls else {
                return due;
            };
            let secs = due.duration_since(self.t0).as_secs_f64();
            if secs < from {
                return due;
            }
            let into = (secs - from) % every;
            if into < len {
                due + Duration::from_secs_f64(len - into)
            } else {
                due
            }
        }

        fn dump(&self) {
            if std::env::var("ESTIMATE_TRACE").is_err() {
                return;
            }
            for x in self.trace.iter().step_by(100) {
                println!(
                    "{:6.2} cap {:5.2} est {:5.2} pace {:5.2} qdelay {:4.0} ms",
                    x.0,
                    x.1 / MBIT,
                    x.2 / MBIT,
                    x.3 / MBIT,
                    x.4 * 1e3
                );
            }
        }

        /// The lowest estimate between `a` and `b` seconds.
        fn lowest(&self, a: f64, b: f64) -> f64 {
            self.trace
                .iter()
                .filter(|x| x.0 >= a && x.0 < b)
                .map(|x| x.2)
                .fold(f64::MAX, f64::min)
        }

        fn delivered_between(&self, a: f64, b: f64) -> f64 {
            self.delivered
                .iter()
                .filter(|(t, _)| *t >= a && *t < b)
                .map(|(_, n)| *n as f64)
                .sum()
        }

        /// The first time from `a` after which the estimate stays within 20 % of the capacity
        /// until `b`.
        fn converged(&self, a: f64, b: f64) -> Option<f64> {
            let mut since = None;
            for &(t, c, e, _, _) in self.trace.iter().filter(|x| x.0 >= a && x.0 < b) {
                if (e - c).abs() <= 0.2 * c {
                    since.get_or_insert(t);
                } else {
                    since = None;
                }
            }
            since.map(|t| t - a)
        }

        fn delay_p95(&self, a: f64, b: f64) -> f64 {
            let mut d: Vec<f64> = self
                .trace
                .iter()
                .filter(|x| x.0 >= a && x.0 < b)
                .map(|x| x.4)
                .collect();
            d.sort_by(f64::total_cmp);
            d.get(d.len() * 95 / 100).copied().unwrap_or(0.0)
        }
    }

    #[test]
    fn steps_8_2_8_mbit_converge_within_10_s_with_the_queue_bounded_and_the_link_used() {
        let mut sim = Sim::new(MBIT);
        let phases = [(8.0, 20.0), (2.0, 20.0), (8.0, 20.0)];
        for (mbit, secs) in phases {
            sim.run(secs, mbit * MBIT, None);
        }
        sim.dump();
        let mut t = 0.0;
        for (mbit, secs) in phases {
            let conv = sim.converged(t, t + secs);
            let used = sim.delivered_between(t + 2.0, t + secs) / ((secs - 2.0) * mbit * MBIT);
            let p95 = sim.delay_p95(t + 5.0, t + secs);
            println!(
                "{mbit} Mbit/s: converged after {conv:?} s, used {:.0} %, queueing p95 {:.0} ms",
                used * 100.0,
                p95 * 1e3
            );
            assert!(conv.is_some_and(|c| c < 10.0), "{mbit}: {conv:?}");
            assert!(used >= 0.85, "{mbit}: used {used}");
            assert!(p95 < 0.3, "{mbit}: queueing p95 {p95}");
            t += secs;
        }
    }

    #[test]
    fn a_stall_of_the_receipts_costs_at_most_three_quarters_of_the_estimate_and_a_few_seconds() {
        // 8 Mbit/s, then 1.5 s in which nothing is delivered (a broker's GC pause, a starved
        // host: no receipt), then 8 Mbit/s again. Before MAX_CUT the cut took the stall's rate
        // sample, the floor (64 kbit/s), and growth took 10 s and more to come back.
        let mut sim = Sim::new(MBIT);
        sim.run(10.0, 8.0 * MBIT, None);
        sim.run(1.5, 0.0, None);
        sim.run(15.0, 8.0 * MBIT, None);
        sim.dump();
        let lowest = sim.lowest(10.0, f64::MAX);
        assert!(lowest >= 2.0 * MBIT, "fell to {} Mbit/s", lowest / MBIT);
        let conv = sim.converged(11.5, 26.5);
        assert!(
            conv.is_some_and(|c| c < 6.0),
            "back within 20 % after {conv:?} s"
        );
    }

    #[test]
    fn receipts_late_while_the_path_holds_no_queue_cut_nothing() {
        // 6 Mbit/s of demand on an 8 Mbit/s link; from 10 s on the broker holds its receipts
        // 0.6 s every 3 s (its JVM starved, its disk slow) while it reads on: nothing waits on
        // the path. Asked, the kernel says so: no cut. Without its view the same stalls cut the
        // estimate each time (at most in half, `MAX_CUT`), and the backoff paces at the floor.
        let run = |kernel: bool| {
            let mut sim = Sim::new(MBIT);
            sim.kernel = kernel;
            sim.stalls = Some((3.0, 0.6, 10.0));
            sim.run(40.0, 8.0 * MBIT, Some(6.0 * MBIT));
            sim.dump();
            let before = sim.lowest(8.0, 10.0);
            let during = sim.lowest(10.0, 40.0);
            let used = sim.delivered_between(10.0, 40.0) / (30.0 * 6.0 * MBIT);
            let r = sim.est.reading(sim.now);
            println!(
                "kernel {kernel}: estimate {:.2} before, lowest {:.2} Mbit/s during the stalls, \
                 {:.0} % of the demand carried, {} broker delays, path {:?}",
                before / MBIT,
                during / MBIT,
                used * 100.0,
                r.broker_delays,
                r.path_queue
            );
            (before, during, used, r.broker_delays)
        };
        let (before, during, used, delays) = run(true);
        assert!(before >= 5.5 * MBIT, "{}", before / MBIT);
        assert!(during >= 0.9 * before, "fell to {} Mbit/s", during / MBIT);
        assert!(used >= 0.97, "{used}");
        assert!(delays >= 9, "{delays} of 10 stalls judged the broker's");
        let (_, blind, _, blind_delays) = run(false);
        assert!(
            blind < 0.6 * before,
            "without the kernel's view: {}",
            blind / MBIT
        );
        assert_eq!(blind_delays, 0);
    }

    #[test]
    fn an_app_limited_sender_keeps_its_estimate_near_what_it_sends_and_no_queue() {
        // 7 Mbit/s of demand on an 8 Mbit/s link: the estimate follows the demand (it cannot see
        // more than it sends), nothing queues.
        let mut sim = Sim::new(MBIT);
        sim.run(30.0, 8.0 * MBIT, Some(7.0 * MBIT));
        let used = sim.delivered_between(10.0, 30.0) / (20.0 * 7.0 * MBIT);
        assert!(used >= 0.97, "{used}");
        assert!(
            sim.delay_p95(10.0, 30.0) < 0.1,
            "{}",
            sim.delay_p95(10.0, 30.0)
        );
        let e = sim.trace.last().unwrap().2;
        assert!((6.5 * MBIT..=9.6 * MBIT).contains(&e), "{}", e / MBIT);
    }

    #[test]
    fn large_sends_grow_the_estimate_as_small_ones_do() {
        // A camera's frames as SENDs of 200 kB (a 1080p MJPEG frame; a chunk), each written in
        // the budget's grants over most of a second at the 2 Mbit/s start, on a 12 Mbit/s link
        // with a demand that never ends. Before, a probe's round (0.3 s) was shorter than one
        // SEND's write: its rate sample took in mostly bytes written before the probe, never
        // grew by the 10 % that starts growing, and the estimate crept 2.0 -> 2.1 Mbit/s in 10 s
        // (measured in the e2e test of links: 11 s before it grew, 8.7 s capture-to-arrival).
        let mut sim = Sim::new(2.0 * MBIT);
        sim.send = 200_000;
        sim.run(20.0, 12.0 * MBIT, None);
        sim.dump();
        let conv = sim.converged(0.0, 20.0);
        let used = sim.delivered_between(10.0, 20.0) / (10.0 * 12.0 * MBIT);
        println!("converged after {conv:?} s, used {:.0} %", used * 100.0);
        assert!(conv.is_some_and(|c| c < 8.0), "{conv:?}");
        assert!(used >= 0.85, "used {used}");
    }

    #[test]
    fn an_estimate_cut_far_below_the_link_grows_back_with_large_sends() {
        // A cold start cut down by a loaded broker's late receipts (305 kbit/s in a CI run, the
        // link 8 Mbit/s), then 200 kB SENDs: rounds that span two whole SENDs at such an estimate
        // were 10 s each ([`MAX_SEND_TIME`] bounds them), and the estimate took most of a minute
        // to come back.
        let mut sim = Sim::new(0.3 * MBIT);
        sim.send = 200_000;
        sim.run(30.0, 8.0 * MBIT, None);
        sim.dump();
        let conv = sim.converged(0.0, 30.0);
        println!("converged after {conv:?} s");
        assert!(conv.is_some_and(|c| c < 20.0), "{conv:?}");
    }

    #[test]
    fn a_link_that_carried_little_keeps_its_estimate_for_the_load_that_moves_onto_it() {
        // One of two links: 8 Mbit/s of demand for 10 s (its capacity, 12 Mbit/s, not reached),
        // then 20 s of a little audio (0.3 Mbit/s: the camera went to the other link), then the
        // other link fails and everything comes back onto this one. App-limited samples do not
        // lower the estimate: it is still what the link was seen to carry, and the load that
        // moves onto it goes at once. (Before, the estimate followed the audio down to 0.3
        // Mbit/s and took 5 s and more of growth rounds to come back.)
        let mut sim = Sim::new(2.0 * MBIT);
        sim.run(10.0, 12.0 * MBIT, Some(8.0 * MBIT));
        sim.run(20.0, 12.0 * MBIT, Some(0.3 * MBIT));
        sim.backlog = 0.0;
        sim.run(10.0, 12.0 * MBIT, None);
        sim.dump();
        let lowest = sim.lowest(12.0, 30.0);
        assert!(lowest >= 6.0 * MBIT, "fell to {} Mbit/s", lowest / MBIT);
        let conv = sim.converged(30.0, 40.0);
        assert!(conv.is_some_and(|c| c < 3.0), "{conv:?}");
    }

    #[test]
    fn a_link_that_carries_bursts_keeps_its_start_for_the_load_that_moves_onto_it() {
        // A second link that carries only a GPS track and its set-up: 100 kB every 2 s (0.4
        // Mbit/s on average) in SENDs of 2 kB, its start 2 Mbit/s, the link 12 Mbit/s; then the
        // camera moves onto it. Each burst waits a moment for the budget; before, a sample taken
        // then counted whole, its interval mostly the idle time before the burst, and the
        // estimate fell to the bursts' average within seconds (359-378 kbit/s within a second in
        // the e2e test of links) and the camera waited 6-7 s for growth.
        let mut sim = Sim::new(2.0 * MBIT);
        sim.send = 2_000;
        sim.bursts = Some((100_000.0, 2.0));
        sim.run(20.0, 12.0 * MBIT, Some(0.0));
        sim.bursts = None;
        sim.backlog = 0.0;
        sim.run(10.0, 12.0 * MBIT, None);
        sim.dump();
        let lowest = sim.lowest(0.0, 20.0);
        let conv = sim.converged(20.0, 30.0);
        println!(
            "lowest {:.2} Mbit/s, converged after {conv:?} s",
            lowest / MBIT
        );
        assert!(lowest >= 1.8 * MBIT, "fell to {} Mbit/s", lowest / MBIT);
        assert!(conv.is_some_and(|c| c < 6.0), "{conv:?}");
    }

    #[test]
    fn a_cap_holds_and_the_floor_holds() {
        let t0 = Instant::now();
        let s = Settings {
            start: 1e9,
            min: 8_000.0,
            max: MBIT,
            target: TARGET,
        };
        let mut e = Estimator::new(s, t0);
        assert!(e.pacing(t0) <= MBIT);
        // Huge delivery samples never lift it above the cap.
        let mut now = t0;
        for _ in 0..100 {
            now += Duration::from_millis(50);
            e.on_receipt(1 << 20, now - Duration::from_millis(5), now, || None);
            assert!(e.pacing(now) <= MBIT);
        }
        // A queue that grows for ever: cut after cut, never below the floor.
        for i in 0..200u64 {
            now += Duration::from_millis(100);
            e.on_receipt(10, now - Duration::from_millis(200 + i * 50), now, || None);
            assert!(e.pacing(now) >= 8_000.0);
        }
        assert_eq!(e.reading(now).mode, Mode::Backoff);
    }

    #[test]
    fn queueing_delay_is_the_recent_rtt_above_the_windowed_minimum() {
        // (Receipts of empty SENDs: no transmission time of their own.)
        let t0 = Instant::now();
        let mut e = Estimator::new(
            Settings {
                start: MBIT,
                min: 8_000.0,
                max: 1e9,
                target: TARGET,
            },
            t0,
        );
        let mut now = t0;
        for _ in 0..20 {
            now += Duration::from_millis(100);
            e.on_receipt(0, now - Duration::from_millis(20), now, || None);
        }
        let r = e.reading(now);
        assert_eq!(r.base_rtt, Some(Duration::from_millis(20)));
        assert_eq!(r.queueing, Duration::ZERO);
        // One late receipt among timely ones is no queue (the recent minimum).
        now += Duration::from_millis(10);
        e.on_receipt(0, now - Duration::from_millis(400), now, || None);
        assert_eq!(e.reading(now).queueing, Duration::ZERO);
        // Only late ones for longer than RECENT: a queue of 80 ms.
        for _ in 0..5 {
            now += Duration::from_millis(50);
            e.on_receipt(0, now - Duration::from_millis(100), now, || None);
        }
        assert_eq!(e.reading(now).queueing, Duration::from_millis(80));
        // A SEND's own transmission at the estimated rate is no queue: a second's worth, its
        // receipt 1.02 s after its write, is 20 ms.
        let second = e.reading(now).estimate as usize;
        now += Duration::from_millis(50);
        e.on_receipt(second, now - Duration::from_millis(1020), now, || None);
        let r = e.reading(now);
        assert_eq!(r.base_rtt, Some(Duration::from_millis(20)));
        assert!(r.queueing <= Duration::from_millis(1), "{r:?}");
        // The base forgets after BASE_WINDOW.
        for _ in 0..110 {
            now += Duration::from_millis(100);
            e.on_receipt(0, now - Duration::from_millis(60), now, || None);
        }
        assert_eq!(e.reading(now).base_rtt, Some(Duration::from_millis(60)));
    }

    #[test]
    fn sends_are_timed_by_the_write_of_their_last_byte_and_answered_in_order() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_millis(10);
        let mut s = Sends::default();
        s.sent(100);
        s.sent(50);
        s.sent(10);
        s.wrote(120, t0);
        s.wrote(150, t1);
        s.wrote(155, t1 + Duration::from_millis(5));
        assert_eq!(s.answered(), Some((100, t0)));
        assert_eq!(s.answered(), Some((50, t1)));
        // Not written whole: answered without a time (no sample).
        assert_eq!(s.answered(), None);
        assert_eq!(s.answered(), None);
    }
}
