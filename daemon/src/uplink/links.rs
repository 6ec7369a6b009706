//! Several links to the brokers (`[[pulsar.link]]`: two modems, depot Wi-Fi), each a [`Path`]
//! of the pool: connections bound to its interface, a budget (and estimate) of its own, and a
//! health that decides where producers go.
//!
//! - **Where a producer goes** ([`choose`], pure): the cheapest usable link; links of equal
//!   cost share the producers by their estimates (the most estimate per producer already on it).
//! - **Given up** ([`Path::give_up`]): its interface went down (`/sys/class/net/IF/operstate`),
//!   or a connection on it sent bytes that no ACK answered for [`SILENT_AFTER`] ([`Silence`],
//!   read from the kernel's `TCP_INFO`, `rigd_drivers::tcp::acks`, so a 2 MB chunk that takes 8 s on a slow link is not
//!   silence while its segments are acknowledged). Every connection on it fails at once, and
//!   each producer sets up again on another link, under the same name: the broker's
//!   deduplication answers what was in flight, so its frames move with it, in order. The path is
//!   held ([`HOLD`]) until a TCP connect over it succeeds again (the pool's prober).
//! - **Back to the preferred link** ([`better`]): a producer on a costlier link moves to a cheaper
//!   one that has been usable for [`SETTLE`] (a clean CLOSE_PRODUCER, then PRODUCER there).
//! - **Spread again** ([`better`], [`Move::Spread`]): on links of one cost, a producer moves to
//!   a settled one where its estimate per producer would be more than [`REBALANCE_GAIN`] times
//!   what it has where it is; one producer of the rig per [`REBALANCE_EVERY`], so they do not all move at once.
//!
//! With one link (no `[[pulsar.link]]`: the default route) none of this runs; the connection's
//! own deadlines (docs/UPLINK.md "Deadlines follow progress") are all there is, since there is
//! nowhere to move to.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::budget::Budget;

/// Bytes sent and no ACK for this long (while no ACK came for as long): the link is silent.
/// Longer than a few retransmission timeouts of a healthy link (200 ms, then doubled), short
/// enough that a move ends within the 3 s of docs/UPLINK.md "Several links".
pub const SILENT_AFTER: Duration = Duration::from_millis(1000);
/// How often a connection on one of several links looks at its socket and its interface.
pub const LOOK_EVERY: Duration = Duration::from_millis(250);
/// A link given up is not chosen for this long, unless a TCP connect over it succeeds first.
pub const HOLD: Duration = Duration::from_secs(30);
/// Producers move back to a cheaper link once it has been usable for this long.
pub const SETTLE: Duration = Duration::from_secs(3);
/// How often the prober tries a link given up (a TCP connect, bounded by the same).
pub const PROBE_EVERY: Duration = Duration::from_secs(1);
/// A producer moves between links of one cost only for this much more estimate per producer
/// there than where it is ([`better`]): a margin, so that one move does not invite the move back.
pub const REBALANCE_GAIN: f64 = 1.4;
/// At most one producer of the rig moves between links of one cost in this long: they would all
/// see the same idle link at once and move there together (and back).
pub const REBALANCE_EVERY: Duration = Duration::from_secs(5);

/// One way to the brokers.
pub struct Path {
    /// Shown in status, metrics and logs (`default`: the one link of a rig without
    /// `[[pulsar.link]]`).
    pub name: String,
    /// Connections are bound to it (SO_BINDTODEVICE); None: the default route.
    pub interface: Option<String>,
    /// 0-9, the cheapest usable first.
    pub cost: u8,
    /// What its connections' writers are charged against (its estimate under `auto`).
    pub budget: Option<Arc<Budget>>,
    health: Mutex<Health>,
    /// Bumped each time it is given up: its connections fail when they see it move.
    generation: AtomicU64,
    /// Setups (producers, the probe's and control's consumers) that chose it and have not
    /// chosen again or ended: its load as [`choose`] weighs it.
    assigned: AtomicUsize,
    /// Producers that left a link still serving them for this one: back to it as the cheaper,
    /// and to spread links of one cost ([`Move`]).
    moved_in: [AtomicU64; 2],
}

#[derive(Debug)]
struct Health {
    held_until: Option<Instant>,
    /// Why it was last given up.
    why: Option<String>,
    /// Usable (interface up, not held) since.
    usable_since: Instant,
    given_up: u64,
}

/// A path's state for status and metrics.
#[derive(Debug, Clone)]
pub struct PathState {
    pub up: bool,
    pub held: bool,
    pub why: Option<String>,
    pub given_up: u64,
    /// Producers moved onto it from a link still serving them ([`Move::Cheaper`],
    /// [`Move::Spread`]).
    pub moved_in_cheaper: u64,
    pub moved_in_spread: u64,
}

impl Path {
    pub fn new(
        name: String,
        interface: Option<String>,
        cost: u8,
        budget: Option<Arc<Budget>>,
    ) -> Arc<Self> {
        Arc::new(Path {
            name,
            interface,
            cost,
            budget,
            health: Mutex::new(Health {
                held_until: None,
                why: None,
                usable_since: Instant::now(),
                given_up: 0,
            }),
            generation: AtomicU64::new(0),
            assigned: AtomicUsize::new(0),
            moved_in: Default::default(),
        })
    }

    /// Setups on it now ([`Path::assign`]ed, not yet released).
    pub fn load(&self) -> usize {
        self.assigned.load(Ordering::Relaxed)
    }

    /// A setup chose it.
    pub fn assign(&self) {
        self.assigned.fetch_add(1, Ordering::Relaxed);
    }

    /// A setup that chose it chose again, or ended.
    pub fn release(&self) {
        let _ = self
            .assigned
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    /// A producer on another link that still served it decided to move here.
    pub fn moving_in(&self, why: Move) {
        let i = usize::from(matches!(why, Move::Spread(_)));
        self.moved_in[i].fetch_add(1, Ordering::Relaxed);
    }

    fn health(&self) -> MutexGuard<'_, Health> {
        self.health.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Its interface is up (always, without one).
    pub fn interface_up(&self) -> bool {
        self.interface.as_deref().is_none_or(interface_up)
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Its connections fail and producers go elsewhere; not chosen until a connect over it
    /// succeeds (or [`HOLD`] passed). Once per generation: `seen` is the caller's generation.
    pub fn give_up(&self, seen: u64, why: &str, now: Instant) {
        if self
            .generation
            .compare_exchange(seen, seen + 1, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        let mut h = self.health();
        h.held_until = Some(now + HOLD);
        h.why = Some(why.to_string());
        h.given_up += 1;
        drop(h);
        tracing::warn!(link = %self.name, why, "link given up: its producers move to the other links");
    }

    /// A connect over it succeeded: chosen again.
    pub fn answered(&self, now: Instant) {
        let mut h = self.health();
        if h.held_until.take().is_some() {
            h.usable_since = now;
            tracing::info!(link = %self.name, "link answers again");
        }
    }

    /// Held (given up, not yet answering).
    pub fn held(&self, now: Instant) -> bool {
        self.health().held_until.is_some_and(|t| now < t)
    }

    /// Its interface went down or came back (the prober's look): a link whose interface was
    /// down is usable again from when it came back.
    pub fn interface_seen(&self, up: bool, now: Instant) {
        let mut h = self.health();
        if !up {
            h.usable_since = now + Duration::from_secs(3600);
        } else if h.usable_since > now {
            h.usable_since = now;
        }
    }

    /// What [`choose`] weighs: `load`, the producers on it now.
    pub fn candidate(&self, load: usize, now: Instant) -> Candidate {
        let up = self.interface_up();
        let h = self.health();
        let held = h.held_until.is_some_and(|t| now < t);
        Candidate {
            cost: self.cost,
            usable: up && !held,
            settled: up && !held && now.saturating_duration_since(h.usable_since) >= SETTLE,
            rate: self
                .budget
                .as_ref()
                .map(|b| b.reading().map_or(b.rate() as f64, |r| r.estimate)),
            load,
        }
    }

    pub fn state(&self, now: Instant) -> PathState {
        let up = self.interface_up();
        let h = self.health();
        PathState {
            up,
            held: h.held_until.is_some_and(|t| now < t),
            why: h.why.clone(),
            given_up: h.given_up,
            moved_in_cheaper: self.moved_in[0].load(Ordering::Relaxed),
            moved_in_spread: self.moved_in[1].load(Ordering::Relaxed),
        }
    }
}

/// A link as [`choose`] sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    pub cost: u8,
    /// Its interface is up and it is not held.
    pub usable: bool,
    /// Usable for [`SETTLE`] at least.
    pub settled: bool,
    /// Its estimate (or fixed rate), bytes per second; None: unlimited.
    pub rate: Option<f64>,
    /// Producers on it now.
    pub load: usize,
}

/// The link a producer sets up on: the cheapest usable one, among equals the one with the most
/// estimate per producer already there (unlimited links count as equal), the first on a tie.
/// None usable: the cheapest anyway (its connect fails and the producer backs off as with one
/// link). Pure.
pub fn choose(links: &[Candidate]) -> usize {
    let any_usable = links.iter().any(|c| c.usable);
    let share = |c: &Candidate| c.rate.unwrap_or(1.0) / (1 + c.load) as f64;
    let mut best: Option<usize> = None;
    for (i, c) in links.iter().enumerate() {
        if any_usable && !c.usable {
            continue;
        }
        best = match best {
            None => Some(i),
            Some(b) => {
                let o = &links[b];
                if c.cost < o.cost || (c.cost == o.cost && share(c) > share(o)) {
                    Some(i)
                } else {
                    Some(b)
                }
            }
        };
    }
    best.unwrap_or(0)
}

/// Why a producer leaves a link that still serves it ([`better`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Move {
    /// To a cheaper link, usable and settled again.
    Cheaper(usize),
    /// To a link of the same cost whose estimate per producer is more than [`REBALANCE_GAIN`]
    /// times the one where it is (a modem back after a tunnel, idle while the other carries all).
    Spread(usize),
}

/// A producer on link `at` moves to the returned one: a cheaper link, usable and settled; else
/// a settled link of the same cost that would give it more than [`REBALANCE_GAIN`] times its
/// share here (estimate per producer, counting it there), the best such. Pure; how often a [`Move::Spread`]
/// is taken is the pool's ([`REBALANCE_EVERY`]).
pub fn better(links: &[Candidate], at: usize) -> Option<Move> {
    let here = links.get(at)?;
    if let Some((i, _)) = links
        .iter()
        .enumerate()
        .filter(|(_, c)| c.settled && c.cost < here.cost)
        .min_by_key(|(i, c)| (c.cost, *i))
    {
        return Some(Move::Cheaper(i));
    }
    let share_here = here.rate.unwrap_or(1.0) / here.load.max(1) as f64;
    let mut best: Option<(usize, f64)> = None;
    for (i, c) in links.iter().enumerate() {
        if i == at || !c.settled || c.cost != here.cost {
            continue;
        }
        let there = c.rate.unwrap_or(1.0) / (c.load + 1) as f64;
        if there > REBALANCE_GAIN * share_here && best.is_none_or(|(_, b)| there > b) {
            best = Some((i, there));
        }
    }
    best.map(|(i, _)| Move::Spread(i))
}

/// Whether a connection's link went silent, judged from its socket's `TCP_INFO` samples.
#[derive(Debug, Default)]
pub struct Silence {
    /// Since when unacknowledged bytes have been seen at every sample.
    outstanding_since: Option<Instant>,
}

impl Silence {
    /// A sample: `unacked` segments in flight, `since_ack` since the last ACK came. True when
    /// bytes have been outstanding and no ACK came for [`SILENT_AFTER`]. Pure.
    pub fn sample(&mut self, unacked: u32, since_ack: Duration, now: Instant) -> bool {
        if unacked == 0 {
            self.outstanding_since = None;
            return false;
        }
        let since = *self.outstanding_since.get_or_insert(now);
        now.saturating_duration_since(since) >= SILENT_AFTER && since_ack >= SILENT_AFTER
    }
}

/// `/sys/class/net/IF/operstate` says up (`up`, or `unknown` as dummy, tun and ppp devices
/// report); a missing interface is down.
pub fn interface_up(interface: &str) -> bool {
    match std::fs::read_to_string(format!("/sys/class/net/{interface}/operstate")) {
        Ok(s) => operstate_up(s.trim()),
        Err(_) => false,
    }
}

fn operstate_up(state: &str) -> bool {
    matches!(state, "up" | "unknown")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(cost: u8, rate: Option<f64>, load: usize) -> Candidate {
        Candidate {
            cost,
            usable: true,
            settled: true,
            rate,
            load,
        }
    }

    #[test]
    fn the_cheapest_usable_link_is_chosen_and_equals_share_by_their_estimates() {
        // Wi-Fi (0) before the modem (9), whatever their estimates.
        let links = [link(9, Some(2e6), 0), link(0, Some(1e5), 3)];
        assert_eq!(choose(&links), 1);
        // Wi-Fi down: the modem.
        let mut down = links;
        down[1].usable = false;
        assert_eq!(choose(&down), 0);
        // Nothing usable: the cheapest all the same.
        down[0].usable = false;
        assert_eq!(choose(&down), 1);
        // Two modems of one cost: 1 MB/s with two producers (333 k each with one more) against
        // 400 kB/s with none (400 k): the second; with one there (200 k), the first.
        let modems = [link(1, Some(1e6), 2), link(1, Some(4e5), 0)];
        assert_eq!(choose(&modems), 1);
        let modems = [link(1, Some(1e6), 2), link(1, Some(4e5), 1)];
        assert_eq!(choose(&modems), 0);
        // Unlimited links of one cost: by producers, then the first.
        assert_eq!(choose(&[link(0, None, 1), link(0, None, 0)]), 1);
        assert_eq!(choose(&[link(0, None, 0), link(0, None, 0)]), 0);
    }

    #[test]
    fn producers_move_back_to_a_cheaper_link_only_once_it_settled() {
        let mut links = [link(0, None, 0), link(9, None, 4)];
        assert_eq!(better(&links, 1), Some(Move::Cheaper(0)));
        assert_eq!(better(&links, 0), None);
        links[0].settled = false;
        assert_eq!(better(&links, 1), None);
    }

    #[test]
    fn producers_spread_again_over_links_of_one_cost_with_a_margin() {
        // A modem back (settled, idle) beside the one that carries all four: spread onto it.
        let mut even = [link(1, None, 0), link(1, None, 4)];
        assert_eq!(better(&even, 1), Some(Move::Spread(0)));
        // Not before it settled, and never onto a costlier link.
        even[0].settled = false;
        assert_eq!(better(&even, 1), None);
        assert_eq!(better(&[link(2, None, 0), link(1, None, 4)], 1), None);
        // 3 against 1: 1/2 there against 1/3 here: one more moves.
        assert_eq!(
            better(&[link(1, None, 1), link(1, None, 3)], 1),
            Some(Move::Spread(0))
        );
        // Spread 2 and 2, or 2 and 1: nobody moves (1/3 there against 1/2 here; 1/2 against 1/2).
        assert_eq!(better(&[link(1, None, 2), link(1, None, 2)], 1), None);
        assert_eq!(better(&[link(1, None, 1), link(1, None, 2)], 1), None);
        // 4 and 3: 1/4 there against 1/4 here; 5 and 2: 1/3 against 1/5, one moves.
        assert_eq!(better(&[link(1, None, 3), link(1, None, 4)], 1), None);
        assert_eq!(
            better(&[link(1, None, 2), link(1, None, 5)], 1),
            Some(Move::Spread(0))
        );
        // By the estimates: a producer on 1 Mbit/s with 2 (0.5 Mbit/s each) goes to the 8 Mbit/s
        // link with 2 (2.7 each with it there), not the idle 0.8 Mbit/s one.
        let modems = [
            link(1, Some(1e6), 2),
            link(1, Some(125e3), 2),
            link(1, Some(1e5), 0),
        ];
        assert_eq!(better(&modems, 1), Some(Move::Spread(0)));
        // The fast one's producers stay (0.8 Mbit/s at best elsewhere against 4 here).
        assert_eq!(better(&modems, 0), None);
    }

    #[test]
    fn silence_is_bytes_outstanding_without_an_ack_for_a_second() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut s = Silence::default();
        // Idle for a minute (the last ACK long ago), then a send: not silent until a second of
        // its own has passed without an ACK.
        assert!(!s.sample(0, ms(60_000), t0));
        assert!(!s.sample(3, ms(60_000), t0 + ms(250)));
        assert!(!s.sample(3, ms(60_750), t0 + ms(1000)));
        assert!(s.sample(3, ms(61_000), t0 + ms(1250)));
        // A busy link: always bytes in flight, ACKs every few ms: never silent.
        let mut busy = Silence::default();
        for i in 0..100 {
            assert!(!busy.sample(40, ms(3), t0 + ms(250 * i)));
        }
        // Then the ACKs stop.
        assert!(!busy.sample(40, ms(750), t0 + ms(25_000)));
        assert!(busy.sample(40, ms(1000), t0 + ms(25_250)));
        // Everything acknowledged: the clock starts again.
        assert!(!busy.sample(0, ms(1000), t0 + ms(25_500)));
        assert!(!busy.sample(1, ms(2000), t0 + ms(25_750)));
    }

    #[test]
    fn an_interface_is_up_when_the_kernel_says_so() {
        assert!(operstate_up("up"));
        assert!(operstate_up("unknown"));
        for s in ["down", "lowerlayerdown", "dormant", "notpresent", ""] {
            assert!(!operstate_up(s), "{s}");
        }
        assert!(interface_up("lo"));
        assert!(!interface_up("rigd-no-such0"));
        assert!(!interface_up("../../x"));
    }

    #[test]
    fn a_link_is_given_up_once_per_generation_and_held_until_it_answers() {
        let p = Path::new("lte".into(), Some("lo".into()), 1, None);
        let now = Instant::now();
        let g = p.generation();
        p.give_up(g, "silent", now);
        p.give_up(g, "silent again, same generation", now);
        assert_eq!(p.generation(), g + 1);
        assert_eq!(p.state(now).given_up, 1);
        assert!(p.held(now) && !p.candidate(0, now).usable);
        assert!(!p.held(now + HOLD));
        p.answered(now + Duration::from_secs(1));
        let c = p.candidate(0, now + Duration::from_secs(2));
        assert!(c.usable && !c.settled);
        assert!(p.candidate(0, now + Duration::from_secs(5)).settled);
    }
}
