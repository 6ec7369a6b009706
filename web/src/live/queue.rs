//! What one live-view client has waiting to be sent, and which messages it loses when it reads
//! slower than the rig captures. Pure: no I/O, no clock, no lock.
//!
//! Message data is bounded in bytes. A message that does not fit makes room by dropping queued
//! messages of the channels it may push out, oldest first: cameras before audio before serial, and
//! a message never pushes out one of a class that is kept longer than its own (a camera frame
//! never pushes out an audio block; a serial record may push out anything). When nothing it may
//! push out is left, the new message is dropped itself. A message larger than the whole bound (a
//! camera frame the rig sent chunked, above the broker's max message size) goes out alone: it
//! pushes out what it may and is queued only when nothing else is left, so a queue holds at most
//! the larger of the bound and one message. Control messages (status, time) are small,
//! few and never dropped; a pending time message is replaced by a newer one rather than queued
//! twice.
//!
//! Video (issue 48): a P-frame decodes only after every frame of its group since the keyframe. A
//! subscription to a video channel starts at a keyframe (the P-frames before the first one are not
//! queued), and when one of its pictures is dropped, every picture of it still queued goes too and
//! the subscription waits for the next keyframe: whatever a client receives decodes.

use bytes::Bytes;
use std::collections::{HashSet, VecDeque};

/// Which messages go first when a client falls behind (the lowest first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Class {
    Camera,
    Audio,
    Serial,
}

/// One message for the client.
#[derive(Debug, Clone, PartialEq)]
pub enum Outgoing {
    /// A JSON text message (`serverInfo`, `advertise`, `status`).
    Text(String),
    /// Binary Time (opcode 2): the rig clock, ns.
    Time(u64),
    /// Binary MessageData (opcode 1).
    Data(Data),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Data {
    pub class: Class,
    pub channel: u32,
    pub subscription: u32,
    /// Receive time: the frame's capture ns on the rig clock.
    pub receive_ns: u64,
    pub payload: Bytes,
    pub picture: Picture,
}

/// What a message is to a decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Picture {
    /// Decodes alone (an image, audio, a record).
    #[default]
    Whole,
    /// A video keyframe: its group starts here.
    Key,
    /// A video frame that needs the frames of its group before it.
    Delta,
}

impl Data {
    /// Bytes this message holds in the queue.
    pub fn size(&self) -> usize {
        self.payload.len() + MESSAGE_DATA_HEADER
    }
}

/// Opcode, subscription id and receive time before the payload.
pub const MESSAGE_DATA_HEADER: usize = 1 + 4 + 8;

/// The binary MessageData frame: `0x01 | u32 subscription | u64 receive ns | payload`, little-endian.
pub fn message_data(subscription: u32, receive_ns: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(MESSAGE_DATA_HEADER + payload.len());
    out.push(0x01);
    out.extend_from_slice(&subscription.to_le_bytes());
    out.extend_from_slice(&receive_ns.to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// The binary Time frame: `0x02 | u64 ns`, little-endian.
pub fn time(ns: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(9);
    out.push(0x02);
    out.extend_from_slice(&ns.to_le_bytes());
    out
}

/// A client's pending messages, data bounded to `bound` bytes.
#[derive(Debug)]
pub struct ClientQueue {
    items: VecDeque<Outgoing>,
    data_bytes: usize,
    bound: usize,
    control: usize,
    /// Video subscriptions that received a keyframe and lost nothing of its group since: only
    /// they take P-frames.
    synced: HashSet<u32>,
}

impl ClientQueue {
    pub fn new(bound: usize) -> Self {
        Self {
            items: VecDeque::new(),
            data_bytes: 0,
            bound,
            control: 0,
            synced: HashSet::new(),
        }
    }

    /// Queues `data`; returns the channels of the messages dropped to keep the bound (the new
    /// one's included when it is dropped itself), one entry per message.
    #[must_use]
    pub fn push_data(&mut self, data: Data) -> Vec<u32> {
        let mut dropped = Vec::new();
        match data.picture {
            Picture::Key => {
                self.synced.insert(data.subscription);
            }
            // Its group began before the subscription, or lost a frame: it cannot decode.
            Picture::Delta if !self.synced.contains(&data.subscription) => {
                dropped.push(data.channel);
                return dropped;
            }
            _ => {}
        }
        let size = data.size();
        let bound = self.bound.max(size);
        while self.data_bytes + size > bound {
            let Some(i) = self.victim(data.class) else {
                dropped.push(data.channel);
                if data.picture != Picture::Whole {
                    self.unsync(data.subscription, &mut dropped);
                }
                return dropped;
            };
            if let Some(Outgoing::Data(d)) = self.items.remove(i) {
                self.data_bytes -= d.size();
                dropped.push(d.channel);
                if d.picture != Picture::Whole {
                    self.unsync(d.subscription, &mut dropped);
                    if d.subscription == data.subscription && data.picture == Picture::Delta {
                        // The new frame is of the group just broken.
                        dropped.push(data.channel);
                        return dropped;
                    }
                }
            }
        }
        self.data_bytes += size;
        self.items.push_back(Outgoing::Data(data));
        dropped
    }

    /// A picture of `subscription` was dropped: the rest of it queued goes (each counted in
    /// `dropped`), and it waits for its next keyframe.
    fn unsync(&mut self, subscription: u32, dropped: &mut Vec<u32>) {
        self.synced.remove(&subscription);
        let mut freed = 0;
        self.items.retain(|o| match o {
            Outgoing::Data(d) if d.subscription == subscription => {
                freed += d.size();
                dropped.push(d.channel);
                false
            }
            _ => true,
        });
        self.data_bytes -= freed;
    }

    /// The oldest queued message of the lowest class at or below `class`.
    fn victim(&self, class: Class) -> Option<usize> {
        self.items
            .iter()
            .enumerate()
            .filter_map(|(i, o)| match o {
                Outgoing::Data(d) if d.class <= class => Some((d.class, i)),
                _ => None,
            })
            .min()
            .map(|(_, i)| i)
    }

    /// Queues a text message (never dropped). Returns the number of control messages waiting.
    pub fn push_text(&mut self, text: String) -> usize {
        self.control += 1;
        self.items.push_back(Outgoing::Text(text));
        self.control
    }

    /// Queues a time message, or moves a pending one forward to `ns`.
    pub fn push_time(&mut self, ns: u64) {
        for o in self.items.iter_mut() {
            if let Outgoing::Time(t) = o {
                *t = (*t).max(ns);
                return;
            }
        }
        self.control += 1;
        self.items.push_back(Outgoing::Time(ns));
    }

    pub fn pop(&mut self) -> Option<Outgoing> {
        let o = self.items.pop_front()?;
        match &o {
            Outgoing::Data(d) => self.data_bytes -= d.size(),
            _ => self.control -= 1,
        }
        Some(o)
    }

    /// Forgets the queued messages of `subscription` (the client unsubscribed).
    pub fn remove_subscription(&mut self, subscription: u32) {
        self.synced.remove(&subscription);
        let mut freed = 0;
        self.items.retain(|o| match o {
            Outgoing::Data(d) if d.subscription == subscription => {
                freed += d.size();
                false
            }
            _ => true,
        });
        self.data_bytes -= freed;
    }

    /// Bytes of message data waiting.
    pub fn data_bytes(&self) -> usize {
        self.data_bytes
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(class: Class, channel: u32, bytes: usize) -> Data {
        Data {
            class,
            channel,
            subscription: channel + 100,
            receive_ns: 7,
            payload: Bytes::from(vec![0u8; bytes - MESSAGE_DATA_HEADER]),
            picture: Picture::Whole,
        }
    }

    fn picture(channel: u32, picture: Picture, n: u64) -> Data {
        Data {
            receive_ns: n,
            picture,
            ..data(Class::Camera, channel, 100)
        }
    }

    fn received(q: &mut ClientQueue) -> Vec<(u32, u64)> {
        std::iter::from_fn(|| q.pop())
            .filter_map(|o| match o {
                Outgoing::Data(d) => Some((d.channel, d.receive_ns)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_video_subscription_starts_at_a_keyframe() {
        let mut q = ClientQueue::new(10_000);
        // Joined mid-group: its P-frames are not queued (counted lost), the keyframe starts it.
        assert_eq!(q.push_data(picture(1, Picture::Delta, 1)), [1]);
        assert_eq!(q.push_data(picture(1, Picture::Delta, 2)), [1]);
        assert!(q.push_data(picture(1, Picture::Key, 3)).is_empty());
        assert!(q.push_data(picture(1, Picture::Delta, 4)).is_empty());
        // Another channel's images are not held back.
        assert!(q.push_data(data(Class::Camera, 2, 100)).is_empty());
        assert_eq!(received(&mut q), [(1, 3), (1, 4), (2, 7)]);
    }

    #[test]
    fn a_dropped_picture_takes_the_rest_of_its_subscription_and_waits_for_the_next_keyframe() {
        // Room for 4 pictures; a serial record needing 2 more pushes out the oldest picture.
        let mut q = ClientQueue::new(400);
        assert!(q.push_data(picture(1, Picture::Key, 1)).is_empty());
        for n in 2..=4 {
            assert!(q.push_data(picture(1, Picture::Delta, n)).is_empty());
        }
        let lost = q.push_data(data(Class::Serial, 3, 200));
        assert_eq!(
            lost,
            [1, 1, 1, 1],
            "the keyframe, and with it every queued P-frame"
        );
        assert_eq!(q.data_bytes(), 200);
        // Until the next keyframe, nothing of the video is queued.
        assert_eq!(q.push_data(picture(1, Picture::Delta, 5)), [1]);
        assert!(q.push_data(picture(1, Picture::Key, 6)).is_empty());
        assert!(q.push_data(picture(1, Picture::Delta, 7)).is_empty());
        assert_eq!(received(&mut q), [(3, 7), (1, 6), (1, 7)]);
    }

    #[test]
    fn a_p_frame_that_does_not_fit_breaks_its_group() {
        let mut q = ClientQueue::new(200);
        assert!(q.push_data(data(Class::Audio, 2, 100)).is_empty());
        assert!(q.push_data(picture(1, Picture::Key, 1)).is_empty());
        // A P-frame needing room pushes out its own keyframe: the group is broken, it goes too.
        let big = Data {
            payload: Bytes::from(vec![0u8; 150]),
            ..picture(1, Picture::Delta, 2)
        };
        assert_eq!(q.push_data(big), [1, 1]);
        assert_eq!(q.push_data(picture(1, Picture::Delta, 3)), [1]);
        // A keyframe that cannot fit (audio is never pushed out by a camera frame) leaves it
        // waiting.
        assert!(q.push_data(data(Class::Audio, 2, 100)).is_empty());
        assert_eq!(q.push_data(picture(1, Picture::Key, 4)), [1]);
        assert_eq!(q.push_data(picture(1, Picture::Delta, 5)), [1]);
        assert_eq!(received(&mut q), [(2, 7), (2, 7)]);
        // Synced again, unsubscribed and subscribed again: it starts at a keyframe once more.
        assert!(q.push_data(picture(1, Picture::Key, 6)).is_empty());
        q.remove_subscription(101);
        assert_eq!(q.push_data(picture(1, Picture::Delta, 7)), [1]);
    }

    fn channels(q: &mut ClientQueue) -> Vec<u32> {
        std::iter::from_fn(|| q.pop())
            .filter_map(|o| match o {
                Outgoing::Data(d) => Some(d.channel),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn frames_are_framed_as_the_spec_says() {
        let m = message_data(0x0102_0304, 0x1122_3344_5566_7788, b"pb");
        assert_eq!(
            m,
            [1, 4, 3, 2, 1, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, b'p', b'b']
        );
        assert_eq!(time(1), [2, 1, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn within_the_bound_nothing_is_dropped_and_order_is_kept() {
        let mut q = ClientQueue::new(300);
        for (c, ch) in [(Class::Camera, 1), (Class::Serial, 3), (Class::Audio, 2)] {
            assert!(q.push_data(data(c, ch, 100)).is_empty());
        }
        assert_eq!(q.data_bytes(), 300);
        assert_eq!(channels(&mut q), [1, 3, 2]);
        assert_eq!(q.data_bytes(), 0);
    }

    #[test]
    fn a_full_queue_loses_camera_first_then_audio_then_serial() {
        let mut q = ClientQueue::new(400);
        for (c, ch) in [
            (Class::Serial, 3),
            (Class::Audio, 2),
            (Class::Camera, 1),
            (Class::Camera, 11),
        ] {
            assert!(q.push_data(data(c, ch, 100)).is_empty());
        }
        // Audio pushes out the oldest camera frame.
        assert_eq!(q.push_data(data(Class::Audio, 2, 100)), [1]);
        // Serial pushes out the other camera frame, then (needing more) the oldest audio.
        assert_eq!(q.push_data(data(Class::Serial, 3, 200)), [11, 2]);
        assert_eq!(q.data_bytes(), 400);
        assert_eq!(channels(&mut q), [3, 2, 3]);
    }

    #[test]
    fn a_camera_frame_never_pushes_out_audio_or_serial() {
        let mut q = ClientQueue::new(200);
        assert!(q.push_data(data(Class::Audio, 2, 100)).is_empty());
        assert!(q.push_data(data(Class::Serial, 3, 100)).is_empty());
        assert_eq!(q.push_data(data(Class::Camera, 1, 100)), [1]);
        // Audio may push out older audio, never serial.
        assert_eq!(q.push_data(data(Class::Audio, 4, 100)), [2]);
        assert_eq!(q.push_data(data(Class::Audio, 5, 150)), [4, 5]);
        assert_eq!(channels(&mut q), [3]);
    }

    #[test]
    fn a_message_larger_than_the_bound_goes_out_alone() {
        let mut q = ClientQueue::new(200);
        assert!(q.push_data(data(Class::Camera, 1, 100)).is_empty());
        // A chunked camera frame: it pushes out the queued camera frame and is queued alone.
        assert_eq!(q.push_data(data(Class::Camera, 11, 500)), [1]);
        assert_eq!(q.data_bytes(), 500);
        // Anything more pushes it out (it is the oldest camera frame) or is dropped itself.
        assert_eq!(q.push_data(data(Class::Camera, 1, 100)), [11]);
        assert_eq!(q.push_data(data(Class::Audio, 2, 100)), Vec::<u32>::new());
        // With audio queued, which a camera frame never pushes out, it is dropped itself.
        assert_eq!(q.push_data(data(Class::Camera, 12, 500)), [1, 12]);
        assert_eq!(channels(&mut q), [2]);
    }

    #[test]
    fn control_messages_are_kept_and_time_is_coalesced() {
        let mut q = ClientQueue::new(100);
        q.push_time(5);
        assert_eq!(q.push_text("a".into()), 2);
        q.push_time(9);
        q.push_time(8);
        assert!(q.push_data(data(Class::Camera, 1, 100)).is_empty());
        assert_eq!(q.push_data(data(Class::Camera, 1, 100)), [1]);
        assert_eq!(q.pop(), Some(Outgoing::Time(9)));
        assert_eq!(q.pop(), Some(Outgoing::Text("a".into())));
        assert!(matches!(q.pop(), Some(Outgoing::Data(_))));
        assert!(q.is_empty());
        q.push_time(10);
        assert_eq!(q.pop(), Some(Outgoing::Time(10)));
    }

    #[test]
    fn unsubscribing_forgets_what_is_queued_for_it() {
        let mut q = ClientQueue::new(1000);
        for ch in [1, 2, 1] {
            assert!(q.push_data(data(Class::Camera, ch, 100)).is_empty());
        }
        q.remove_subscription(101);
        assert_eq!(q.data_bytes(), 100);
        assert_eq!(channels(&mut q), [2]);
    }
}
