//! What one peer (one client address) may take of the web server: how fast it may guess the
//! control token ([`TokenGuesses`]) and how many of the long-lived slots, live view and status
//! streams, it may hold at once ([`PeerSlots`]). Pure rules with the time passed in; the locks
//! around them are the callers'.
//!
//! A token of 16 characters or more cannot be guessed online, but without a slow-down a peer on
//! the rig's network can try as fast as the rig answers, and a leaked short token is found in
//! minutes. After [`FREE_FAILURES`] wrong tokens a peer waits before its next try is even judged
//! (429 with `Retry-After`), the wait doubling with each failure up to [`MAX_WAIT`]; a right token
//! clears its record. Records are kept for at most [`MAX_PEERS`] addresses (the least recently
//! failing forgotten first), so a flood of addresses cannot grow memory.
//!
//! [`SharedPeerSlots`] is the one lock around [`PeerSlots`], with a guard that gives the slot back.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Wrong tokens a peer may send before it must wait.
pub const FREE_FAILURES: u32 = 5;
/// The first wait; doubled for each further failure.
pub const FIRST_WAIT: Duration = Duration::from_secs(1);
/// The longest wait.
pub const MAX_WAIT: Duration = Duration::from_secs(60);
/// Peers whose failures are remembered.
pub const MAX_PEERS: usize = 1024;

#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    last: Instant,
    /// No try is judged before this.
    until: Option<Instant>,
}

/// Failed token tries per peer.
#[derive(Debug, Default)]
pub struct TokenGuesses {
    peers: HashMap<IpAddr, Failures>,
}

impl TokenGuesses {
    /// None: judge this peer's token now; Some(wait): refuse without judging, for this long.
    pub fn must_wait(&self, peer: IpAddr, now: Instant) -> Option<Duration> {
        let until = self.peers.get(&peer)?.until?;
        (until > now).then(|| until - now)
    }

    /// A wrong token from `peer`: returns the wait it now owes (zero while it has free tries).
    pub fn failed(&mut self, peer: IpAddr, now: Instant) -> Duration {
        if !self.peers.contains_key(&peer) && self.peers.len() >= MAX_PEERS {
            if let Some(oldest) = self
                .peers
                .iter()
                .min_by_key(|(_, f)| f.last)
                .map(|(ip, _)| *ip)
            {
                self.peers.remove(&oldest);
            }
        }
        let f = self.peers.entry(peer).or_insert(Failures {
            count: 0,
            last: now,
            until: None,
        });
        // A peer quiet for the longest wait starts over.
        if now.saturating_duration_since(f.last) > MAX_WAIT * 10 {
            f.count = 0;
        }
        f.count += 1;
        f.last = now;
        let wait = wait_after(f.count);
        f.until = (!wait.is_zero()).then(|| now + wait);
        wait
    }

    /// A right token from `peer`: its record goes.
    pub fn succeeded(&mut self, peer: IpAddr) {
        self.peers.remove(&peer);
    }

    pub fn len(&self) -> usize {
        self.peers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }
}

/// The wait owed after `count` failures in a row.
fn wait_after(count: u32) -> Duration {
    if count <= FREE_FAILURES {
        return Duration::ZERO;
    }
    let doublings = (count - FREE_FAILURES - 1).min(16);
    (FIRST_WAIT * 2u32.pow(doublings)).min(MAX_WAIT)
}

/// Slots held per peer, out of a pool whose total cap is the caller's: a peer may hold at most
/// `per_peer`, so that one allowed client (a tab left open, a script) cannot take every slot.
#[derive(Debug)]
pub struct PeerSlots {
    per_peer: usize,
    held: HashMap<IpAddr, usize>,
}

impl PeerSlots {
    pub fn new(per_peer: usize) -> Self {
        Self {
            per_peer: per_peer.max(1),
            held: HashMap::new(),
        }
    }

    pub fn per_peer(&self) -> usize {
        self.per_peer
    }

    /// Takes a slot for `peer`; false when it holds `per_peer` already.
    pub fn take(&mut self, peer: IpAddr) -> bool {
        let n = self.held.entry(peer).or_insert(0);
        if *n >= self.per_peer {
            return false;
        }
        *n += 1;
        true
    }

    /// Gives back a slot taken by [`take`](Self::take).
    pub fn give_back(&mut self, peer: IpAddr) {
        if let Some(n) = self.held.get_mut(&peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.held.remove(&peer);
            }
        }
    }

    pub fn held_by(&self, peer: IpAddr) -> usize {
        self.held.get(&peer).copied().unwrap_or(0)
    }
}

/// [`PeerSlots`] shared by the handlers that hand them out.
#[derive(Debug, Clone)]
pub struct SharedPeerSlots(Arc<Mutex<PeerSlots>>);

impl SharedPeerSlots {
    pub fn new(per_peer: usize) -> Self {
        Self(Arc::new(Mutex::new(PeerSlots::new(per_peer))))
    }

    fn lock(&self) -> MutexGuard<'_, PeerSlots> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot for `peer`, or Err(the share) when it holds its share already. Not counted: a
    /// request without a peer (which only a test makes) and loopback, which is not one peer but
    /// everyone reaching the rig through it (technicians' SSH tunnels, the rig's own tools).
    pub fn take(&self, peer: Option<IpAddr>) -> Result<PeerSlot, usize> {
        let peer = peer.filter(|ip| !is_loopback(*ip));
        if let Some(ip) = peer {
            let mut slots = self.lock();
            if !slots.take(ip) {
                return Err(slots.per_peer());
            }
        }
        Ok(PeerSlot {
            slots: self.clone(),
            peer,
        })
    }
}

/// 127.0.0.0/8, ::1, and IPv4 loopback as a dual-stack listener sees it.
fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or(v6.is_loopback(), |v4| v4.is_loopback()),
        IpAddr::V4(v4) => v4.is_loopback(),
    }
}

/// A slot held until dropped.
#[derive(Debug)]
pub struct PeerSlot {
    slots: SharedPeerSlots,
    peer: Option<IpAddr>,
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        if let Some(ip) = self.peer {
            self.slots.lock().give_back(ip);
        }
    }
}

/// The slots one peer may hold of `total`: half, at least one (a technician's Foxglove and a
/// second tab fit; one client cannot shut out everyone else).
pub fn per_peer_share(total: usize) -> usize {
    total.div_ceil(2).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn wrong_tokens_beyond_the_free_ones_make_the_peer_wait_longer_each_time() {
        let mut g = TokenGuesses::default();
        let t0 = Instant::now();
        let a = ip("10.0.0.5");
        for _ in 0..FREE_FAILURES {
            assert_eq!(g.failed(a, t0), Duration::ZERO);
            assert_eq!(g.must_wait(a, t0), None);
        }
        assert_eq!(g.failed(a, t0), Duration::from_secs(1));
        assert_eq!(g.must_wait(a, t0), Some(Duration::from_secs(1)));
        // Another peer is not slowed by this one.
        assert_eq!(g.must_wait(ip("10.0.0.6"), t0), None);
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(g.must_wait(a, t1), None, "the wait is over");
        assert_eq!(g.failed(a, t1), Duration::from_secs(2));
        assert_eq!(g.failed(a, t1), Duration::from_secs(4));
        for _ in 0..20 {
            g.failed(a, t1);
        }
        assert_eq!(g.failed(a, t1), MAX_WAIT, "capped");
        g.succeeded(a);
        assert_eq!(g.must_wait(a, t1), None);
        assert_eq!(g.failed(a, t1), Duration::ZERO, "a right token starts over");
    }

    #[test]
    fn a_peer_quiet_for_long_starts_over_and_the_records_are_bounded() {
        let mut g = TokenGuesses::default();
        let t0 = Instant::now();
        let a = ip("10.0.0.5");
        for _ in 0..FREE_FAILURES + 3 {
            g.failed(a, t0);
        }
        let later = t0 + MAX_WAIT * 11;
        assert_eq!(g.failed(a, later), Duration::ZERO);
        for i in 0..(MAX_PEERS as u32 + 50) {
            g.failed(
                IpAddr::from(i.to_be_bytes()),
                later + Duration::from_millis(i as u64),
            );
        }
        assert_eq!(g.len(), MAX_PEERS);
    }

    #[test]
    fn one_peer_holds_at_most_its_share_and_gets_slots_back() {
        assert_eq!(per_peer_share(4), 2);
        assert_eq!(per_peer_share(1), 1);
        assert_eq!(per_peer_share(32), 16);
        assert_eq!(per_peer_share(0), 1);
        let mut s = PeerSlots::new(2);
        let a = ip("192.168.1.20");
        assert!(s.take(a) && s.take(a));
        assert!(!s.take(a), "a third slot for one peer");
        assert!(s.take(ip("192.168.1.21")), "another peer still gets one");
        s.give_back(a);
        assert_eq!(s.held_by(a), 1);
        assert!(s.take(a));
        s.give_back(a);
        s.give_back(a);
        s.give_back(a);
        assert_eq!(s.held_by(a), 0);
    }

    #[test]
    fn loopback_is_everyone_on_the_rig_and_not_counted() {
        let shared = SharedPeerSlots::new(1);
        let held: Vec<_> = ["127.0.0.1", "::1", "::ffff:127.0.0.1", "127.0.0.1"]
            .into_iter()
            .map(|l| shared.take(Some(ip(l))).expect("loopback is not one peer"))
            .collect();
        let lan = shared.take(Some(ip("10.0.0.8"))).unwrap();
        assert_eq!(shared.take(Some(ip("10.0.0.8"))).err(), Some(1));
        drop(lan);
        assert!(shared.take(Some(ip("10.0.0.8"))).is_ok());
        drop(held);
    }
}
