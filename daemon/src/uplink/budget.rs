//! The bandwidth budget (`pulsar.max-bandwidth`): one token bucket for every byte rigd writes to
//! the broker (all sources, every producer, chunk and batch framing, pings), shared by strict
//! priority.
//!
//! [`Arbiter`] is pure (time is an input) and holds the rules; [`Budget`] is the shared handle the
//! producer sessions await before each socket write.
//!
//! Rules:
//! - The bucket fills at `rate` bytes per second up to `burst` bytes. A grant may take the bucket
//!   below zero (a debt, at most [`MAX_GRANT`]): writes stay whole-ish while the average holds, and
//!   a grant is refunded for bytes the socket did not take, so what is charged is what was written.
//! - A writer waits while the bucket is empty, or while a writer of a better rank waits: within the
//!   budget a better rank goes first (rank = priority for live frames, 10 for recall
//!   uploads, 11 + priority for a backlog: every live frame goes before any recall, and a recall
//!   before any backlog), except a writer that has waited [`OVERDUE_AFTER`]: it goes when the
//!   bucket has tokens, whatever waits (writers on connections to different brokers; on one
//!   connection the pool's own order bounds the wait, `pool::state`).
//! - Nothing here knows frames: ranks and byte counts only.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::estimate::{Estimator, Reading, Settings, TARGET};

/// The most one grant gives (and so the deepest debt): at 1.8 Mbit/s, 73 ms of the link, the
/// longest a better rank waits behind a write already granted.
pub const MAX_GRANT: usize = 16 << 10;
/// Ranks: priorities 0..=9 live, one for recall uploads, priorities 0..=9 of backlogs.
pub const RANKS: usize = 21;

/// The bound on a rank's wait: a writer (here) or a connection's channel (`pool::state`) that
/// has waited this long goes whatever better ranks wait, once it has earned the turn (see
/// `pool::state::OUT_OF_RANK_COST`): every rank behind live traffic (a backlog, a recall, a live
/// source of a worse priority) moves while the better ranks would fill the link.
pub const OVERDUE_AFTER: Duration = Duration::from_secs(2);

/// Ranks below this are live traffic ([`rank`] of a live source).
pub const RECALL_RANK: usize = 10;

/// A backlog's rank is this plus its priority: after every live frame and every recall.
pub const FIRST_BACKLOG_RANK: usize = RECALL_RANK + 1;

/// Under a budget, one SEND (a chunk, a batch, a sealed piece) and the write-ahead hold at most
/// this many seconds of the rate: a SEND takes a few seconds however large the frame, and a
/// keepalive answer queued behind the write-ahead goes out within seconds (the broker closes a
/// connection whose PING is not answered by its next keepalive tick, 30 s later by default).
pub const SECONDS_AHEAD: u64 = 2;

/// Under `auto`, a frame larger than [`PACED_WHOLE`] is cut into chunks of this long at the
/// pacing when it is handed over ([`Budget::paced_chunk`]): a frame behind a chunk the
/// connection's writer has begun (a serial line, a lookup) waits about this long, where a chunk
/// sized for the cap (two seconds of it, 256 KB at the broker's limit) took a second at 2 Mbit/s.
pub const CHUNK_TIME: f64 = 0.1;
/// ... chunks never smaller than this (each repeats the frame's metadata, ~1 kB)...
pub const MIN_PACED_CHUNK: usize = 16 << 10;
/// ... and a frame of at most this many bytes goes whole (0.26 s at 2 Mbit/s).
pub const PACED_WHOLE: usize = 64 << 10;

/// What [`SECONDS_AHEAD`] of a rate of `bytes_per_second` is, in bytes.
pub fn bytes_ahead(bytes_per_second: u64) -> usize {
    (bytes_per_second * SECONDS_AHEAD) as usize
}

/// The rank of a source's traffic: every source's live frames before any backlog, then priority
/// 0 first. (Before, rank was `priority * 2 + backlog`: a camera's live frames waited behind the
/// audio backlog after an outage, p99 16 s under a budget.)
pub fn rank(priority: u8, backlog: bool) -> usize {
    let p = (priority as usize).min(RECALL_RANK - 1);
    if backlog {
        FIRST_BACKLOG_RANK + p
    } else {
        p
    }
}

/// What a writer may do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// Write up to this many bytes (already charged; refund what the socket does not take).
    Bytes(usize),
    /// Ask again at this time (or when a writer of a better rank is done).
    WaitUntil(Instant),
}

/// The bucket and who waits on it. Pure.
#[derive(Debug)]
pub struct Arbiter {
    /// Bytes per second.
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
    /// Writers waiting, per rank.
    waiting: [u32; RANKS],
}

impl Arbiter {
    /// A budget of `rate` bytes per second, starting full.
    pub fn new(rate: u64, now: Instant) -> Self {
        let rate = rate.max(1) as f64;
        // A tenth of a second of the link, at least one grant.
        let burst = (rate / 10.0).max(MAX_GRANT as f64);
        Arbiter {
            rate,
            burst,
            tokens: burst,
            last: now,
            waiting: [0; RANKS],
        }
    }

    pub fn rate(&self) -> u64 {
        self.rate as u64
    }

    /// The rate changes at `now` (`max-bandwidth = "auto"`): what was earned so far at the old
    /// rate stays, the burst follows the new one.
    pub fn set_rate(&mut self, rate: u64, now: Instant) {
        self.refill(now);
        self.rate = rate.max(1) as f64;
        self.burst = (self.rate / 10.0).max(MAX_GRANT as f64);
        self.tokens = self.tokens.min(self.burst);
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = self.last.max(now);
        self.tokens = (self.tokens + dt * self.rate).min(self.burst);
    }

    /// A writer of `rank` with `want` bytes ready, waiting since `since` (its first ask). Call
    /// [`Arbiter::wait`] when told to wait and [`Arbiter::done_waiting`] once it stops waiting
    /// (granted or gone).
    pub fn ask(&mut self, rank: usize, want: usize, since: Instant, now: Instant) -> Grant {
        self.refill(now);
        let overdue = now.saturating_duration_since(since) >= OVERDUE_AFTER;
        let better_waits = !overdue && self.waiting[..rank.min(RANKS)].iter().any(|&n| n > 0);
        if self.tokens > 0.0 && !better_waits {
            let n = want.clamp(1, MAX_GRANT);
            self.tokens -= n as f64;
            return Grant::Bytes(n);
        }
        let short = if self.tokens > 0.0 {
            // A better rank goes first: look again soon, it will have taken its share.
            1.0 / self.rate
        } else {
            (-self.tokens + 1.0) / self.rate
        };
        Grant::WaitUntil(now + Duration::from_secs_f64(short.clamp(0.001, 1.0)))
    }

    pub fn wait(&mut self, rank: usize) {
        self.waiting[rank.min(RANKS - 1)] += 1;
    }

    pub fn done_waiting(&mut self, rank: usize) {
        let w = &mut self.waiting[rank.min(RANKS - 1)];
        *w = w.saturating_sub(1);
    }

    /// Bytes granted but not written.
    pub fn refund(&mut self, n: usize) {
        self.tokens = (self.tokens + n as f64).min(self.burst);
    }
}

/// The shared budget: an [`Arbiter`] behind a lock, its rate fixed or paced by the link's
/// [`Estimator`] (`max-bandwidth = "auto"`).
#[derive(Debug)]
pub struct Budget {
    arbiter: Mutex<Arbiter>,
    rate: u64,
    auto: Option<Mutex<Estimator>>,
    /// Bytes granted per rank since start (status: each rank's share).
    granted: [AtomicU64; RANKS],
}

/// Where `auto` starts before the first receipt: 2 Mbit/s (or the cap).
pub const AUTO_START: u64 = 250_000;
/// The least `auto` paces at: 64 kbit/s, the smallest budget (`config::MIN_BANDWIDTH`).
pub const AUTO_MIN: u64 = 8_000;

impl Budget {
    pub fn new(rate_bytes_per_second: u64) -> Arc<Self> {
        Arc::new(Budget {
            arbiter: Mutex::new(Arbiter::new(rate_bytes_per_second, Instant::now())),
            rate: rate_bytes_per_second,
            auto: None,
            granted: Default::default(),
        })
    }

    /// `max-bandwidth = "auto"` under `cap` bytes per second (None: none); `sizing`: the rate
    /// that sizes chunks and windows (see [`Budget::rate`]).
    pub fn auto(cap: Option<u64>, sizing: u64) -> Arc<Self> {
        let now = Instant::now();
        let max = cap.unwrap_or(u64::MAX / 16) as f64;
        let start = (AUTO_START as f64).min(max);
        let est = Estimator::new(
            Settings {
                start,
                min: (AUTO_MIN as f64).min(max),
                max,
                target: TARGET,
            },
            now,
        );
        Arc::new(Budget {
            arbiter: Mutex::new(Arbiter::new(start as u64, now)),
            rate: sizing,
            auto: Some(Mutex::new(est)),
            granted: Default::default(),
        })
    }

    /// The budget `pulsar.max-bandwidth` asks for.
    pub fn of(max: crate::config::MaxBandwidth) -> Arc<Self> {
        match max {
            crate::config::MaxBandwidth::Fixed(b) => Budget::new(b.bytes_per_second()),
            crate::config::MaxBandwidth::Auto { cap } => {
                Budget::auto(cap.map(|c| c.bytes_per_second()), max.bytes_per_second())
            }
        }
    }

    /// Bytes per second: the fixed rate, or under `auto` the rate that sizes a SEND and a
    /// source's window (`config::MaxBandwidth::bytes_per_second`).
    pub fn rate(&self) -> u64 {
        self.rate
    }

    fn arbiter(&self) -> MutexGuard<'_, Arbiter> {
        self.arbiter.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `max-bandwidth = "auto"`: the rate follows the link's estimate (fed by [`Budget::receipt`]).
    pub fn is_auto(&self) -> bool {
        self.auto.is_some()
    }

    fn estimator(&self) -> Option<MutexGuard<'_, Estimator>> {
        self.auto
            .as_ref()
            .map(|e| e.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Under `auto`: the arbiter's rate follows the estimator's pacing now (`a`: the arbiter,
    /// locked by the caller, who asks it next).
    fn pace(&self, a: &mut Arbiter, now: Instant) {
        if let Some(rate) = self.estimator().map(|mut e| e.pacing(now)) {
            follow(a, rate, now);
        }
    }

    /// A receipt for a SEND of `bytes` whose last byte was written at `written` (the estimator's
    /// input, and its pacing then; nothing under a fixed rate). `path`: where its connection's
    /// kernel sees the bytes wait (asked only for a late receipt).
    pub fn receipt(
        &self,
        bytes: usize,
        written: Instant,
        now: Instant,
        path: impl FnOnce() -> Option<super::estimate::Queued>,
    ) {
        let paced = self.estimator().map(|mut e| {
            e.on_receipt(bytes, written, now, path);
            e.pacing(now)
        });
        if let Some(rate) = paced {
            follow(&mut self.arbiter(), rate, now);
        }
    }

    /// A connection's writer on this link has something to write from now (`busy`), or nothing
    /// left: under `auto`, samples of a time when every writer was idle are app-limited
    /// (`estimate`); nothing under a fixed rate.
    pub fn writer(&self, busy: bool) {
        if let Some(mut e) = self.estimator() {
            e.writer(busy, Instant::now());
        }
    }

    /// Under `auto`: the largest chunk to cut a frame into now, [`CHUNK_TIME`] at the pacing
    /// (None: a fixed rate, whose chunks are sized for it once).
    pub fn paced_chunk(&self) -> Option<usize> {
        self.auto.as_ref()?;
        let rate = self.arbiter().rate() as f64;
        Some(((rate * CHUNK_TIME) as usize).max(MIN_PACED_CHUNK))
    }

    /// The estimate now (None: a fixed rate).
    pub fn reading(&self) -> Option<Reading> {
        self.estimator().map(|mut e| e.reading(Instant::now()))
    }

    /// Bytes granted so far, per rank.
    pub fn granted(&self) -> [u64; RANKS] {
        std::array::from_fn(|r| self.granted[r].load(Ordering::Relaxed))
    }

    /// Waits until a writer of `rank` may write, and returns how many bytes (at most `want`,
    /// charged). Cancel-safe: a cancelled wait leaves nothing charged and no waiter registered.
    /// `waiting` is called every time the writer is held (the session tells its window that the
    /// budget, not the link, holds the bytes back).
    pub async fn acquire(&self, rank: usize, want: usize, mut waiting: impl FnMut()) -> usize {
        let mut registered: Option<Registered<'_>> = None;
        let since = Instant::now();
        loop {
            let now = Instant::now();
            let g = {
                let mut a = self.arbiter();
                self.pace(&mut a, now);
                a.ask(rank, want, since, now)
            };
            match g {
                Grant::Bytes(n) => {
                    drop(registered);
                    self.granted[rank.min(RANKS - 1)].fetch_add(n as u64, Ordering::Relaxed);
                    return n;
                }
                Grant::WaitUntil(t) => {
                    if registered.is_none() {
                        self.arbiter().wait(rank);
                        registered = Some(Registered { budget: self, rank });
                    }
                    waiting();
                    tokio::time::sleep_until(tokio::time::Instant::from_std(t)).await;
                }
            }
        }
    }

    pub fn refund(&self, n: usize) {
        if n > 0 {
            self.arbiter().refund(n);
        }
    }
}

/// The arbiter's rate follows the estimator's pacing `rate` once they differ by more than 1 %.
fn follow(a: &mut Arbiter, rate: f64, now: Instant) {
    let rate = rate as u64;
    if rate.abs_diff(a.rate()) * 100 > a.rate() {
        a.set_rate(rate, now);
    }
}

/// A waiter's registration, undone when the wait ends or is cancelled.
struct Registered<'a> {
    budget: &'a Budget,
    rank: usize,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.budget.arbiter().done_waiting(self.rank);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn granted(g: Grant) -> usize {
        match g {
            Grant::Bytes(n) => n,
            Grant::WaitUntil(_) => 0,
        }
    }

    /// Writers of the given ranks, each always with `MAX_GRANT` bytes ready, served for `secs`
    /// seconds in 1 ms steps: the bytes each got.
    fn run(rate: u64, ranks: &[usize], demand: &[Option<u64>], secs: u64) -> Vec<u64> {
        let t0 = Instant::now();
        let mut a = Arbiter::new(rate, t0);
        let mut got = vec![0u64; ranks.len()];
        let mut waiting = vec![false; ranks.len()];
        for ms in 0..secs * 1000 {
            let now = t0 + Duration::from_millis(ms);
            for (i, &r) in ranks.iter().enumerate() {
                // A writer with a rate of its own has only what it captured so far.
                let ready = match demand[i] {
                    Some(bps) => (bps * ms / 1000).saturating_sub(got[i]) as usize,
                    None => MAX_GRANT,
                };
                if ready == 0 {
                    if waiting[i] {
                        a.done_waiting(r);
                        waiting[i] = false;
                    }
                    continue;
                }
                match a.ask(r, ready, now, now) {
                    Grant::Bytes(n) => {
                        got[i] += n as u64;
                        if waiting[i] {
                            a.done_waiting(r);
                            waiting[i] = false;
                        }
                    }
                    Grant::WaitUntil(t) => {
                        assert!(t > now && t <= now + Duration::from_secs(1));
                        if !waiting[i] {
                            a.wait(r);
                            waiting[i] = true;
                        }
                    }
                }
            }
        }
        got
    }

    #[test]
    fn the_rate_holds_over_time_whatever_the_writers() {
        let rate = 225_000; // 1800 kbit/s
        for ranks in [vec![4], vec![0, 1, 4, 5], vec![4, 4, 4]] {
            let demand = vec![None; ranks.len()];
            let total: u64 = run(rate, &ranks, &demand, 60).iter().sum();
            let expect = rate * 60;
            // At most the starting burst and one grant of debt above the rate.
            assert!(
                total <= expect + (rate / 10).max(MAX_GRANT as u64) + MAX_GRANT as u64,
                "{ranks:?}: {total} > {expect}"
            );
            assert!(total as f64 >= expect as f64 * 0.99, "{ranks:?}: {total}");
        }
    }

    #[test]
    fn a_better_rank_goes_first_and_the_rest_gets_what_it_leaves() {
        let rate = 225_000;
        // Serial (rank 0) 2 kB/s, audio (rank 2) 32 kB/s, camera live (4) and backlog (5) unbounded.
        let got = run(
            rate,
            &[0, 2, 4, 5],
            &[Some(2_000), Some(32_000), None, None],
            60,
        );
        assert!(got[0] >= 2_000 * 59, "serial got {}", got[0]);
        assert!(got[1] >= 32_000 * 59, "audio got {}", got[1]);
        let leftover = rate * 60 - got[0] - got[1];
        assert!(
            got[2] as f64 >= leftover as f64 * 0.98,
            "camera live {got:?}"
        );
        assert!(
            got[3] < (MAX_GRANT * 2) as u64,
            "the backlog waits: {got:?}"
        );
        // With a camera live rate below what is left, its backlog drains with the rest.
        let got = run(
            rate,
            &[0, 2, 4, 5],
            &[Some(2_000), Some(32_000), Some(100_000), None],
            60,
        );
        assert!(got[2] >= 100_000 * 59, "{got:?}");
        let leftover = rate * 60 - got[0] - got[1] - got[2];
        assert!(got[3] as f64 >= leftover as f64 * 0.95, "{got:?}");
    }

    #[test]
    fn a_grant_is_at_most_max_grant_and_a_refund_returns_tokens() {
        let t0 = Instant::now();
        let mut a = Arbiter::new(10_000, t0);
        assert_eq!(granted(a.ask(0, 1 << 20, t0, t0)), MAX_GRANT);
        // In debt: wait about as long as the debt takes to pay at the rate.
        let Grant::WaitUntil(t) = a.ask(0, 100, t0, t0) else {
            panic!("no debt")
        };
        assert!(t > t0);
        a.refund(MAX_GRANT);
        assert_eq!(granted(a.ask(0, 100, t0, t0)), 100);
        // A lower rank waits while a better one is registered, even with tokens in the bucket.
        a.wait(1);
        assert!(matches!(a.ask(3, 100, t0, t0), Grant::WaitUntil(_)));
        assert_eq!(granted(a.ask(1, 100, t0, t0)), 100);
        // ... unless it has waited OVERDUE_AFTER: then it goes whenever the bucket has tokens.
        let later = t0 + OVERDUE_AFTER;
        assert_eq!(granted(a.ask(3, 100, t0, later)), 100);
        assert!(matches!(
            a.ask(3, 100, later - Duration::from_millis(1), later),
            Grant::WaitUntil(_)
        ));
        a.done_waiting(1);
        assert_eq!(granted(a.ask(3, 100, t0, t0)), 100);
        assert_eq!(rank(0, false), 0);
        assert_eq!(rank(2, true), 13);
        assert_eq!(rank(9, true), RANKS - 1);
        // Every live frame before any recall, every recall before any backlog.
        assert!(rank(9, false) < RECALL_RANK && RECALL_RANK < rank(0, true));
        // Every live rank before every backlog rank.
        assert!(rank(9, false) < rank(0, true));
    }

    #[tokio::test]
    async fn acquire_waits_for_tokens_and_a_cancelled_wait_leaves_no_waiter() {
        let b = Budget::new(16_384);
        let mut held = 0;
        assert_eq!(b.acquire(2, MAX_GRANT * 2, || held += 1).await, MAX_GRANT);
        let t = Instant::now();
        let mut total = 0;
        while total < 24_000 {
            total += b.acquire(2, 1000, || held += 1).await;
        }
        // The first burst is spent: 24 kB at 16 kB/s take about 1.5 s.
        assert!(
            t.elapsed() >= Duration::from_millis(1300),
            "{:?}",
            t.elapsed()
        );
        assert!(held > 0);
        // Cancelled while waiting: no waiter left behind to block the lower ranks.
        let _ = tokio::time::timeout(Duration::from_millis(1), b.acquire(0, 1000, || {})).await;
        assert_eq!(b.arbiter().waiting.iter().sum::<u32>(), 0);
    }
}
