//! The window's decisions without a broker: each case of issue 14 that lives in pure logic.

use super::*;
use proptest::prelude::*;
use rigd_drivers::{ClockState, Frame, Media};
use std::sync::Arc;

const MB: usize = 1 << 20;

fn cfg() -> WindowConfig {
    WindowConfig {
        producer_name: "rigd-van-cam".into(),
        rig: "van".into(),
        bucket_ms: 33,
        group_buckets: 1,
        max_in_flight: 100,
        max_in_flight_bytes: 64 * MB,
        max_frame_bytes: 50 * MB,
        compression: Compression::None,
        encryption: None,
        batch: BatchPolicy::default(),
        progress_timeout: Duration::from_secs(30),
        stall_after: Duration::from_secs(5),
        run: 1,
        properties: Vec::new(),
        max_chunk_bytes: None,
        numbering: None,
    }
}

/// A camera frame of `bytes`; `bucket` decides its key (frames of one bucket may batch).
fn frame(seq: u64, bytes: usize, bucket: i64) -> Held {
    Held::plain(Frame {
        source: Arc::from("cam"),
        seq,
        capture_ns: bucket * 33_000_000 + 1,
        clock: ClockState::Locked,
        media: Media::jpeg(2, 2),
        payload: Bytes::from(vec![seq as u8; bytes]),
    })
}

fn connected(c: WindowConfig, t0: Instant, broker_last: Option<u64>) -> Window {
    let mut w = Window::new(c, t0);
    w.connected(1, 5 * MB, broker_last.map(plan::BrokerLast::id), t0);
    w
}

/// Everything `encode_next` writes now: the sequence ids of the SEND commands.
fn write_all(w: &mut Window, now: Instant) -> Vec<u64> {
    let mut ids = Vec::new();
    loop {
        let mut out = BytesMut::new();
        if w.encode_next(&mut out, now, 1_700_000_000_000).is_none() {
            return ids;
        }
        let cmd = codec::decode(&mut out).unwrap().unwrap();
        ids.push(cmd.send.unwrap().sequence_id);
    }
}

fn acks(w: &mut Window) -> Vec<(u64, Outcome)> {
    w.take_acks().map(|a| (a.seq, a.outcome)).collect()
}

/// Asserts that frame `seq` (3 chunks) is written again whole under generation 1, and answers
/// each chunk with its receipt.
fn resent_whole_and_receipted(w: &mut Window, seq: u64, now: Instant) {
    let again = write_all(w, now);
    assert_eq!(
        again,
        (0..3)
            .map(|c| plan::sequence_id(seq, 1, c))
            .collect::<Vec<_>>()
    );
    for id in again {
        w.on_receipt(id, now).unwrap();
    }
}

#[test]
fn a_frame_is_persisted_only_on_its_last_chunks_receipt() {
    let t0 = Instant::now();
    let mut w = connected(cfg(), t0, None);
    w.submit(frame(0, 12 * MB, 1), t0).unwrap();
    let ids = write_all(&mut w, t0);
    assert_eq!(ids.len(), 3, "12 MiB at a 5 MiB broker limit");
    w.on_receipt(ids[0], t0).unwrap();
    w.on_receipt(ids[1], t0).unwrap();
    assert!(acks(&mut w).is_empty());
    w.on_receipt(ids[2], t0).unwrap();
    assert_eq!(acks(&mut w), vec![(0, Outcome::Persisted)]);
    assert!(w.idle());
}

#[test]
fn a_refused_frame_is_acked_in_submission_order_not_ahead() {
    // Item 5: a too-large frame behind two in flight waits for them.
    let t0 = Instant::now();
    let mut c = cfg();
    c.max_frame_bytes = 2 * MB;
    c.batch.max_messages = 1;
    let mut w = connected(c, t0, None);
    w.submit(frame(0, 1000, 1), t0).unwrap();
    w.submit(frame(1, 1000, 2), t0).unwrap();
    w.submit(frame(2, 3 * MB, 3), t0).unwrap();
    w.submit(frame(3, 1000, 4), t0).unwrap();
    let ids = write_all(&mut w, t0);
    assert_eq!(ids.len(), 3, "the refused frame is never written");
    assert!(
        acks(&mut w).is_empty(),
        "nothing may be acked before frame 0"
    );
    w.on_receipt(ids[0], t0).unwrap();
    w.on_receipt(ids[1], t0).unwrap();
    let a = acks(&mut w);
    assert_eq!(a.len(), 3);
    assert_eq!((a[0].0, a[1].0, a[2].0), (0, 1, 2));
    assert!(matches!(a[2].1, Outcome::Refused(_)));
    w.on_receipt(ids[2], t0).unwrap();
    assert_eq!(acks(&mut w), vec![(3, Outcome::Persisted)]);
}

#[test]
fn after_a_reconnect_everything_without_a_receipt_is_written_again_and_never_assumed_persisted() {
    // Item 3: the broker's last_sequence_id on a reconnect counts pushed, not persisted, writes.
    let t0 = Instant::now();
    let mut c = cfg();
    c.batch.max_messages = 1;
    let mut w = connected(c, t0, None);
    for seq in 0..3 {
        w.submit(frame(seq, 1000, seq as i64), t0).unwrap();
    }
    let first = write_all(&mut w, t0);
    w.on_receipt(first[0], t0).unwrap();
    assert_eq!(acks(&mut w), vec![(0, Outcome::Persisted)]);
    w.disconnected();
    // The new connection's broker says it has pushed up to frame 2: no ack from that.
    w.connected(
        2,
        5 * MB,
        Some(plan::BrokerLast::id(plan::sequence_id(2, 0, 0))),
        t0,
    );
    assert!(acks(&mut w).is_empty());
    let again = write_all(&mut w, t0);
    assert_eq!(
        again,
        first[1..].to_vec(),
        "frames 1 and 2 go out again, same ids"
    );
    // Deduplicated or not, the broker answers each with a receipt.
    w.on_receipt(again[0], t0).unwrap();
    w.on_receipt(again[1], t0).unwrap();
    assert_eq!(
        acks(&mut w),
        vec![(1, Outcome::Persisted), (2, Outcome::Persisted)]
    );
}

#[test]
fn a_reconnect_with_chunks_in_flight_sends_the_frame_whole_under_a_new_uuid() {
    // The loss seen around topic moves: chunk 1 stored, its receipt lost; sent again under the
    // same id it was not deduplicated (the broker's highest pushed id) and reached consumers
    // twice under one uuid, which then dropped the whole frame.
    let t0 = Instant::now();
    let mut w = connected(cfg(), t0, None);
    w.submit(frame(5, 12 * MB, 1), t0).unwrap();
    let first = sends(&mut w, t0);
    assert_eq!(first.len(), 3);
    w.on_receipt(first[0].0.send.as_ref().unwrap().sequence_id, t0)
        .unwrap();
    w.disconnected();
    w.connected(
        2,
        5 * MB,
        Some(plan::BrokerLast::id(plan::sequence_id(5, 0, 1))),
        t0,
    );
    let again = sends(&mut w, t0);
    assert_eq!(again.len(), 3, "every chunk again");
    let uuid = |s: &(BaseCommand, MessageMetadata, Bytes)| s.1.uuid.clone().unwrap();
    assert_ne!(
        uuid(&again[0]),
        uuid(&first[0]),
        "under a uuid nobody has seen"
    );
    assert!(again.iter().all(|s| uuid(s) == uuid(&again[0])));
    let ids: Vec<u64> = again
        .iter()
        .map(|s| s.0.send.as_ref().unwrap().sequence_id)
        .collect();
    assert_eq!(
        ids,
        (0..3)
            .map(|c| plan::sequence_id(5, 1, c))
            .collect::<Vec<_>>()
    );
    assert!(
        ids[0] > plan::sequence_id(5, 0, 2),
        "above every id of the first cut"
    );
    for id in ids {
        w.on_receipt(id, t0).unwrap();
    }
    assert_eq!(acks(&mut w), vec![(5, Outcome::Persisted)]);
}

#[test]
fn a_reconnect_mid_frame_with_nothing_in_flight_resumes_at_the_first_chunk_without_a_receipt() {
    // Under a budget a frame's chunks go out as it allows: chunk 0 receipted, nothing else
    // written when the link went. The consumer holds chunk 0 and nothing more of the uuid.
    let t0 = Instant::now();
    let mut w = connected(cfg(), t0, None);
    w.submit(frame(5, 12 * MB, 1), t0).unwrap();
    let mut out = BytesMut::new();
    w.encode_next(&mut out, t0, 0).unwrap();
    let id0 = plan::sequence_id(5, 0, 0);
    w.on_receipt(id0, t0).unwrap();
    w.disconnected();
    w.connected(2, 5 * MB, Some(plan::BrokerLast::id(id0)), t0);
    let ids = write_all(&mut w, t0);
    assert_eq!(
        ids,
        vec![plan::sequence_id(5, 0, 1), plan::sequence_id(5, 0, 2)]
    );
    for id in ids {
        w.on_receipt(id, t0).unwrap();
    }
    assert_eq!(acks(&mut w), vec![(5, Outcome::Persisted)]);
}

#[test]
fn a_reconnect_after_the_broker_took_the_last_chunk_sends_only_it_for_its_duplicate_receipt() {
    // Sent again, chunk 1 would be stored twice (the broker deduplicates last chunks only) and
    // its receipt would come after the last chunk's immediate duplicate receipt: out of order,
    // a reconnect, and the same again (the loop the connection-reset test found).
    let t0 = Instant::now();
    let mut w = connected(cfg(), t0, None);
    w.submit(frame(5, 12 * MB, 1), t0).unwrap();
    let ids = write_all(&mut w, t0);
    w.on_receipt(ids[0], t0).unwrap();
    w.disconnected();
    w.connected(2, 5 * MB, Some(plan::BrokerLast::id(ids[2])), t0);
    assert_eq!(write_all(&mut w, t0), vec![ids[2]]);
    // A late receipt for an earlier chunk (the broker answered the lost connection) changes nothing.
    w.on_receipt(ids[1], t0).unwrap();
    assert!(acks(&mut w).is_empty());
    w.on_receipt(ids[2], t0).unwrap();
    assert_eq!(acks(&mut w), vec![(5, Outcome::Persisted)]);
}

#[test]
fn chunks_spared_on_the_brokers_word_are_in_flight_again_when_the_link_goes_before_the_last_receipt(
) {
    // CI lost frames 28 and 29 this way: a reset while both were in flight; the new connection's
    // broker named frame 29's last chunk, its highest *pushed* id (the writes still pending), so
    // only the last chunks were due. The topic was unloaded before they went, the pending writes
    // failed, and the next connection resumed at the last chunks: stored alone, consumers could
    // not assemble either frame ("uncached chunk").
    let t0 = Instant::now();
    let mut w = connected(cfg(), t0, None);
    w.submit(frame(5, 12 * MB, 1), t0).unwrap();
    let ids = write_all(&mut w, t0);
    assert_eq!(ids.len(), 3);
    w.disconnected();
    w.connected(2, 5 * MB, Some(plan::BrokerLast::id(ids[2])), t0);
    // Gone before the last chunk was written; the pending writes failed and the broker names
    // the previous frame: the frame goes whole, under a new uuid.
    w.disconnected();
    w.connected(
        3,
        5 * MB,
        Some(plan::BrokerLast::id(plan::sequence_id(4, 0, 2))),
        t0,
    );
    resent_whole_and_receipted(&mut w, 5, t0);
    assert_eq!(acks(&mut w), vec![(5, Outcome::Persisted)]);
    // The broker's word twice in a row: the last chunk alone, each time.
    w.submit(frame(6, 12 * MB, 2), t0).unwrap();
    let ids = write_all(&mut w, t0);
    for k in 4..6 {
        w.disconnected();
        w.connected(k, 5 * MB, Some(plan::BrokerLast::id(ids[2])), t0);
    }
    assert_eq!(write_all(&mut w, t0), vec![ids[2]]);
    w.on_receipt(ids[2], t0).unwrap();
    assert_eq!(acks(&mut w), vec![(6, Outcome::Persisted)]);
}

#[test]
fn a_frame_cut_mid_send_more_often_than_there_are_generations_keeps_getting_new_uuids() {
    // CI: a 12 MB frame cut 8 times between its chunks. At the last generation the frame went
    // back to resuming under its uuid, the broker stored a chunk twice, and the consumer dropped
    // the frame.
    let t0 = Instant::now();
    let mut w = connected(cfg(), t0, None);
    w.submit(frame(5, 12 * MB, 1), t0).unwrap();
    let uuid = |s: &(BaseCommand, MessageMetadata, Bytes)| s.1.uuid.clone().unwrap();
    let mut seen = std::collections::HashSet::new();
    let mut last_ids = Vec::new();
    for _ in 0..=plan::MAX_GENERATION + 3 {
        let sent = sends(&mut w, t0);
        assert_eq!(sent.len(), 3, "every chunk again");
        assert!(sent.iter().all(|s| uuid(s) == uuid(&sent[0])));
        assert!(
            seen.insert(uuid(&sent[0])),
            "a uuid used twice: {}",
            uuid(&sent[0])
        );
        last_ids = sent
            .iter()
            .map(|s| s.0.send.as_ref().unwrap().sequence_id)
            .collect();
        w.on_receipt(last_ids[0], t0).unwrap();
        w.disconnected();
        // The broker's highest pushed id is still the previous frame's.
        w.connected(
            2,
            5 * MB,
            Some(plan::BrokerLast::id(plan::sequence_id(4, 0, 0))),
            t0,
        );
    }
    assert_eq!(
        last_ids,
        (0..3)
            .map(|c| plan::sequence_id(5, plan::MAX_GENERATION, c))
            .collect::<Vec<_>>()
    );
    let ids = write_all(&mut w, t0);
    for id in ids {
        w.on_receipt(id, t0).unwrap();
    }
    assert_eq!(acks(&mut w), vec![(5, Outcome::Persisted)]);
}

#[test]
fn a_reconnect_with_chunks_in_flight_of_a_frame_whose_last_chunk_was_not_pushed_sends_it_whole() {
    // Pulsar 3.0.7 moves its highest pushed id with last chunks only: after chunk 1 of frame 5
    // was stored without a receipt, the broker still names frame 4's last chunk.
    let t0 = Instant::now();
    let mut w = connected(cfg(), t0, None);
    w.submit(frame(4, 1000, 1), t0).unwrap();
    w.submit(frame(5, 12 * MB, 1), t0).unwrap();
    let ids = write_all(&mut w, t0);
    assert_eq!(ids.len(), 4);
    w.on_receipt(ids[0], t0).unwrap();
    w.on_receipt(ids[1], t0).unwrap();
    w.disconnected();
    w.connected(2, 5 * MB, Some(plan::BrokerLast::id(ids[0])), t0);
    resent_whole_and_receipted(&mut w, 5, t0);
    assert_eq!(
        acks(&mut w),
        vec![(4, Outcome::Persisted), (5, Outcome::Persisted)]
    );
}

#[test]
fn after_a_restart_frames_the_broker_held_at_first_creation_are_acked_without_a_send() {
    let t0 = Instant::now();
    let mut w = connected(cfg(), t0, Some(plan::sequence_id(9, 0, 0)));
    w.submit(frame(8, 1000, 1), t0).unwrap();
    w.submit(frame(9, 1000, 1), t0).unwrap();
    w.submit(frame(10, 1000, 1), t0).unwrap();
    w.close_batch_if_due(t0 + Duration::from_secs(1));
    let ids = write_all(&mut w, t0);
    assert_eq!(ids, vec![plan::sequence_id(10, 0, 0)]);
    let a = acks(&mut w);
    assert_eq!(
        a,
        vec![
            (8, Outcome::AlreadyPersisted),
            (9, Outcome::AlreadyPersisted)
        ]
    );
}

#[test]
fn a_silent_link_is_stalled_then_dead_but_a_slow_one_that_moves_is_neither() {
    // Item 1 and item 10.
    let t0 = Instant::now();
    let mut w = connected(cfg(), t0, None);
    assert_eq!(
        w.health(t0 + Duration::from_secs(600)),
        Health::Moving,
        "idle is fine"
    );
    w.submit(frame(0, 12 * MB, 1), t0).unwrap();
    write_all(&mut w, t0);
    // A 1 Mbit/s link: the socket takes 125 kB every second for two minutes.
    for s in 1..120 {
        let t = t0 + Duration::from_secs(s);
        w.progressed(125_000, false, t);
        assert_eq!(w.health(t), Health::Moving, "at {s} s");
    }
    let last = t0 + Duration::from_secs(119);
    assert_eq!(w.health(last + Duration::from_secs(6)), Health::Stalled);
    assert!(
        !w.accepts(last + Duration::from_secs(6)),
        "a stalled link takes no new frames"
    );
    assert_eq!(w.health(last + Duration::from_secs(31)), Health::Dead);
    // A receipt is progress too.
    let ids = write_all(&mut w, t0);
    assert!(ids.is_empty());
    w.on_receipt(plan::sequence_id(0, 0, 0), last + Duration::from_secs(6))
        .unwrap();
    assert_eq!(w.health(last + Duration::from_secs(7)), Health::Moving);
}

#[test]
fn a_link_slowed_to_a_trickle_is_stalled_then_dead_though_the_socket_takes_a_little() {
    let t0 = Instant::now();
    let mut w = connected(cfg(), t0, None);
    w.submit(frame(0, 12 * MB, 1), t0).unwrap();
    write_all(&mut w, t0);
    // 8 kbit/s: 1 kB a second, so 16 KiB (progress) every 17 s: stalled 5 s after each.
    let mut health = Vec::new();
    for s in 1..=40 {
        let t = t0 + Duration::from_secs(s);
        w.progressed(1_000, false, t);
        health.push(w.health(t));
    }
    let at = |s: usize| health[s - 1];
    assert_eq!(at(4), Health::Moving, "{health:?}");
    assert_eq!(at(5), Health::Stalled, "{health:?}");
    assert_eq!(at(17), Health::Moving, "16 KiB went: {health:?}");
    assert_eq!(at(22), Health::Stalled, "{health:?}");
    // It still moves: slow, not dead (no reconnect, nothing resent).
    assert!(!health.contains(&Health::Dead), "{health:?}");
    // The last bytes of what waited are progress however few (a small frame on a slow link).
    let t = t0 + Duration::from_secs(41);
    w.progressed(200, true, t);
    assert_eq!(w.health(t + Duration::from_secs(4)), Health::Moving);
}

#[test]
fn the_progress_clock_starts_with_the_first_write_not_with_an_earlier_idle_period() {
    let t0 = Instant::now();
    let mut w = connected(cfg(), t0, None);
    let later = t0 + Duration::from_secs(100);
    w.submit(frame(0, 10_000, 1), later).unwrap();
    w.close_batch_if_due(later + Duration::from_millis(5));
    write_all(&mut w, later);
    assert_eq!(w.health(later + Duration::from_secs(1)), Health::Moving);
}

#[test]
fn a_source_idle_for_long_is_not_stalled_by_its_next_frames() {
    let t0 = Instant::now();
    let mut c = cfg();
    c.batch.max_messages = 1;
    let mut w = connected(c, t0, None);
    let later = t0 + Duration::from_secs(600);
    w.submit(frame(0, 1000, 1), later).unwrap();
    // Not yet written by the session: a second frame is still taken.
    assert!(w.submit(frame(1, 1000, 2), later).is_ok());
    assert_eq!(w.health(later), Health::Moving);
}

#[test]
fn a_broker_with_a_smaller_message_size_gets_the_frame_cut_anew_under_a_new_generation() {
    let t0 = Instant::now();
    let mut w = connected(cfg(), t0, None);
    w.submit(frame(3, 8 * MB, 1), t0).unwrap();
    let first = write_all(&mut w, t0);
    assert_eq!(first.len(), 2);
    w.on_receipt(first[0], t0).unwrap();
    w.disconnected();
    w.connected(2, MB, None, t0);
    let again = write_all(&mut w, t0);
    assert!(again.len() >= 8, "cut for 1 MiB");
    assert!(again[0] > first[1], "new ids above every earlier one");
    assert_eq!(plan::capture_seq(again[0]), 3);
    for id in &again {
        w.on_receipt(*id, t0).unwrap();
    }
    assert_eq!(acks(&mut w), vec![(3, Outcome::Persisted)]);
}

#[test]
fn send_errors_are_handled_by_kind() {
    // Item 4.
    let t0 = Instant::now();
    let mut c = cfg();
    c.batch.max_messages = 1;
    let mut w = connected(c, t0, None);
    for seq in 0..3 {
        w.submit(frame(seq, 1000, seq as i64), t0).unwrap();
    }
    let ids = write_all(&mut w, t0);
    // A topic policy (max message size) refuses frame 0: refused, the others go on.
    let r = w.on_send_error(ids[0], ServerError::NotAllowedError as i32, "too big", t0);
    assert_eq!(r, OnSendError::Refused);
    w.on_receipt(ids[1], t0).unwrap();
    let a = acks(&mut w);
    assert_eq!(a.len(), 2);
    assert!(matches!(&a[0], (0, Outcome::Refused(why)) if why.contains("too big")));
    assert_eq!(a[1], (1, Outcome::Persisted));
    // Transient kinds reconnect.
    for kind in [
        ServerError::PersistenceError,
        ServerError::ProducerBlockedQuotaExceededException,
        ServerError::ChecksumError,
        ServerError::UnknownError,
    ] {
        assert!(matches!(
            w.on_send_error(ids[2], kind as i32, "x", t0),
            OnSendError::Reconnect(_)
        ));
    }
    // A terminated topic takes nothing more; what is held stays held (spooled at shutdown).
    let r = w.on_send_error(ids[2], ServerError::TopicTerminatedError as i32, "gone", t0);
    assert!(matches!(r, OnSendError::Terminated(_)));
    assert!(w.terminated().is_some());
    assert!(w.submit(frame(3, 10, 3), t0).is_err());
    assert_eq!(w.take_all().iter().map(|f| f.seq).collect::<Vec<_>>(), [2]);
}

#[test]
fn a_topic_terminated_under_frames_in_flight_takes_frames_again_once_a_producer_is_created() {
    // Issue 31.1: TopicTerminatedError as a SEND_ERROR, then the topic is deleted and recreated;
    // the next producer creation must clear the termination.
    let t0 = Instant::now();
    let mut w = connected(cfg(), t0, None);
    w.submit(frame(0, 3 * MB, 1), t0).unwrap();
    let ids = write_all(&mut w, t0);
    let r = w.on_send_error(ids[0], ServerError::TopicTerminatedError as i32, "gone", t0);
    assert!(matches!(r, OnSendError::Terminated(_)));
    w.disconnected();
    assert!(!w.accepts(t0));
    w.connected(2, 5 * MB, None, t0);
    assert!(w.terminated().is_none());
    assert!(
        w.accepts(t0),
        "a new producer on the recreated topic takes frames"
    );
    // The frame held across it is written again and completes.
    let ids = write_all(&mut w, t0);
    assert_eq!(ids.len(), 1);
    w.submit(frame(1, MB, 2), t0).unwrap();
    let more = write_all(&mut w, t0);
    for id in ids.iter().chain(&more) {
        w.on_receipt(*id, t0).unwrap();
    }
    assert_eq!(
        acks(&mut w),
        vec![(0, Outcome::Persisted), (1, Outcome::Persisted)]
    );
}

#[test]
fn batches_stay_within_the_brokers_message_size() {
    // Item 5: batch-max-bytes above the broker's limit must not make a batch the broker refuses.
    let t0 = Instant::now();
    let mut c = cfg();
    c.batch.max_bytes = 64 * MB;
    c.batch.max_messages = 10_000;
    c.max_in_flight = 1000;
    let mut w = Window::new(c, t0);
    w.connected(1, 1 << 20, None, t0);
    for seq in 0..200 {
        assert!(w.submit(frame(seq, 40_000, 7), t0).is_ok());
    }
    w.close_batch_if_due(t0 + Duration::from_secs(1));
    let mut writes = 0;
    loop {
        let mut out = BytesMut::new();
        if w.encode_next(&mut out, t0, 1_700_000_000_000).is_none() {
            break;
        }
        writes += 1;
        assert!(out.len() <= 1 << 20, "a SEND of {} bytes", out.len());
    }
    assert!(writes > 1);
}

#[test]
fn the_window_is_bounded_and_gives_frames_back_when_full_or_down() {
    let t0 = Instant::now();
    let mut c = cfg();
    c.max_in_flight = 3;
    let mut w = Window::new(c, t0);
    assert!(w.submit(frame(0, 10, 1), t0).is_err(), "no session");
    w.connected(1, 5 * MB, None, t0);
    for seq in 0..3 {
        w.submit(frame(seq, 10, 1), t0).unwrap();
    }
    assert_eq!(w.submit(frame(3, 10, 1), t0).unwrap_err().seq, 3);
    w.close();
    assert_eq!(w.frames(), 3);
}

#[test]
fn take_all_returns_every_unacked_frame_in_order_including_the_open_batch() {
    let t0 = Instant::now();
    let mut c = cfg();
    c.max_frame_bytes = 2 * MB;
    let mut w = connected(c, t0, None);
    w.submit(frame(0, 3 * MB, 1), t0).unwrap(); // refused at once, front
    w.submit(frame(1, MB, 2), t0).unwrap(); // alone
    w.submit(frame(2, 3 * MB, 3), t0).unwrap(); // refused behind 1: not acked yet
    w.submit(frame(3, 100, 4), t0).unwrap(); // open batch
    w.submit(frame(4, 100, 4), t0).unwrap();
    assert_eq!(acks(&mut w).len(), 1);
    write_all(&mut w, t0);
    let left: Vec<u64> = w.take_all().iter().map(|f| f.seq).collect();
    assert_eq!(left, vec![1, 2, 3, 4]);
    assert!(w.idle());
}

#[derive(Debug, Clone)]
enum Step {
    Submit(usize),
    Write,
    Receipt,
    Reconnect,
    BatchDue,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => prop_oneof![Just(100usize), Just(30_000), Just(3 * MB), Just(7 * MB)].prop_map(Step::Submit),
        3 => Just(Step::Write),
        3 => Just(Step::Receipt),
        1 => Just(Step::Reconnect),
        1 => Just(Step::BatchDue),
    ]
}

proptest! {
    /// Whatever happens on the link, every frame taken ends acked once (in order) or handed back
    /// by take_all once; a refused or rejected frame is never lost in between.
    #[test]
    fn every_submitted_frame_is_acked_once_in_order_or_handed_back(steps in proptest::collection::vec(step(), 1..80)) {
        let t0 = Instant::now();
        let mut c = cfg();
        c.max_in_flight = 20;
        c.max_frame_bytes = 6 * MB;
        let mut w = connected(c, t0, None);
        let mut taken = Vec::new();
        let mut acked = Vec::new();
        // What the broker received and will answer, in order.
        let mut wire: VecDeque<u64> = VecDeque::new();
        let mut seq = 0u64;
        let mut session = 1;
        for (i, s) in steps.iter().enumerate() {
            let now = t0 + Duration::from_millis(i as u64);
            match s {
                Step::Submit(bytes) => {
                    if w.submit(frame(seq, *bytes, (seq / 3) as i64), now).is_ok() {
                        taken.push(seq);
                    }
                    seq += 1;
                }
                Step::Write => {
                    let mut out = BytesMut::new();
                    if w.encode_next(&mut out, now, 1_700_000_000_000).is_some() {
                        let cmd = codec::decode(&mut out).unwrap().unwrap();
                        wire.push_back(cmd.send.unwrap().sequence_id);
                    }
                }
                Step::Receipt => {
                    if let Some(id) = wire.pop_front() {
                        prop_assert!(w.on_receipt(id, now).is_ok());
                    }
                }
                Step::Reconnect => {
                    wire.clear(); // lost in transit
                    w.disconnected();
                    session += 1;
                    // The broker says it has everything written, or keeps no deduplication state
                    // (then chunked frames in flight go out whole under a new generation).
                    let last = (session % 2 == 0).then(|| plan::BrokerLast::id(u64::MAX >> 1));
                    w.connected(session, 5 * MB, last, now);
                }
                Step::BatchDue => w.close_batch_if_due(now + Duration::from_secs(1)),
            }
            acked.extend(w.take_acks().map(|a| a.seq));
        }
        let left: Vec<u64> = w.take_all().iter().map(|f| f.seq).collect();
        let mut all = acked.clone();
        all.extend(&left);
        prop_assert_eq!(&all, &taken, "acked then left, in order, is exactly what was taken");
        prop_assert!(w.idle());
    }
}

/// One SEND frame split into its command, metadata and payload.
fn split_send(mut out: BytesMut) -> (BaseCommand, MessageMetadata, Bytes) {
    use bytes::Buf;
    use prost::Message as _;
    let mut b = out.split().freeze();
    let _total = b.get_u32();
    let cmd_len = b.get_u32() as usize;
    let cmd = BaseCommand::decode(b.split_to(cmd_len)).unwrap();
    assert_eq!(b.get_u16(), 0x0e01, "magic");
    let _crc = b.get_u32();
    let meta_len = b.get_u32() as usize;
    let meta = MessageMetadata::decode(b.split_to(meta_len)).unwrap();
    (cmd, meta, b)
}

fn sends(w: &mut Window, now: Instant) -> Vec<(BaseCommand, MessageMetadata, Bytes)> {
    let mut v = Vec::new();
    loop {
        let mut out = BytesMut::new();
        if w.encode_next(&mut out, now, 1_700_000_000_000).is_none() {
            return v;
        }
        v.push(split_send(out));
    }
}

fn key_of(meta: &MessageMetadata) -> (crate::seal::Key, crate::seal::Piece, usize) {
    let k = &meta.encryption_keys[0];
    let key = crate::seal::Key {
        name: k.key.as_str().into(),
        wrapped: k.value.clone().into(),
    };
    let iv: [u8; 12] = meta.encryption_param.clone().unwrap().try_into().unwrap();
    (
        key,
        crate::seal::Piece {
            iv,
            ciphertext: Bytes::new(),
        },
        meta.encryption_keys.len(),
    )
}

#[test]
fn with_encryption_every_chunk_is_encrypted_on_its_own_and_decrypts() {
    let (public, private) = crate::seal::test_keys();
    let enc = crate::seal::Encryptor::new(public, "fleet", Duration::from_secs(3600)).unwrap();
    let t0 = Instant::now();
    let mut c = cfg();
    c.encryption = Some(Arc::new(enc));
    let mut w = connected(c, t0, None);
    let f = frame(0, 12 * MB, 1);
    let plain = f.payload.clone();
    w.submit(f, t0).unwrap();
    let d = crate::seal::Decryptor::new(private);
    let mut back = Vec::new();
    let sent = sends(&mut w, t0);
    assert_eq!(sent.len(), 3);
    for (_, meta, payload) in &sent {
        let (key, mut piece, n) = key_of(meta);
        assert_eq!((n, key.name.as_ref()), (1, "fleet"));
        assert_eq!(
            meta.total_chunk_msg_size,
            Some(12 * MB as i32),
            "counts the plaintext"
        );
        assert_eq!(meta.uncompressed_size, Some(12 * MB as u32));
        piece.ciphertext = payload.clone();
        back.extend_from_slice(&d.open(&key, &piece).unwrap());
    }
    assert_eq!(&back[..], &plain[..]);
    assert_ne!(sent[0].1.encryption_param, sent[1].1.encryption_param);
}

#[test]
fn a_sealed_frame_goes_out_as_its_pieces_and_is_never_batched() {
    let (public, private) = crate::seal::test_keys();
    let enc = crate::seal::Encryptor::new(public, "fleet", Duration::from_secs(3600)).unwrap();
    let t0 = Instant::now();
    // The window itself has no key: a sealed frame carries its own (a restart after a spool).
    let mut w = connected(cfg(), t0, None);
    let big = enc.seal_frame(
        Compression::None,
        crate::seal::PIECE,
        frame(0, 3 * MB + 5, 1).frame,
    );
    let small = [
        enc.seal_frame(
            Compression::None,
            crate::seal::PIECE,
            frame(1, 100, 2).frame,
        ),
        enc.seal_frame(
            Compression::None,
            crate::seal::PIECE,
            frame(2, 100, 2).frame,
        ),
    ];
    let pieces = crate::seal::Sealed::parse(&big.payload).unwrap().pieces;
    w.submit(big, t0).unwrap();
    for f in small {
        w.submit(f, t0).unwrap();
    }
    let sent = sends(&mut w, t0);
    assert_eq!(
        sent.len(),
        pieces.len() + 2,
        "one chunk per piece, the small ones alone"
    );
    let d = crate::seal::Decryptor::new(private);
    for (i, (cmd, meta, payload)) in sent.iter().take(pieces.len()).enumerate() {
        assert_eq!(payload, &pieces[i].ciphertext);
        assert_eq!(meta.encryption_param.as_deref(), Some(&pieces[i].iv[..]));
        assert_eq!(meta.total_chunk_msg_size, Some((3 * MB + 5) as i32));
        assert_eq!(meta.chunk_id, Some(i as i32));
        assert_eq!(cmd.send.as_ref().unwrap().is_chunk, Some(true));
    }
    for (_, meta, payload) in &sent[pieces.len()..] {
        assert_eq!(meta.num_messages_in_batch, None);
        let (key, mut piece, _) = key_of(meta);
        piece.ciphertext = payload.clone();
        assert_eq!(d.open(&key, &piece).unwrap().len(), 100);
    }
}

#[test]
fn a_reconnect_to_a_smaller_broker_limit_splits_batches_and_refuses_sealed_pieces_that_no_longer_fit(
) {
    // Issue 31.9: a batch or a sealed piece written for a 5 MiB broker was resent as it was to one
    // that takes 256 KiB: the broker's decoder closed the connection each time, forever.
    let (public, _) = crate::seal::test_keys();
    let enc = crate::seal::Encryptor::new(public, "fleet", Duration::from_secs(3600)).unwrap();
    let t0 = Instant::now();
    let mut c = cfg();
    c.batch.max_bytes = 4 * MB;
    c.batch.max_messages = 1000;
    c.max_in_flight = 1000;
    let mut w = connected(c, t0, None);
    for seq in 0..20 {
        w.submit(frame(seq, 60_000, 7), t0).unwrap(); // one batch of 1.2 MB
    }
    w.close_batch_if_due(t0 + Duration::from_secs(1));
    w.submit(
        enc.seal_frame(
            Compression::None,
            crate::seal::PIECE,
            frame(20, 3 * MB, 8).frame,
        ),
        t0,
    )
    .unwrap();
    w.submit(frame(21, 100_000, 9), t0).unwrap();
    w.close_batch_if_due(t0 + Duration::from_secs(2));
    let first = write_all(&mut w, t0);
    assert_eq!(
        first[0],
        plan::sequence_id(0, 0, 0),
        "the batch went as one message"
    );
    w.disconnected();
    w.connected(2, 256 << 10, None, t0);
    let sent = sends(&mut w, t0);
    let mut ids = Vec::new();
    for (cmd, meta, payload) in &sent {
        assert!(payload.len() <= 256 << 10, "{} bytes", payload.len());
        assert_eq!(meta.num_messages_in_batch, None);
        ids.push(cmd.send.as_ref().unwrap().sequence_id);
    }
    // The batch's frames one by one, in order, under their own ids; the sealed frame refused; the
    // last frame alone.
    let expected: Vec<u64> = (0..20)
        .chain([21])
        .map(|seq| plan::sequence_id(seq, 0, 0))
        .collect();
    assert_eq!(ids, expected);
    for id in ids {
        w.on_receipt(id, t0).unwrap();
    }
    let a = acks(&mut w);
    assert_eq!(a.len(), 22);
    assert!(a.iter().all(|(seq, o)| if *seq == 20 {
        matches!(o, Outcome::Refused(why) if why.contains("sealed piece"))
    } else {
        *o == Outcome::Persisted
    }));
    assert!(w.idle());
}

#[test]
fn under_a_budget_chunks_and_batches_hold_a_few_seconds_of_it_and_sealed_pieces_keep_their_size() {
    // Issue 31.2: at 200 kbit/s a 1.5 MB frame cut only by the broker's 5 MiB limit was one SEND
    // of ~60 s, outlasting the broker's keepalive.
    let (public, _) = crate::seal::test_keys();
    let enc = crate::seal::Encryptor::new(public, "fleet", Duration::from_secs(3600)).unwrap();
    let t0 = Instant::now();
    let mut c = cfg();
    c.max_chunk_bytes = Some(50_000); // 2 s of 200 kbit/s
    c.batch.max_bytes = MB;
    c.batch.max_messages = 1000;
    let mut w = connected(c, t0, None);
    w.submit(frame(0, 1_500_000, 1), t0).unwrap();
    for seq in 1..40 {
        w.submit(frame(seq, 5_000, 2), t0).unwrap();
    }
    w.close_batch_if_due(t0 + Duration::from_secs(1));
    w.submit(
        enc.seal_frame(
            Compression::None,
            crate::seal::PIECE,
            frame(40, 2 * MB, 3).frame,
        ),
        t0,
    )
    .unwrap();
    let sent = sends(&mut w, t0);
    let pieces = sent
        .iter()
        .filter(|(_, m, _)| m.encryption_param.is_some())
        .count();
    assert_eq!(
        pieces, 2,
        "the sealed frame as its 1 MiB pieces, not refused"
    );
    for (_, meta, payload) in &sent {
        if meta.encryption_param.is_none() {
            assert!(
                payload.len() <= 50_000,
                "{} bytes in one SEND",
                payload.len()
            );
        }
    }
    let camera = sent
        .iter()
        .filter(|(_, m, _)| m.num_chunks_from_msg.is_some() && m.encryption_param.is_none())
        .count();
    assert!(camera >= 30, "{camera} chunks for 1.5 MB at 50 kB");
}

#[test]
fn a_batch_waits_for_more_only_when_frames_come_closer_together_than_the_delay() {
    let t0 = Instant::now();
    let delay = BatchPolicy::default().delay;
    assert_eq!(delay, Duration::from_millis(1));
    // 100 Hz (10 ms apart, one key): every frame goes at once, no batch timer to wake for.
    let mut w = connected(cfg(), t0, None);
    for seq in 0..3 {
        let now = t0 + Duration::from_millis(10 * seq);
        w.submit(frame(seq, 100, 7), now).unwrap();
        assert_eq!(
            w.batch_due(),
            None,
            "frame {seq} of a slow source waits alone"
        );
        assert_eq!(write_all(&mut w, now).len(), 1);
    }
    // 2 kHz (0.5 ms apart): the first of the burst goes at once, the next ones share a batch
    // that goes out `batch-delay-ms` after it opened.
    let t1 = t0 + Duration::from_secs(1);
    let mut w = connected(cfg(), t0, None);
    for seq in 0..5u64 {
        w.submit(frame(seq, 100, 9), t1 + Duration::from_micros(500 * seq))
            .unwrap();
    }
    let first = t1 + Duration::from_micros(500);
    assert_eq!(w.batch_due(), Some(first + delay));
    assert_eq!(
        write_all(&mut w, first).len(),
        1,
        "only the burst's first frame"
    );
    w.close_batch_if_due(first + delay);
    let ids = write_all(&mut w, first + delay);
    assert_eq!(
        ids,
        vec![plan::sequence_id(1, 0, 0)],
        "frames 1..=4 in one batch message"
    );
}

#[test]
fn a_batch_of_one_is_the_frames_own_bytes_not_a_copy() {
    // A drain submits frames back to back, so each opens a batch; a camera frame's bucket is its
    // own, so each batch closes with one frame. Its message must share the frame's bytes: a
    // copy per drained frame was a third copy of the backlog in memory.
    let t0 = Instant::now();
    let mut w = connected(cfg(), t0, None);
    let frames: Vec<Held> = (0..3).map(|seq| frame(seq, 20_000, seq as i64)).collect();
    for f in &frames {
        w.submit(f.clone(), t0).unwrap();
    }
    w.close_batch_if_due(t0 + Duration::from_secs(1));
    let messages: Vec<_> = w
        .messages
        .iter()
        .map(|m| (m.batch.len(), m.wire.as_ptr()))
        .collect();
    let own: Vec<_> = frames.iter().map(|f| (0, f.payload.as_ptr())).collect();
    assert_eq!(messages, own);
    let sent = sends(&mut w, t0);
    assert_eq!(sent.len(), 3);
    for ((_, meta, payload), f) in sent.iter().zip(&frames) {
        assert_eq!(meta.num_messages_in_batch, None);
        assert_eq!(payload, &f.payload);
    }
}

#[test]
fn every_chunk_of_a_refused_frame_is_matched_to_it_not_answered_with_a_reconnect() {
    // Issue 46.6: a chunked frame refused with NotAllowedError (a shadow topic refuses every
    // SEND) gets one SEND_ERROR per chunk written. The first makes the frame Refused; the others
    // must find it too, whether it is still in the queue (behind an unanswered frame) or already
    // acked, and never be answered Reconnect.
    let t0 = Instant::now();
    let mut c = cfg();
    c.batch.max_messages = 1;
    let mut w = connected(c, t0, None);
    w.submit(frame(0, 1000, 1), t0).unwrap();
    w.submit(frame(1, 12 * MB, 2), t0).unwrap();
    w.submit(frame(2, 12 * MB, 3), t0).unwrap();
    w.submit(frame(3, 1000, 4), t0).unwrap();
    let ids = write_all(&mut w, t0);
    assert_eq!(ids.len(), 1 + 3 + 3 + 1);
    let not_allowed = ServerError::NotAllowedError as i32;
    // Frame 1's chunks are refused while frame 0 still waits for its receipt: frame 1 stays in
    // the queue, done.
    for &id in &ids[1..4] {
        let r = w.on_send_error(
            id,
            not_allowed,
            "Cannot send messages to a shadow topic",
            t0,
        );
        assert_eq!(r, OnSendError::Refused, "chunk id {id}");
    }
    w.on_receipt(ids[0], t0).unwrap();
    assert_eq!(acks(&mut w).iter().map(|a| a.0).collect::<Vec<_>>(), [0, 1]);
    // Frame 2's first chunk is refused; it is acked at once (nothing before it), so its other
    // chunks' errors come for a frame the window no longer holds.
    let r = w.on_send_error(ids[4], not_allowed, "shadow", t0);
    assert_eq!(r, OnSendError::Refused);
    let a = acks(&mut w);
    assert!(matches!(&a[..], [(2, Outcome::Refused(_))]), "{a:?}");
    for &id in &ids[5..7] {
        let r = w.on_send_error(id, not_allowed, "shadow", t0);
        assert_eq!(
            r,
            OnSendError::Refused,
            "chunk id {id} of a frame already acked refused"
        );
    }
    // The frame after them goes on as usual.
    w.on_receipt(ids[7], t0).unwrap();
    assert_eq!(acks(&mut w), vec![(3, Outcome::Persisted)]);
    // A NotAllowedError for an id nobody ever sent is still a protocol fault.
    assert!(matches!(
        w.on_send_error(plan::sequence_id(99, 0, 0), not_allowed, "?", t0),
        OnSendError::Reconnect(_)
    ));
}

#[test]
fn a_wiped_spools_frames_are_not_judged_by_another_spools_ids_and_go_out_above_them() {
    // Issue 46.3: the spool was wiped, numbering restarts at 0, and the broker's last id for the
    // name is frame 499's. Judged against it every frame would be acked AlreadyPersisted unsent;
    // sent under its own id the broker's deduplication would drop it. The session judges the
    // name at its creation and the numbering jumps: this window sends them above 499.
    let t0 = Instant::now();
    let jump = Arc::new(rigd_drivers::SeqJump::default());
    let numbering = plan::Numbering::new(0, jump.clone());
    let mut c = cfg();
    c.batch.max_messages = 1;
    c.numbering = Some(numbering.clone());
    let last = plan::BrokerLast::id(plan::sequence_id(499, 0, 0));
    assert_eq!(numbering.judge("t rigd-van-cam", Some(last)), Some(500));
    let mut w = Window::new(c, t0);
    w.connected(1, 5 * MB, Some(last), t0);
    for seq in 0..3 {
        w.submit(frame(seq, 1000, seq as i64), t0).unwrap();
    }
    assert!(acks(&mut w).is_empty(), "nothing judged stored");
    // The capture applies the jump at its next frame (3): numbered 503 from there.
    assert_eq!(jump.apply(3), 500);
    w.submit(frame(503, 1000, 4), t0).unwrap();
    let ids = write_all(&mut w, t0);
    let want: Vec<u64> = [500, 501, 502, 503]
        .iter()
        .map(|&s| plan::sequence_id(s, 0, 0))
        .collect();
    assert_eq!(ids, want);
    for id in ids {
        w.on_receipt(id, t0).unwrap();
    }
    // Acked under their own seqs (the lane's and the spool's numbers).
    assert_eq!(
        acks(&mut w),
        [0, 1, 2, 503].map(|s| (s, Outcome::Persisted)).to_vec()
    );
    // A batch of frames numbered before the jump answers to its shifted ids as well.
    let mut c = cfg();
    c.numbering = Some(numbering);
    let mut w = Window::new(c, t0);
    w.connected(1, 5 * MB, Some(last), t0);
    for seq in 1..4 {
        w.submit(frame(seq, 100, 9), t0).unwrap();
    }
    w.close();
    let ids = write_all(&mut w, t0);
    // Frame 1 alone (nothing came just before it), then 2 and 3 in one batch.
    assert_eq!(
        ids,
        [plan::sequence_id(501, 0, 0), plan::sequence_id(502, 0, 0)]
    );
    for id in ids {
        w.on_receipt(id, t0).unwrap();
    }
    assert_eq!(acks(&mut w).len(), 3);
}

#[test]
fn at_a_pace_frames_are_cut_into_even_chunks_of_it_and_keep_them_when_the_pace_changes() {
    // Under `auto` at 5 Mbit/s (0.1 s: 62.5 kB), a 600 kB camera frame was three chunks of 256 KB
    // at the broker's limit, each 0.4 s on the link that a serial line behind it waited out.
    let t0 = Instant::now();
    let mut w = connected(cfg(), t0, None);
    w.pace_chunks(Some(62_500));
    w.submit(frame(0, 600_000, 1), t0).unwrap();
    w.submit(frame(1, 50_000, 2), t0).unwrap();
    // The pace grows before frame 0 is written: it keeps the chunks it was cut into.
    w.pace_chunks(None);
    w.submit(frame(2, 600_000, 3), t0).unwrap();
    let sent = sends(&mut w, t0);
    let sizes = |seq: u64| -> Vec<usize> {
        sent.iter()
            .filter(|(_, m, _)| m.sequence_id >> 11 == seq)
            .map(|(_, _, p)| p.len())
            .collect()
    };
    assert_eq!(sizes(0), vec![60_000; 10], "even chunks of at most 62.5 kB");
    assert_eq!(sizes(1), vec![50_000], "a frame under the pace goes whole");
    // At 1 Mbit/s (16 KiB, the least), a frame of 64 KiB or less still goes whole.
    let mut w = connected(cfg(), t0, None);
    w.pace_chunks(Some(16 << 10));
    w.submit(frame(0, 60_000, 1), t0).unwrap();
    w.submit(frame(1, 100_000, 2), t0).unwrap();
    let sent = sends(&mut w, t0);
    assert_eq!(
        sent.len(),
        1 + 7,
        "60 kB whole, 100 kB as 7 chunks of 16 KiB or less"
    );
    assert_eq!(sizes(2), vec![600_000], "no pace: the broker's 5 MiB limit");
    // A pace so small that the frame would take more than MAX_CHUNKS: as many as it may.
    let mut w = connected(cfg(), t0, None);
    w.pace_chunks(Some(1024));
    w.submit(frame(0, 600_000, 1), t0).unwrap();
    assert_eq!(sends(&mut w, t0).len(), plan::MAX_CHUNKS);
}
