use super::*;

fn b(n: usize) -> Frames {
    cmd(n).into()
}

fn cmd(n: usize) -> Bytes {
    Bytes::from(vec![0u8; n])
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Writes what `next` answers whole at once; the channel it took.
fn write_one(c: &mut ConnectionState, now: Instant, rank: impl Fn(u64) -> usize) -> Option<u64> {
    let next = c.next(now, rank)?;
    let (id, n) = match next {
        Next::Control(cmd) => (None, cmd.len()),
        Next::Frame { id, bytes } => (Some(id), bytes.len()),
    };
    c.write_waits(now);
    assert_eq!(c.wrote(n, now), id);
    c.frame_done(now);
    id
}

#[test]
fn the_best_rank_goes_first_and_equals_take_turns() {
    let t = Instant::now();
    let q = |v: &[(u64, usize)]| {
        v.iter()
            .map(|&(id, rank)| Candidate {
                id,
                rank,
                waiting_since: Some(t),
            })
            .collect::<Vec<_>>()
    };
    // Rank 0 (serial, live) before rank 2 (camera, live) before rank 11 (a backlog).
    assert_eq!(pick(q(&[(1, 2), (2, 0), (3, 11)]), 0, t), Some(2));
    // Two channels of one rank alternate frame by frame.
    let same = q(&[(4, 3), (7, 3), (9, 8)]);
    assert_eq!(pick(same.clone(), 0, t), Some(4));
    assert_eq!(pick(same.clone(), 4, t), Some(7));
    assert_eq!(pick(same.clone(), 7, t), Some(4));
    assert_eq!(pick(same, 9, t), Some(4));
    assert_eq!(pick(std::iter::empty(), 3, t), None);
}

fn c(id: u64, rank: usize, waiting_since: Option<Instant>) -> Candidate {
    Candidate {
        id,
        rank,
        waiting_since,
    }
}

#[test]
fn a_channel_waiting_past_the_bound_goes_next_whatever_its_rank_the_longest_first() {
    let t0 = Instant::now();
    let now = t0 + OVERDUE_AFTER;
    // The backlog (rank 11) has waited exactly the bound: it goes before live (rank 0).
    assert_eq!(
        pick([c(1, 0, Some(now)), c(2, 11, Some(t0))], 0, now),
        Some(2)
    );
    // Just under the bound it waits on; and while the deficit does not cover its turn.
    assert_eq!(
        pick([c(1, 0, Some(now)), c(2, 11, Some(t0 + ms(1)))], 0, now),
        Some(1)
    );
    assert_eq!(pick([c(1, 0, Some(now)), c(2, 11, None)], 0, now), Some(1));
    // Two overdue: the one waiting longer first, whatever the ranks.
    assert_eq!(
        pick(
            [
                c(1, 0, Some(now)),
                c(2, 11, Some(t0)),
                c(3, 15, Some(t0 - ms(5)))
            ],
            0,
            now
        ),
        Some(3)
    );
}

#[test]
fn a_large_entry_waits_until_the_deficit_covers_nine_times_its_length() {
    let t0 = Instant::now();
    let mut c = ConnectionState::new(t0);
    c.attach(1);
    c.attach(2);
    let rank = |id: u64| if id == 1 { 0 } else { 13 };
    // A camera backlog's 1 MB chunk waits behind live entries of 100 kB, 10 per second.
    c.push(2, b(1_000_000), t0);
    let mut now = t0;
    let mut live = 0;
    loop {
        c.push(1, b(100_000), now);
        if write_one(&mut c, now, rank) == Some(2) {
            break;
        }
        live += 100_000;
        now += ms(100);
        assert!(now < t0 + Duration::from_secs(20), "never served");
    }
    // Past the bound (2 s: 2 MB of live), it waited for 9 MB: a tenth of the link.
    assert_eq!(live, 9_000_000);
    assert_eq!(now - t0, ms(9000));
}

#[test]
fn under_a_better_rank_that_never_empties_every_rank_is_served_within_the_bound() {
    let t0 = Instant::now();
    let mut c = ConnectionState::new(t0);
    let rank = |id: u64| match id {
        1 => 2,  // a live camera resending its window
        2 => 11, // a serial backlog
        _ => 15, // a camera backlog
    };
    for id in 1..=3 {
        c.attach(id);
    }
    // Each entry takes 100 ms to write; live always has more, in entries ten times the others'.
    let mut now = t0;
    let mut served: HashMap<u64, Vec<Instant>> = HashMap::new();
    c.push(2, b(100), now);
    c.push(3, b(100), now);
    for _ in 0..200 {
        if c.progress(1).1 == 0 {
            c.push(1, b(1000), now);
        }
        for id in [2, 3] {
            if c.progress(id).1 == 0 {
                c.push(id, b(100), now);
            }
        }
        let id = c.next(now, rank).map(|n| match n {
            Next::Frame { id, .. } => id,
            Next::Control(_) => 0,
        });
        c.write_waits(now);
        now += ms(100);
        let n = c.progress(id.unwrap()).1;
        c.wrote(n, now);
        c.frame_done(now);
        served.entry(id.unwrap()).or_default().push(now);
    }
    // Live took most of the link ...
    assert!(served[&1].len() >= 180, "{}", served[&1].len());
    // ... and each worse rank got a turn at least every bound plus the frames before it.
    for id in [2, 3] {
        let times = &served[&id];
        assert!(times.len() >= 8, "channel {id}: {}", times.len());
        let gap = times
            .windows(2)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or_default();
        assert!(
            gap <= OVERDUE_AFTER + ms(300),
            "channel {id} waited {gap:?}"
        );
    }
}

#[test]
fn strict_rank_order_is_kept_while_nothing_is_overdue() {
    let t0 = Instant::now();
    let mut c = ConnectionState::new(t0);
    c.attach(1);
    c.attach(2);
    c.push(2, b(10), t0);
    c.push(1, b(10), t0);
    c.control(cmd(3));
    let rank = |id: u64| if id == 1 { 0 } else { 11 };
    // Control before every frame, then rank order.
    assert_eq!(c.next(t0, rank), Some(Next::Control(cmd(3))));
    c.frame_done(t0);
    assert_eq!(write_one(&mut c, t0, rank), Some(1));
    assert_eq!(write_one(&mut c, t0, rank), Some(2));
    assert_eq!(c.next(t0, rank), None);
}

#[test]
fn progress_is_credited_to_the_channel_written_only() {
    let t0 = Instant::now();
    let mut c = ConnectionState::new(t0);
    c.attach(1);
    c.attach(2);
    c.push(1, b(100), t0);
    c.push(2, b(50), t0);
    let Some(Next::Frame { id: 1, .. }) = c.next(t0, |_| 0) else {
        panic!("channel 1 first");
    };
    c.write_waits(t0);
    assert_eq!(c.wrote(60, t0), Some(1));
    assert_eq!(c.progress(1), (60, 40));
    // The waiting channel is not credited with another's bytes.
    assert_eq!(c.progress(2), (0, 50));
    assert_eq!(c.wrote(40, t0), Some(1));
    c.frame_done(t0);
    assert_eq!(c.progress(1), (100, 0));
    // A control command credits nobody.
    c.control(cmd(8));
    assert!(matches!(c.next(t0, |_| 0), Some(Next::Control(_))));
    assert_eq!(c.wrote(8, t0), None);
    c.frame_done(t0);
    assert_eq!(c.progress(2), (0, 50));
    // A channel detached while written is credited nothing, and nothing fails.
    let Some(Next::Frame { id: 2, .. }) = c.next(t0, |_| 0) else {
        panic!("channel 2");
    };
    assert!(!c.detach(2));
    assert_eq!(c.wrote(50, t0), None);
    c.frame_done(t0);
    assert!(!c.push(2, b(1), t0));
}

#[test]
fn a_waiting_channel_is_told_its_wait_excused_while_others_move_starved_past_a_second_then_over() {
    let t0 = Instant::now();
    let mut c = ConnectionState::new(t0);
    c.attach(1);
    c.attach(2);
    let rank = |id: u64| if id == 1 { 0 } else { 11 };
    c.push(2, b(10), t0);
    let mut now = t0;
    // Live keeps the link busy; the backlog waits.
    let mut told = Vec::new();
    while now < t0 + ms(1600) {
        c.push(1, b(10), now);
        assert_eq!(write_one(&mut c, now, rank), Some(1));
        if (now - t0).as_millis() % TICK.as_millis() == 0 {
            assert_eq!(c.tick(now), Tick::Quiet);
        }
        told.extend(c.take_told());
        now += ms(100);
    }
    let waits: Vec<_> = told.iter().filter(|(id, _)| *id == 2).collect();
    assert!(!waits.is_empty());
    assert!(waits.iter().all(|(_, w)| w.excuses()), "{waits:?}");
    assert!(
        told.iter().all(|(id, _)| *id == 2),
        "live is never told a wait"
    );
    let (_, last) = waits.last().unwrap();
    assert!(last.starved() && last.waited() >= STARVED_AFTER, "{last:?}");
    // Overdue at 2 s: taken, and told its wait is over.
    now = t0 + OVERDUE_AFTER;
    c.push(1, b(10), now);
    assert_eq!(write_one(&mut c, now, rank), Some(2));
    assert_eq!(c.take_told(), vec![(2, Wait::Over)]);
    assert_eq!(c.tick(now), Tick::Quiet);
    assert!(c.take_told().iter().all(|(id, _)| *id != 2));
    assert!(!Wait::Over.starved() && !Wait::Over.excuses());
}

#[test]
fn a_wait_on_a_connection_that_moves_nothing_is_not_excused() {
    let t0 = Instant::now();
    let mut c = ConnectionState::new(t0);
    c.attach(1);
    c.attach(2);
    c.push(1, b(100), t0);
    c.push(2, b(10), t0);
    // Channel 1's write never returns and the broker says nothing: a dead link, not a wait.
    assert!(matches!(c.next(t0, |_| 0), Some(Next::Frame { id: 1, .. })));
    c.write_waits(t0);
    assert_eq!(c.tick(t0 + ms(3000)), Tick::Quiet);
    assert_eq!(
        c.take_told(),
        vec![(
            2,
            Wait::Queued {
                waited: ms(3000),
                excused: false
            }
        )]
    );
    assert!(!c.throttled(t0 + ms(3000)));
}

#[test]
fn blocked_writes_while_the_broker_still_talks_are_a_throttle_not_a_dead_link() {
    let t0 = Instant::now();
    let mut c = ConnectionState::new(t0);
    c.attach(1);
    c.attach(2);
    c.push(1, b(1 << 20), t0);
    c.push(2, b(10), t0);
    assert!(matches!(c.next(t0, |_| 0), Some(Next::Frame { id: 1, .. })));
    c.write_waits(t0);
    // A receipt (or the broker's PING) after the socket stopped taking bytes.
    c.inbound(t0 + ms(200));
    assert!(!c.throttled(t0 + ms(900)), "not before THROTTLED_AFTER");
    let at = t0 + THROTTLED_AFTER;
    assert!(c.throttled(at));
    assert_eq!(c.tick(at), Tick::Quiet);
    // The channel written and the one waiting are both excused.
    assert_eq!(
        c.take_told(),
        vec![
            (1, Wait::Held),
            (
                2,
                Wait::Queued {
                    waited: THROTTLED_AFTER,
                    excused: true
                }
            )
        ]
    );
    // A request unanswered meanwhile does not prove it dead.
    assert!(!c.silent_since(t0 + ms(500), at));
    // A rate limit: the broker reads a burst at the start of every second and nothing between,
    // talking meanwhile (receipts; its PING every 30 s): 80 s of it, never dead, the waiting
    // channel excused at every tick (the connection moved, or it is throttled).
    let mut now = at;
    let mut pings = 0;
    while now < t0 + Duration::from_secs(80) {
        now += TICK;
        if (now - t0).as_millis() % 1000 == 0 {
            assert_eq!(c.wrote(PROGRESS_BYTES, now), Some(1));
            c.write_waits(now);
            c.inbound(now);
        }
        match c.tick(now) {
            Tick::Dead => panic!("a throttled connection ended at {:?}", now - t0),
            Tick::Ping => pings += 1,
            Tick::Quiet => {}
        }
        for (id, wait) in c.take_told() {
            assert!(id != 2 || wait.excuses(), "{wait:?} at {:?}", now - t0);
        }
    }
    assert!(pings <= 1, "{pings}");
    // The link stops moving while the broker still talks (receipts for what got through; a
    // trickle in rigd's direction): a throttle for THROTTLE_STILL after the last move, then not.
    c.write_waits(now);
    c.inbound(now + ms(100));
    assert!(c.throttled(now + THROTTLED_AFTER));
    let still = now + THROTTLE_STILL;
    assert!(!c.throttled(still));
    assert_eq!(c.tick(still), Tick::Quiet);
    let told = c.take_told();
    assert!(told.iter().all(|(_, w)| !w.excuses()), "{told:?}");
    now = still;
    // The broker reads again: the write returns, credited, the throttle over.
    assert_eq!(c.wrote(100, now), Some(1));
    assert!(!c.throttled(now));
    // Silence past THROTTLE_QUIET while blocked: no longer excused.
    c.frame_done(now);
    c.push(1, b(10), now);
    assert!(matches!(c.next(now, |_| 0), Some(Next::Frame { .. })));
    c.write_waits(now);
    c.inbound(now + ms(100));
    assert!(c.throttled(now + THROTTLED_AFTER));
    assert!(!c.throttled(now + ms(100) + THROTTLE_QUIET));
    assert!(c.silent_since(now + ms(200), now + ms(100) + THROTTLE_QUIET));
}

#[test]
fn a_quiet_broker_is_pinged_every_few_seconds_and_a_silent_one_ends_the_connection() {
    let t0 = Instant::now();
    let mut c = ConnectionState::new(t0);
    assert_eq!(c.tick(t0 + PING_IDLE), Tick::Quiet);
    let first = t0 + PING_IDLE + ms(1);
    assert_eq!(c.tick(first), Tick::Ping);
    assert_eq!(c.tick(first + TICK), Tick::Quiet);
    assert_eq!(c.tick(first + PING_EVERY), Tick::Ping);
    // An answer: quiet again, the next ping after another PING_IDLE.
    c.inbound(first + PING_EVERY + ms(10));
    assert_eq!(c.tick(first + PING_EVERY + TICK), Tick::Quiet);
    assert_eq!(c.last_inbound(), first + PING_EVERY + ms(10));
    // A command from the past never moves the last one back.
    c.inbound(t0);
    assert_eq!(c.last_inbound(), first + PING_EVERY + ms(10));
    let last = c.last_inbound();
    assert_eq!(c.tick(last + DEAD_IDLE), Tick::Ping);
    assert_eq!(c.tick(last + DEAD_IDLE + ms(1)), Tick::Dead);
    // A request unanswered on a silent connection proves it dead.
    assert!(c.silent_since(last + ms(1), last + ms(5000)));
    assert!(!c.silent_since(last, last + ms(5000)));
}

#[test]
fn the_end_and_a_detach_tell_the_channels_told_they_wait() {
    let t0 = Instant::now();
    let mut c = ConnectionState::new(t0);
    for id in 1..=3 {
        c.attach(id);
    }
    c.push(1, b(10), t0);
    c.push(2, b(10), t0);
    assert_eq!(c.tick(t0 + TICK), Tick::Quiet);
    assert_eq!(c.take_told().len(), 2);
    assert!(c.detach(1));
    assert!(!c.detach(3));
    c.control(cmd(1));
    assert_eq!(c.end(), vec![2]);
    assert_eq!(c.next(t0, |_| 0), None, "nothing left to write");
}

#[test]
fn frames_pushed_while_their_channel_is_written_wait_from_the_end_of_the_write() {
    let t0 = Instant::now();
    let mut c = ConnectionState::new(t0);
    c.attach(1);
    c.push(1, b(10), t0);
    assert!(c.next(t0, |_| 0).is_some());
    c.push(1, b(10), t0 + ms(100));
    c.frame_done(t0 + ms(900));
    assert_eq!(c.tick(t0 + ms(1000)), Tick::Quiet);
    // (Excused: the write that ended 100 ms ago moved the connection.)
    assert_eq!(
        c.take_told(),
        vec![(
            1,
            Wait::Queued {
                waited: ms(100),
                excused: true
            }
        )]
    );
}

#[test]
fn retired_sockets_are_reset_when_their_broker_answers_again_expired_or_beyond_the_most_kept() {
    let t0 = Instant::now();
    let mut r = Retired::default();
    assert!(r.keep("b1", 1, t0).is_empty());
    assert!(r.keep("b2", 2, t0).is_empty());
    // Another broker's answer leaves b1's kept.
    assert_eq!(r.answered("b2", t0), vec![2]);
    assert_eq!(r.answered("b1", t0), vec![1]);
    assert!(r.answered("b1", t0).is_empty());
    // At most RETIRED_MAX per broker: the oldest goes.
    for s in 0..RETIRED_MAX as u32 {
        assert!(r.keep("b", s, t0).is_empty());
    }
    assert_eq!(r.keep("b", 99, t0), vec![0]);
    // Kept longer than RETIRED_FOR: reset at the next call.
    let later = t0 + RETIRED_FOR;
    let mut expired = r.keep("c", 7, later);
    expired.sort();
    let mut want: Vec<u32> = (1..RETIRED_MAX as u32).collect();
    want.push(99);
    assert_eq!(expired, want);
    assert_eq!(r.take_all(), vec![7]);
    assert!(r.take_all().is_empty());
}

#[test]
fn a_turn_out_of_rank_takes_every_queued_entry_its_deficit_covers() {
    let t0 = Instant::now();
    let mut c = ConnectionState::new(t0);
    c.attach(1);
    c.attach(2);
    let rank = |id: u64| if id == 1 { 0 } else { 9 };
    // A serial source of a worse priority queues one small entry per frame.
    for _ in 0..50 {
        c.push(2, b(100), t0);
    }
    let mut now = t0;
    while now < t0 + OVERDUE_AFTER {
        c.push(1, b(1000), now);
        assert_eq!(write_one(&mut c, now, rank), Some(1));
        now += ms(100);
    }
    // 20 kB written in rank order: a deficit of 20 kB / 9, 22 of its 50 entries of 100 bytes.
    let Some(Next::Frame { id: 2, bytes }) = c.next(now, rank) else {
        panic!("overdue");
    };
    assert_eq!(bytes.len(), 2200);
    assert_eq!(c.progress(2).1, 5000);
    // In rank order, one entry a turn, as before.
    c.frame_done(now);
    c.push(2, b(100), now);
    c.push(2, b(100), now);
    assert!(matches!(c.next(now, |_| 0), Some(Next::Frame { id: 2, bytes }) if bytes.len() == 100));
}

#[test]
fn the_channels_waiting_behind_better_ranks_take_at_most_a_tenth_of_the_link_together() {
    let t0 = Instant::now();
    let mut c = ConnectionState::new(t0);
    for id in 1..=4 {
        c.attach(id);
    }
    // Live (1) never empties; three backlogs of 90 kB entries wait behind it.
    let rank = |id: u64| if id == 1 { 0 } else { 10 + id as usize };
    let mut now = t0;
    let mut bytes: HashMap<u64, usize> = HashMap::new();
    for _ in 0..2000 {
        for id in 1..=4 {
            if c.progress(id).1 == 0 {
                c.push(id, b(if id == 1 { 25_000 } else { 90_000 }), now);
            }
        }
        let n = match c.next(now, rank) {
            Some(Next::Frame { id, bytes: f }) => {
                *bytes.entry(id).or_default() += f.len();
                f.len()
            }
            other => panic!("{other:?}"),
        };
        c.write_waits(now);
        now += Duration::from_micros(n as u64 * 4); // 250 kB/s
        c.wrote(n, now);
        c.frame_done(now);
    }
    let total: usize = bytes.values().sum();
    let behind: usize = (2..=4).map(|id| bytes.get(&id).copied().unwrap_or(0)).sum();
    assert!(behind * 10 <= total + 90_000, "{bytes:?}");
    // ... and each of them moved.
    for id in 2..=4 {
        assert!(
            bytes.get(&id).copied().unwrap_or(0) >= 5 * 90_000,
            "{bytes:?}"
        );
    }
}
