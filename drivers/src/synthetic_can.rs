//! `synthetic-can`: a vehicle's CAN bus without a vehicle. Frames of the messages of
//! `examples/vehicle.dbc` (speed, steering, brake, a multiplexed powertrain message with the gear,
//! an extended-id fuel rate, and with `fd` a 16-byte CAN FD battery message), their values moving
//! over time, at `rate_hz` frames a second, batched one record per bucket as the `can` source's
//! are ([`crate::can_record`]): each frame with its own time inside the bucket.
//!
//! [`frame_at`] is pure: frame `n` of the schedule at time `ns`.

use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;

use crate::can_record::{CanFrame, BRS, EFF_FLAG, FD};
use crate::source::{FrameSink, Source, SourceError, StopFlag};
use crate::{FrameClock, Media, Stamp};

/// The messages in the order they go round: speed most often, then steering.
const SCHEDULE: [u8; 10] = [0, 1, 0, 2, 0, 1, 3, 4, 0, 5];

/// Frame `n` of the schedule, its values at time `ns` (the FD message is skipped, its turn
/// taken by the speed, when `fd` is off). Pure.
pub fn frame_at(n: u64, ns: i64, fd: bool) -> CanFrame {
    let t = ns as f64 / 1e9;
    let phase = |period_s: f64| (t / period_s * std::f64::consts::TAU).sin();
    let mut which = SCHEDULE[(n % SCHEDULE.len() as u64) as usize];
    if which == 5 && !fd {
        which = 0;
    }
    let mut data = vec![0u8; 8];
    let (id, flags) = match which {
        0 => {
            // VehicleSpeed 0x100: Speed 0|16@1+ (0.01) km/h, Accel 16|12@1- (0.001) m/s2.
            let speed = 60.0 + 40.0 * phase(20.0);
            let accel = 2.0 * phase(7.0);
            put_le(&mut data, 0, 16, (speed / 0.01).round() as i64);
            put_le(&mut data, 16, 12, (accel / 0.001).round() as i64);
            (0x100, 0)
        }
        1 => {
            // SteeringAngle 0x101 (Motorola): Angle 7|16@0- (0.1) deg, Rate 23|16@0- (0.1) deg/s.
            let angle = 90.0 * phase(9.0);
            let rate = 60.0 * phase(4.5);
            put_be(&mut data, 0, 16, (angle / 0.1).round() as i64);
            put_be(&mut data, 2, 16, (rate / 0.1).round() as i64);
            (0x101, 0)
        }
        2 => {
            // Brake 0x102: Pressure 0|12@1+ (0.1) bar, Pedal 12|1@1+.
            let pressure = (80.0 * phase(15.0)).max(0.0);
            put_le(&mut data, 0, 12, (pressure / 0.1).round() as i64);
            put_le(&mut data, 12, 1, i64::from(pressure > 0.5));
            (0x102, 0)
        }
        3 => {
            // Powertrain 0x200, multiplexed by Page (0|8): page 0 Gear 8|4 and EngineRpm
            // 16|16 (0.25) rpm; page 1 CoolantTemp 8|8 (1,-40) degC and OilPressure 23|16@0+
            // (0.01) bar.
            let page = (n / SCHEDULE.len() as u64) % 2;
            data[0] = page as u8;
            if page == 0 {
                let gear = 1 + ((t / 5.0) as i64 % 5);
                put_le(&mut data, 8, 4, gear);
                put_le(
                    &mut data,
                    16,
                    16,
                    ((2000.0 + 1500.0 * phase(6.0)) / 0.25) as i64,
                );
            } else {
                put_le(&mut data, 8, 8, (90.0 + 5.0 * phase(60.0) + 40.0) as i64);
                put_be(&mut data, 2, 16, ((3.5 + phase(8.0)) / 0.01) as i64);
            }
            (0x200, 0)
        }
        4 => {
            // FuelRate, extended id 0x18FEF200: Rate 0|16@1+ (0.05) L/h.
            put_le(&mut data, 0, 16, ((8.0 + 4.0 * phase(11.0)) / 0.05) as i64);
            (EFF_FLAG | 0x18FE_F200, 0)
        }
        _ => {
            // BatteryCells 0x300, CAN FD, 16 bytes: Cell1..Cell4 16-bit Intel (0.001) V at
            // bytes 0, 2, 4, 6, PackCurrent 64|16@1- (0.1) A.
            data = vec![0u8; 16];
            for cell in 0..4 {
                let v = 3.7 + 0.05 * phase(13.0 + cell as f64);
                put_le(&mut data, cell * 16, 16, (v / 0.001).round() as i64);
            }
            put_le(&mut data, 64, 16, (120.0 * phase(10.0) / 0.1) as i64);
            (0x300, FD | BRS)
        }
    };
    CanFrame {
        ts_ns: ns,
        id,
        flags,
        data,
    }
}

/// Writes the low `len` bits of `v` little-endian from bit `start` (Intel numbering).
fn put_le(data: &mut [u8], start: usize, len: usize, v: i64) {
    for i in 0..len {
        let bit = start + i;
        let on = (v >> i) & 1 == 1;
        data[bit / 8] = (data[bit / 8] & !(1 << (bit % 8))) | (u8::from(on) << (bit % 8));
    }
}

/// Writes the low `len` bits of `v` big-endian from the MSB of byte `byte` on (Motorola).
fn put_be(data: &mut [u8], byte: usize, len: usize, v: i64) {
    for i in 0..len {
        let linear = byte * 8 + i;
        let on = (v >> (len - 1 - i)) & 1 == 1;
        let bit = 7 - linear % 8;
        data[linear / 8] = (data[linear / 8] & !(1 << bit)) | (u8::from(on) << bit);
    }
}

/// The synthetic bus.
pub struct SyntheticCan {
    id: String,
    rate_hz: f64,
    fd: bool,
    bucket_ms: u32,
    clock: Arc<dyn FrameClock>,
}

impl SyntheticCan {
    pub fn new(
        id: &str,
        rate_hz: f64,
        fd: bool,
        bucket_ms: u32,
        clock: Arc<dyn FrameClock>,
    ) -> Self {
        Self {
            id: id.to_string(),
            rate_hz,
            fd,
            bucket_ms: bucket_ms.max(1),
            clock,
        }
    }
}

impl Source for SyntheticCan {
    fn id(&self) -> &str {
        &self.id
    }

    /// Each bucket once it has ended: its frames, at `rate_hz` from the rig clock's start, in
    /// one record stamped with its first frame's time.
    fn run(&mut self, sink: &mut FrameSink, stop: &StopFlag) -> Result<(), SourceError> {
        let bucket_ns = i64::from(self.bucket_ms) * 1_000_000;
        let period_ns = (1e9 / self.rate_hz.max(0.001)).max(1.0);
        let start = self.clock.now().ns;
        // Frame n is at start + n * period; the first bucket sent is the next whole one.
        let mut bucket = start.div_euclid(bucket_ns) + 1;
        let mut n = 0u64;
        let mut payload = Vec::new();
        loop {
            let end = (bucket + 1) * bucket_ns;
            let now = self.clock.now();
            if now.ns < end {
                let wait = Duration::from_nanos((end - now.ns) as u64);
                if stop.sleep(wait) {
                    return Ok(());
                }
                continue;
            }
            let begin = bucket * bucket_ns;
            let mut frames = Vec::new();
            loop {
                let ts = start + (n as f64 * period_ns) as i64;
                if ts >= end {
                    break;
                }
                if ts >= begin {
                    frames.push(frame_at(n, ts, self.fd));
                }
                n += 1;
            }
            // Far behind (a stopped clock stepped forward): on from now, not a burst.
            if now.ns - end > 10 * bucket_ns {
                bucket = now.ns.div_euclid(bucket_ns);
                n = ((bucket * bucket_ns - start) as f64 / period_ns)
                    .ceil()
                    .max(0.0) as u64;
            } else {
                bucket += 1;
            }
            let Some(first) = frames.first() else {
                continue;
            };
            payload.clear();
            crate::can_record::encode(&frames, &mut payload);
            let stamp = Stamp {
                ns: first.ts_ns,
                state: now.state,
            };
            sink.emit(
                stamp,
                Media::Can {
                    frames: frames.len() as u32,
                },
                Bytes::copy_from_slice(&payload),
            )
            .map_err(|_| SourceError::PipelineClosed {
                source_id: self.id.clone(),
            })?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_follow_the_schedule_with_their_layouts() {
        let f = frame_at(0, 0, false);
        assert_eq!((f.id, f.data.len()), (0x100, 8));
        // 60 km/h at t = 0: 6000 in 0.01 steps, little-endian.
        assert_eq!(&f.data[..2], &6000u16.to_le_bytes());
        let s = frame_at(1, 0, false);
        assert_eq!(s.id, 0x101);
        assert_eq!(&s.data[..2], &[0, 0], "angle 0 at t = 0");
        let fd = frame_at(9, 0, true);
        assert_eq!((fd.id, fd.flags, fd.data.len()), (0x300, FD | BRS, 16));
        assert_eq!(frame_at(9, 0, false).id, 0x100);
        assert_eq!(frame_at(7, 0, false).id, EFF_FLAG | 0x18FE_F200);
        let p0 = frame_at(6, 0, false);
        let p1 = frame_at(16, 0, false);
        assert_eq!((p0.id, p0.data[0], p1.data[0]), (0x200, 0, 1));
    }

    #[test]
    fn motorola_writes_put_the_msb_first() {
        let mut d = [0u8; 8];
        put_be(&mut d, 0, 16, -500);
        assert_eq!(&d[..2], &(-500i16).to_be_bytes());
        let mut d = [0u8; 8];
        put_le(&mut d, 16, 12, -1);
        assert_eq!(&d[2..4], &[0xff, 0x0f]);
    }
}
