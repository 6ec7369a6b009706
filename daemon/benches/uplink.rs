//! Uplink publish benchmark against a real broker: rigd's producer with its real wire format
//! (properties, key, event time), as many frames as the in-flight window allows.
//!
//! usage: cargo bench -p rigd --bench uplink -- URL TOPIC SIZE COUNT [MAX_IN_FLIGHT] [BATCHING] [PUBLIC_KEY]
//! (BATCHING: true|false, default false, as JavaProducer.java's argument; PUBLIC_KEY: an RSA public
//! key PEM, every message encrypted end to end for it)
//! prints one JSON line like tests/bench/java/JavaProducer.java, for tests/bench/run.sh.

use bytes::Bytes;
use rigd::uplink::{BatchPolicy, Producer, ProducerConfig};
use rigd_drivers::{ClockState, Frame, Media};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if args.len() < 4 {
        eprintln!("usage: uplink URL TOPIC SIZE COUNT [MAX_IN_FLIGHT]");
        std::process::exit(2);
    }
    let (url, topic) = (args[0].clone(), args[1].clone());
    let size: usize = args[2].parse().expect("SIZE");
    let count: u64 = args[3].parse().expect("COUNT");
    let window: usize = args
        .get(4)
        .map(|w| w.parse().expect("MAX_IN_FLIGHT"))
        .unwrap_or(500);
    let batching = args.get(5).is_some_and(|b| b == "true");
    let encryption = args.get(6).map(|k| {
        let e = rigd::seal::Encryptor::load(k.as_ref(), "bench", Duration::from_secs(4 * 3600))
            .expect("PUBLIC_KEY");
        std::sync::Arc::new(e)
    });
    let (ack_tx, mut acks) = mpsc::unbounded_channel();
    let (_stop_tx, stop) = watch::channel(false);
    let producer = Producer::spawn(
        ProducerConfig {
            max_in_flight: window,
            max_in_flight_bytes: (64 << 20).max(size * 2),
            max_frame_bytes: 64 << 20,
            send_timeout: Duration::from_secs(60),
            encryption,
            batch: if batching {
                BatchPolicy::default()
            } else {
                BatchPolicy {
                    max_messages: 1,
                    ..BatchPolicy::default()
                }
            },
            ..ProducerConfig::new(
                &url,
                topic.clone(),
                format!("bench-{}", topic.rsplit('/').next().unwrap_or("x")),
                "bench",
                33,
            )
        },
        ack_tx,
        stop,
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while !producer.is_connected() {
        assert!(Instant::now() < deadline, "not connected to the broker");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let payload = Bytes::from(vec![0x5a; size]);
    let source: std::sync::Arc<str> = "bench".into();
    let mut latencies = Vec::with_capacity(count as usize);
    let (mut sent, mut acked) = (0u64, 0u64);
    let start = Instant::now();
    while acked < count {
        while sent < count {
            let frame = Frame {
                source: source.clone(),
                seq: sent,
                capture_ns: rigd_drivers::realtime_ns(),
                clock: ClockState::Unsynced,
                media: Media::Serial { text: false },
                payload: payload.clone(),
            };
            if producer.try_submit(frame.into()).is_err() {
                break;
            }
            sent += 1;
        }
        tokio::select! {
            ack = acks.recv() => {
                let ack = ack.expect("producer stopped");
                latencies.push(ack.latency);
                acked += 1;
                while let Ok(ack) = acks.try_recv() {
                    latencies.push(ack.latency);
                    acked += 1;
                }
            }
            _ = producer.room() => {}
            _ = tokio::time::sleep(Duration::from_millis(5)) => {}
        }
    }
    let secs = start.elapsed().as_secs_f64();
    latencies.sort();
    let pct = |p: f64| {
        latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)].as_secs_f64()
            * 1e3
    };
    println!(
        "{{\"client\":\"rigd\",\"size\":{size},\"count\":{count},\"failed\":0,\"secs\":{secs:.3},\"msg_per_s\":{:.1},\"mb_per_s\":{:.2},\"p50_ms\":{:.3},\"p99_ms\":{:.3}}}",
        count as f64 / secs,
        count as f64 * size as f64 / secs / 1e6,
        pct(0.5),
        pct(0.99)
    );
}
