//! Pure decisions of the producer: Pulsar sequence ids and chunk boundaries.

/// Layout of a Pulsar sequence id: `capture seq | generation (3 bits) | chunk index (8 bits)`.
///
/// Every chunk of a chunked frame has its own sequence id, so the broker's last persisted id says
/// exactly how many chunks of a frame it holds: after a restart, a frame whose last chunk id is not
/// above it is complete and skipped; a frame cut between its chunks is the only one that must go out
/// again, under the next generation (new chunk uuid, same `seq` property), because consumers drop
/// the orphaned first chunks after their reassembly timeout. Consumers reassemble chunks by uuid and
/// chunk id, not by sequence id.
pub const GENERATION_BITS: u32 = 3;
pub const MAX_GENERATION: u64 = (1 << GENERATION_BITS) - 1;
pub const CHUNK_BITS: u32 = 8;
/// The most chunks one frame may take (with the broker's default 5 MiB messages: 1.2 GiB).
pub const MAX_CHUNKS: usize = 1 << CHUNK_BITS;

/// The Pulsar sequence id of chunk `chunk` of capture sequence `seq`, sent for the
/// `generation`-th time.
pub fn sequence_id(seq: u64, generation: u64, chunk: usize) -> u64 {
    (((seq << GENERATION_BITS) | generation.min(MAX_GENERATION)) << CHUNK_BITS)
        | (chunk as u64).min(MAX_CHUNKS as u64 - 1)
}

/// The capture sequence a Pulsar sequence id belongs to.
pub fn capture_seq(sequence_id: u64) -> u64 {
    sequence_id >> (GENERATION_BITS + CHUNK_BITS)
}

/// What the broker holds of this producer at the first creation: its last persisted sequence id
/// and, when that entry itself was read (the probe, [`super::probe`]), how many chunks its frame
/// was cut into then. The broker's `maxMessageSize` may differ across a restart, so this run's cut
/// of the same frame can have another number of chunks: completeness is judged by the entry's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BrokerLast {
    pub sequence_id: u64,
    /// `num_chunks_from_msg` of the entry (None: not read, or not a chunk).
    pub chunks: Option<usize>,
}

impl BrokerLast {
    /// The broker's answer at producer creation: a sequence id alone.
    pub fn id(sequence_id: u64) -> Self {
        BrokerLast {
            sequence_id,
            chunks: None,
        }
    }
}

/// A source's numbering in this process, shared by its producers and its capture (issue 46.3):
/// frames numbered at or past `first` were numbered by this run, so no earlier run of this spool
/// sent them. A broker whose last sequence id for a producer name is at or past `first` holds ids
/// this spool never handed out (the spool was wiped, or another rig runs under this id): judged
/// against it, every new frame would be acked `AlreadyPersisted` unsent, and sent, the broker's
/// deduplication would drop it. The numbering jumps past it, as the Java client numbers from the
/// broker's last id + 1 ([`jump_past`]); frames numbered before the jump go out under ids shifted
/// by the same amount ([`Numbering::id_seq`]), so ids stay unique and increasing.
#[derive(Debug, Clone)]
pub struct Numbering {
    /// The first number this run handed out (the spool's next at open).
    pub first: u64,
    /// Shared with the source's capture ([`rigd_drivers::FrameSink::with_jump`]).
    pub jump: std::sync::Arc<rigd_drivers::SeqJump>,
    /// The topic/producer names whose first creation in this process was judged: a producer
    /// created again under a name later finds this run's own ids there, not a conflict.
    judged: std::sync::Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
}

impl Numbering {
    pub fn new(first: u64, jump: std::sync::Arc<rigd_drivers::SeqJump>) -> Self {
        Numbering {
            first,
            jump,
            judged: Default::default(),
        }
    }

    /// The capture sequence frame `seq`'s Pulsar sequence ids are made of: shifted by the jump
    /// when it was numbered by this run before the jump, its own otherwise.
    pub fn id_seq(&self, seq: u64) -> u64 {
        let by = self.jump.by();
        if by == 0 || seq < self.first || self.jump.at().is_some_and(|at| seq >= at) {
            return seq;
        }
        seq + by
    }

    /// A producer `key` (topic and name) was created and the broker named `broker_last`: at the
    /// key's first creation in this process, the jump this asks for (see [`jump_past`]), if it
    /// is the one asked (None: no conflict, judged before, or a jump asked already).
    pub fn judge(&self, key: &str, broker_last: Option<BrokerLast>) -> Option<u64> {
        let first_time = self
            .judged
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.to_string());
        if !first_time || self.jump.by() != 0 {
            return None;
        }
        let by = jump_past(self.first, broker_last?)?;
        self.jump.ask(by).then_some(by)
    }
}

/// How far a run that numbers from `first` must jump so that its frames' ids are above the
/// broker's last id for the producer (None: they are already). Pure.
pub fn jump_past(first: u64, broker_last: BrokerLast) -> Option<u64> {
    let last = capture_seq(broker_last.sequence_id);
    (last >= first).then(|| last + 1 - first)
}

/// Whether the first producer creation of a process reads the topic's last entry ([`super::probe`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// Another run's frames cannot be on the topic under this name, or this process already knows.
    No,
    /// The broker keeps no deduplication state (forgotten overnight, or dedup off): the topic's
    /// last entry, once it holds still, says what is stored.
    LastEntry,
    /// The broker named its last sequence id, but not how many chunks that id's frame was cut
    /// into; a frame cut by a smaller `maxMessageSize` before a restart may be judged complete
    /// by this run's own cut. The entry's `num_chunks_from_msg` says ([`resend`]).
    ChunksOf(u64),
}

/// Decides [`Probe`] at a producer creation: `created`, this process created the producer
/// before (it knows its own cut); `fresh`, the topic holds no frame of this producer name.
pub fn probe(created: bool, fresh: bool, broker_last_id: Option<u64>) -> Probe {
    match broker_last_id {
        _ if created || fresh => Probe::No,
        None => Probe::LastEntry,
        Some(id) => Probe::ChunksOf(id),
    }
}

/// What the probe reads of the topic ([`super::probe::read`]), with the spool's marks (issue
/// 46.5): [`Probe`] says what the broker's answer leaves open, this says how it is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// Nothing ([`Probe::No`] without marks, or a name this process created before).
    No,
    /// No frame was ever sent under this name and the spool keeps marks: the topic's last entry
    /// now is recorded as the name's start mark before its first frame, so that a later forward
    /// read finds every frame of the name.
    Start,
    /// The single last entry ([`Probe::LastEntry`], [`Probe::ChunksOf`]) for a name the spool has
    /// no mark of (a spool of an older rigd): it says something only when it is this name's. On
    /// a topic other producers write it seldom is, and then nothing is known: frames of unknown
    /// fate go out again (docs/UPLINK.md, "Nothing twice"). A start mark is recorded after.
    LastEntry(Probe),
    /// The spool holds the name's mark: read the topic forward from it to its last entry, this
    /// name's entries only. `broker`: the broker's last id, if it named one (its entry ends the
    /// read early).
    Forward {
        mark: crate::spool::epochs::Mark,
        broker: Option<u64>,
    },
}

impl Read {
    /// Waits for the broker's last confirmed entry to hold still first: the broker named nothing,
    /// so what a killed run's connection handed it may still be landing.
    pub fn settles(&self) -> bool {
        matches!(
            self,
            Read::LastEntry(Probe::LastEntry) | Read::Forward { broker: None, .. }
        )
    }

    /// How what it reads is weighed against the broker's answer (`session::broker_last`): a
    /// forward read as the last entry when the broker named nothing, as the entry of the
    /// broker's id when it did (the highest of the name, with its chunk count).
    pub fn judged_as(&self) -> Probe {
        match *self {
            Read::No | Read::Start => Probe::No,
            Read::LastEntry(p) => p,
            Read::Forward { broker: None, .. } => Probe::LastEntry,
            Read::Forward {
                broker: Some(id), ..
            } => Probe::ChunksOf(id),
        }
    }
}

/// Decides [`Read`] at a producer creation: `asked`, [`probe`]'s answer; `fresh` as there;
/// `mark`, the spool's mark of the name on the topic; `marks`, the spool keeps marks (the daemon
/// does, the offline tools do not).
pub fn read(
    created: bool,
    fresh: bool,
    broker_last_id: Option<u64>,
    mark: Option<crate::spool::epochs::Mark>,
    marks: bool,
) -> Read {
    match (probe(created, fresh, broker_last_id), mark) {
        _ if created => Read::No,
        // A mark wins over `fresh`: a name thought fresh (a recall request that checkpointed no
        // receipt) may have sent frames since its start mark.
        (_, Some(mark)) => Read::Forward {
            mark,
            broker: broker_last_id,
        },
        (Probe::No, None) if marks => Read::Start,
        (Probe::No, None) => Read::No,
        (p, None) => Read::LastEntry(p),
    }
}

/// What a frame's send must do, given the broker's last persisted sequence id for the producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resend {
    /// Nothing of it is persisted: send every chunk from `first`.
    From { generation: u64, first: usize },
    /// The broker holds all of it.
    Done,
}

/// Decides a frame's (re)send of `chunks` chunks under `generation` against the broker's last
/// persisted id. `resuming`: the same process reconnected, so the consumer still holds the chunks
/// that were persisted and the rest can follow under the same uuid; otherwise (a restart) a frame cut
/// between its chunks goes out whole under the next generation.
pub fn resend(
    seq: u64,
    generation: u64,
    chunks: usize,
    broker_last: Option<BrokerLast>,
    resuming: bool,
) -> Resend {
    let everything = Resend::From {
        generation,
        first: 0,
    };
    let Some(BrokerLast {
        sequence_id: last,
        chunks: broker_chunks,
    }) = broker_last
    else {
        return everything;
    };
    if capture_seq(last) < seq {
        return everything;
    }
    if capture_seq(last) > seq {
        return Resend::Done;
    }
    let last_generation = (last >> CHUNK_BITS) & MAX_GENERATION;
    let last_chunk = (last & (MAX_CHUNKS as u64 - 1)) as usize;
    // The frame as the broker holds it: as many chunks as its entry says it was cut into.
    let cut_into = broker_chunks.unwrap_or(chunks);
    if last_chunk + 1 >= cut_into {
        Resend::Done
    } else if resuming && last_generation == generation && cut_into == chunks {
        Resend::From {
            generation,
            first: last_chunk + 1,
        }
    } else {
        // After the last generation the ids stay its own, under a new uuid, as [`again`] does
        // in one process: exact for a broker that deduplicates last chunks only (`last` is below
        // this frame's last chunk here). A restart that found a partial last generation refused
        // the frame (issue 46).
        Resend::From {
            generation: (last_generation.max(generation) + 1).min(MAX_GENERATION),
            first: 0,
        }
    }
}

/// How a frame cut into chunks goes out again after a reconnect of the same process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Again {
    /// From its first chunk without a receipt, under the same ids and uuid.
    Resume,
    /// Only its last chunk, under its id: the broker holds the whole frame, and answers the
    /// last chunk as a duplicate (a receipt once it is persisted).
    LastChunk,
    /// Whole, under the next generation (new ids above every id of the first cut) while there
    /// is one, and always under a new uuid.
    Whole,
}

/// After a reconnect of the same process: how a frame cut into `chunks` chunks, of which
/// `receipts` have a receipt and `written` were written on the lost connection, is sent again;
/// `last` is the broker's highest pushed id for the producer.
///
/// The broker (Pulsar 3.0.7 and 4.0.7, `MessageDeduplication.isDuplicate` read from their bytecode)
/// deduplicates only the **last** chunk of a chunked message: every other chunk is stored
/// whatever its id, and only a last chunk moves the highest pushed id. So:
/// - nothing in flight (every written chunk has its receipt): the rest follows exactly;
/// - `last` at or past the frame's last chunk: the broker has it all. Sending the other chunks
///   again would store them twice, and their receipts would come after the last chunk's
///   immediate duplicate receipt, out of order (the reconnect loop the connection-reset test
///   found); only the last chunk is sent, for its receipt;
/// - otherwise chunks written without a receipt may be stored: sent again under the same uuid,
///   a consumer would see a chunk id twice and drop the whole frame (the C++ client, and so the
///   Python one: the loss seen around topic moves). It goes out whole under a uuid nobody has
///   seen; the first cut never completes (its last chunk was never pushed) and consumers expire
///   it. With no deduplication state (`last` None) nothing says what arrived: whole as well.
///
/// A broker that also deduplicates the other chunks (by "below the highest pushed id") is safe
/// under the same rules: a whole frame under new ids above `last` is never dropped, and a last
/// chunk sent again reaches only consumers that completed its frame, which ignore it.
///
/// Each whole resend takes the next generation while there is one; after [`MAX_GENERATION`]
/// (a frame cut mid-send again and again, as on a link that drops every few seconds under a
/// 12 MB frame: seen in CI) it keeps the last generation's ids under a new uuid, which is exact
/// for a broker that deduplicates last chunks only (`last` is below the last chunk here, so
/// nothing of it is dropped). Going back to resuming there lost the frame (CI, twice in a run).
pub fn again(
    seq: u64,
    generation: u64,
    chunks: usize,
    receipts: usize,
    written: usize,
    last: Option<u64>,
) -> Again {
    if chunks < 2 || written <= receipts {
        return Again::Resume;
    }
    if last.is_some_and(|last| last >= sequence_id(seq, generation, chunks - 1)) {
        return Again::LastChunk;
    }
    Again::Whole
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broker_holding_ids_past_this_runs_first_number_makes_the_numbering_jump_past_them() {
        // Issue 46.3: a wiped spool numbers from 0 again; the broker's last id for the name is
        // frame 499's (an earlier spool's). The run's frames go out above it, in capture order.
        let jump = std::sync::Arc::new(rigd_drivers::SeqJump::default());
        let n = Numbering::new(0, jump.clone());
        let broker = BrokerLast::id(sequence_id(499, 0, 0));
        let last = Some(broker);
        assert_eq!(jump_past(0, broker), Some(500));
        assert_eq!(jump_past(500, broker), None, "the spool's own history");
        assert_eq!(n.id_seq(3), 3, "no jump asked yet");
        assert_eq!(n.judge("t/rigd-van-gps", last), Some(500));
        // Frames numbered before the sink applied it: shifted past the broker's id.
        assert_eq!(n.id_seq(0), 500);
        assert_eq!(n.id_seq(41), 541);
        // The sink applies it at its next frame, 42: that frame is numbered 542.
        assert_eq!(jump.apply(42), 500);
        assert_eq!(jump.apply(542), 0, "once");
        assert_eq!(jump.at(), Some(42));
        assert_eq!(n.id_seq(41), 541);
        assert_eq!(n.id_seq(542), 542, "numbered after the jump: its own");
        // Every id of the run above the broker's, increasing with capture order.
        let ids: Vec<u64> = (0..42).chain(542..600).map(|s| n.id_seq(s)).collect();
        assert!(ids[0] > 499 && ids.windows(2).all(|w| w[0] < w[1]));
        // Judged once per name: created again, the name holds this run's own ids.
        let now_last = Some(BrokerLast::id(sequence_id(560, 0, 0)));
        assert_eq!(n.judge("t/rigd-van-gps", now_last), None);
        assert_eq!(jump.by(), 500);
        // A spool that numbered past what the broker holds: nothing to do.
        let own = Numbering::new(1000, std::sync::Arc::default());
        assert_eq!(own.judge("t/x", last), None);
        assert_eq!(own.judge("t/y", None), None);
        assert_eq!(own.id_seq(1200), 1200);
        // An earlier run's frames (below `first`) keep their ids whatever was asked.
        let later = Numbering::new(100, std::sync::Arc::default());
        assert_eq!(later.judge("t/z", last), Some(400));
        assert_eq!(later.id_seq(99), 99);
        assert_eq!(later.id_seq(100), 500);
    }

    #[test]
    fn a_restart_that_finds_a_partial_last_generation_sends_the_frame_whole_under_it() {
        // Issue 46: a frame cut 7 times in one run, then a restart that finds chunks 0 and 1 of
        // its last generation: there is no next one, and the frame was refused ("resent too
        // many times") though nothing of it was whole at the broker.
        let partial = sequence_id(9, MAX_GENERATION, 1);
        let whole_again = Resend::From {
            generation: MAX_GENERATION,
            first: 0,
        };
        assert_eq!(
            resend(9, 0, 3, Some(BrokerLast::id(partial)), false),
            whole_again
        );
        let told = BrokerLast {
            sequence_id: partial,
            chunks: Some(3),
        };
        assert_eq!(resend(9, 0, 3, Some(told), false), whole_again);
        // Its last chunk id is above what the broker holds: not deduplicated away.
        assert!(sequence_id(9, MAX_GENERATION, 2) > partial);
    }

    #[test]
    fn a_restart_reads_the_chunk_count_of_the_broker_s_last_id_as_well() {
        // Issue 31.7 with deduplication on: the broker's id alone is chunk 1 of frame 7; if the
        // frame had 3 chunks then and this run cuts it into 2, only the entry's count tells.
        let id = sequence_id(7, 0, 1);
        assert_eq!(probe(false, false, Some(id)), Probe::ChunksOf(id));
        assert_eq!(probe(false, false, None), Probe::LastEntry);
        assert_eq!(probe(true, false, Some(id)), Probe::No);
        assert_eq!(probe(false, true, None), Probe::No);
        let told = BrokerLast {
            sequence_id: id,
            chunks: Some(3),
        };
        assert_ne!(resend(7, 0, 2, Some(told), false), Resend::Done);
        assert_eq!(
            resend(7, 0, 2, Some(BrokerLast::id(id)), false),
            Resend::Done
        );
    }

    #[test]
    fn a_marked_name_is_read_forward_and_a_fresh_one_records_its_start() {
        // Issue 46.5: the spool's mark of the name decides, whatever the broker says.
        use crate::spool::epochs::Mark;
        let mark = Mark {
            at: Some((3, 40)),
            sequence_id: Some(sequence_id(90, 0, 0)),
        };
        let fwd = |broker| Read::Forward { mark, broker };
        assert_eq!(read(false, false, None, Some(mark), true), fwd(None));
        assert_eq!(read(false, false, Some(7), Some(mark), true), fwd(Some(7)));
        // A name thought fresh that has a mark sent frames since its start: read forward.
        assert_eq!(read(false, true, None, Some(mark), true), fwd(None));
        // This process created it before: it knows.
        assert_eq!(read(true, false, None, Some(mark), true), Read::No);
        // Fresh, no mark yet: its start is recorded before its first frame (not without marks).
        assert_eq!(read(false, true, None, None, true), Read::Start);
        assert_eq!(read(false, true, None, None, false), Read::No);
        // No mark (an older rigd's spool): the last entry, as before marks.
        assert_eq!(
            read(false, false, None, None, true),
            Read::LastEntry(Probe::LastEntry)
        );
        assert_eq!(
            read(false, false, Some(7), None, false),
            Read::LastEntry(Probe::ChunksOf(7))
        );
        assert!(fwd(None).settles() && Read::LastEntry(Probe::LastEntry).settles());
        assert!(!fwd(Some(7)).settles() && !Read::Start.settles());
        // Weighed against the broker's answer: a forward read is the name's highest entry.
        assert_eq!(fwd(None).judged_as(), Probe::LastEntry);
        assert_eq!(fwd(Some(7)).judged_as(), Probe::ChunksOf(7));
        assert_eq!(Read::Start.judged_as(), Probe::No);
    }

    #[test]
    fn sequence_ids_keep_capture_order_and_room_for_resends_and_chunks() {
        assert_eq!(sequence_id(0, 0, 0), 0);
        assert!(sequence_id(5, MAX_GENERATION, MAX_CHUNKS - 1) < sequence_id(6, 0, 0));
        assert!(sequence_id(5, 0, MAX_CHUNKS - 1) < sequence_id(5, 1, 0));
        assert!(sequence_id(5, 0, 3) < sequence_id(5, 0, 4));
        assert_eq!(capture_seq(sequence_id(123_456, 2, 17)), 123_456);
        assert_eq!(sequence_id(1, 99, 0), sequence_id(1, MAX_GENERATION, 0));
        // 64-bit everywhere: capture sequences far beyond 2^32 still map one to one.
        assert_eq!(capture_seq(sequence_id(1 << 40, 1, 0)), 1 << 40);
    }

    #[test]
    fn a_reconnect_with_chunks_in_flight_sends_the_frame_whole_unless_the_broker_has_its_last_chunk(
    ) {
        let id = |chunk| sequence_id(7, 0, chunk);
        // Chunk 0 receipted, chunks 1 and 2 written; the broker's highest id is an earlier
        // frame's (it moves only with last chunks): chunk 1 or 2 may be stored all the same.
        assert_eq!(
            again(7, 0, 4, 1, 3, Some(sequence_id(6, 0, 3))),
            Again::Whole
        );
        // A broker that moves it with every chunk: chunk 1 pushed.
        assert_eq!(again(7, 0, 4, 1, 3, Some(id(1))), Again::Whole);
        // No deduplication state: nothing says which chunks arrived.
        assert_eq!(again(7, 0, 4, 1, 3, None), Again::Whole);
        // The broker pushed its last chunk (or a later frame's): only the last goes again.
        assert_eq!(again(7, 0, 4, 1, 4, Some(id(3))), Again::LastChunk);
        assert_eq!(
            again(7, 0, 4, 0, 4, Some(sequence_id(8, 0, 3))),
            Again::LastChunk
        );
        assert_eq!(
            again(7, 2, 4, 3, 4, Some(sequence_id(7, 2, 3))),
            Again::LastChunk
        );
        // Nothing was in flight (written = receipted): the rest follows under the same uuid.
        assert_eq!(again(7, 0, 4, 2, 2, Some(id(1))), Again::Resume);
        assert_eq!(again(7, 0, 4, 0, 0, None), Again::Resume);
        // Not chunked.
        assert_eq!(again(7, 0, 1, 0, 1, None), Again::Resume);
        // No generation left: whole all the same (the window gives it a new uuid).
        assert_eq!(again(7, MAX_GENERATION, 4, 1, 3, None), Again::Whole);
        let last_gen = |chunk| sequence_id(7, MAX_GENERATION, chunk);
        assert_eq!(
            again(7, MAX_GENERATION, 4, 1, 3, Some(last_gen(0) - 1)),
            Again::Whole
        );
        assert_eq!(
            again(7, MAX_GENERATION, 4, 1, 4, Some(last_gen(3))),
            Again::LastChunk
        );
    }

    #[test]
    fn resend_decisions_follow_the_brokers_last_persisted_chunk() {
        let from = |generation, first| Resend::From { generation, first };
        let last = |seq, generation, chunk| BrokerLast::id(sequence_id(seq, generation, chunk));
        // Nothing known, or the broker is behind: everything goes.
        assert_eq!(resend(7, 0, 3, None, false), from(0, 0));
        assert_eq!(resend(7, 0, 3, Some(last(6, 0, 0)), false), from(0, 0));
        // Complete (last chunk persisted) or older: skipped, restart or not.
        assert_eq!(resend(7, 0, 3, Some(last(7, 0, 2)), false), Resend::Done);
        assert_eq!(resend(7, 0, 1, Some(last(7, 0, 0)), true), Resend::Done);
        assert_eq!(resend(7, 0, 3, Some(last(9, 0, 0)), false), Resend::Done);
        // Cut after two chunks: a reconnect resumes at chunk 2, a restart resends it all anew.
        let cut = Some(last(7, 0, 1));
        assert_eq!(resend(7, 0, 3, cut, true), from(0, 2));
        assert_eq!(resend(7, 0, 3, cut, false), from(1, 0));
        // A frame already resent under generation 1: complete there, or cut there again.
        assert_eq!(resend(7, 0, 3, Some(last(7, 1, 2)), false), Resend::Done);
        assert_eq!(resend(7, 0, 3, Some(last(7, 1, 0)), false), from(2, 0));
    }

    #[test]
    fn a_frame_the_broker_holds_in_part_is_not_done_because_this_run_cuts_it_into_fewer_chunks() {
        // Issue 31.7: the probe read chunk 1 of a 3-chunk frame; the broker's maxMessageSize grew
        // across the restart, so this run cuts the frame into 2. It was never completed.
        let partial = BrokerLast {
            sequence_id: sequence_id(7, 0, 1),
            chunks: Some(3),
        };
        assert_eq!(
            resend(7, 0, 2, Some(partial), false),
            Resend::From {
                generation: 1,
                first: 0
            }
        );
        // A reconnect of the same process does not resume into another layout either.
        assert_eq!(
            resend(7, 0, 2, Some(partial), true),
            Resend::From {
                generation: 1,
                first: 0
            }
        );
        // The last chunk of that 3-chunk frame: complete, however this run would cut it.
        let whole = BrokerLast {
            sequence_id: sequence_id(7, 0, 2),
            chunks: Some(3),
        };
        assert_eq!(resend(7, 0, 5, Some(whole), false), Resend::Done);
        assert_eq!(resend(7, 0, 1, Some(whole), false), Resend::Done);
    }

    #[test]
    #[allow(clippy::single_range_in_vec_init)]
    fn chunks_cover_the_payload_exactly() {
        assert_eq!(crate::payload::cut(10, 100), [0..10]);
        assert_eq!(crate::payload::cut(0, 100), [0..0]);
        assert_eq!(crate::payload::cut(100, 100), [0..100]);
        let r = crate::payload::cut(250, 100);
        assert_eq!(r, vec![0..100, 100..200, 200..250]);
        let r = crate::payload::cut(20 << 20, (5 << 20) - 4096);
        assert_eq!(r.len(), 5);
        assert_eq!(r.last().unwrap().end, 20 << 20);
        assert!(r.windows(2).all(|w| w[0].end == w[1].start));
    }
}
