//! Spool write and drain throughput against the physical limit of the same disk: a raw sequential
//! append of the same bytes with fdatasync at the same group-commit interval.
//!
//! usage: cargo bench -p rigd --bench spool -- DIR FRAME_BYTES TOTAL_BYTES [FSYNC_MS [ROUNDS]]
//!        cargo bench -p rigd --bench spool -- --fill DIR TOTAL_BYTES
//! prints JSON lines: one per round, then the medians over ROUNDS (default 3): raw write, spool
//! write (with space used), spool drain (with space left).

use bytes::Bytes;
use rigd::config::{ByteSize, SpoolConfig};
use rigd::spool::Spool;
use rigd_drivers::{ClockState, Frame, Media};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn du(path: &Path) -> u64 {
    let mut total = 0;
    if let Ok(rd) = std::fs::read_dir(path) {
        for e in rd.flatten() {
            let m = match e.metadata() {
                Ok(m) => m,
                Err(_) => continue,
            };
            total += if m.is_dir() { du(&e.path()) } else { m.len() };
        }
    }
    total
}

/// `--fill DIR TOTAL_BYTES`: a spool at DIR holding TOTAL_BYTES of a rig's mix per 33 ms bucket
/// (a 250 kB camera frame, a 6336-byte audio block, three 80-byte serial records), closed cleanly;
/// for the startup benchmark (tests/bench/startup.py).
fn fill(dir: &Path, total: u64) {
    let _ = std::fs::remove_dir_all(dir);
    let cfg = SpoolConfig {
        path: dir.to_path_buf(),
        max_bytes: ByteSize(total * 2 + (1 << 30)),
        free_reserve: ByteSize(0),
        ..Default::default()
    };
    let spool = Spool::open(&cfg).expect("open spool");
    let mix: Vec<(Arc<str>, Bytes, usize)> = vec![
        ("front".into(), Bytes::from(vec![0xd8u8; 250_000]), 1),
        ("mic".into(), Bytes::from(vec![0x11u8; 6336]), 1),
        ("gps".into(), Bytes::from(vec![b'$'; 80]), 3),
    ];
    let (mut seqs, mut bytes, mut records, mut buckets) = (vec![0u64; mix.len()], 0u64, 0u64, 0u64);
    let start = Instant::now();
    let mut ns = 1_700_000_000_000_000_000i64;
    while bytes < total {
        for (i, (source, payload, per_bucket)) in mix.iter().enumerate() {
            for _ in 0..*per_bucket {
                spool
                    .append(&rigd::payload::Held::plain(Frame {
                        source: source.clone(),
                        seq: seqs[i],
                        capture_ns: ns,
                        clock: ClockState::Unsynced,
                        media: Media::Serial { text: false },
                        payload: payload.clone(),
                    }))
                    .expect("append");
                spool.note_seq(source, seqs[i] + 1).expect("note");
                seqs[i] += 1;
                bytes += payload.len() as u64;
                records += 1;
            }
        }
        ns += 33_000_000;
        buckets += 1;
        if buckets % 64 == 0 {
            spool.commit().expect("commit");
        }
    }
    spool.close().expect("close");
    println!(
        "{{\"what\":\"fill\",\"records\":{records},\"bytes\":{bytes},\"secs\":{:.1}}}",
        start.elapsed().as_secs_f64()
    );
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if args.first().map(String::as_str) == Some("--fill") && args.len() == 3 {
        fill(Path::new(&args[1]), args[2].parse().expect("TOTAL_BYTES"));
        return;
    }
    if args.len() < 3 {
        eprintln!("usage: spool DIR FRAME_BYTES TOTAL_BYTES [FSYNC_MS [ROUNDS]]");
        std::process::exit(2);
    }
    let dir = Path::new(&args[0]);
    let size: usize = args[1].parse().expect("FRAME_BYTES");
    let total: u64 = args[2].parse().expect("TOTAL_BYTES");
    let every = Duration::from_millis(
        args.get(3)
            .map(|v| v.parse().expect("FSYNC_MS"))
            .unwrap_or(50),
    );
    let rounds: usize = args.get(4).map(|v| v.parse().expect("ROUNDS")).unwrap_or(3);
    let n = (total / size as u64).max(1);
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).expect("bench dir");
    let payload = Bytes::from((0..size).map(|i| (i * 31 % 251) as u8).collect::<Vec<_>>());
    let bytes = n as f64 * size as f64;

    // A virtual disk's speed depends on what is still being written back: raw and spool take
    // turns, each after a sync, and the medians are compared.
    let (mut raw, mut write, mut drain) = (Vec::new(), Vec::new(), Vec::new());
    let (mut used, mut left) = (0, 0);
    for round in 0..rounds {
        settle();
        let r = raw_write(dir, &payload, n, every);
        settle();
        let (w, u, spool) = spool_write(dir, &payload, n, every);
        let (d, l) = spool_drain(dir, spool);
        println!(
            "{{\"what\":\"round\",\"round\":{round},\"raw_mb_per_s\":{:.1},\"spool_mb_per_s\":{:.1},\"drain_mb_per_s\":{:.1}}}",
            bytes / r / 1e6,
            bytes / w / 1e6,
            bytes / d / 1e6
        );
        raw.push(r);
        write.push(w);
        drain.push(d);
        (used, left) = (u, l);
    }
    let (raw_secs, secs, drain_secs) = (median(raw), median(write), median(drain));
    println!(
        "{{\"what\":\"raw-write\",\"frame_bytes\":{size},\"frames\":{n},\"rounds\":{rounds},\"secs\":{raw_secs:.3},\"mb_per_s\":{:.1}}}",
        bytes / raw_secs / 1e6
    );
    println!(
        "{{\"what\":\"spool-write\",\"frame_bytes\":{size},\"frames\":{n},\"rounds\":{rounds},\"secs\":{secs:.3},\"mb_per_s\":{:.1},\"frames_per_s\":{:.0},\"ratio_to_raw\":{:.2},\"disk_bytes_per_byte\":{:.3}}}",
        bytes / secs / 1e6,
        n as f64 / secs,
        raw_secs / secs,
        used as f64 / bytes
    );
    println!(
        "{{\"what\":\"spool-drain\",\"frame_bytes\":{size},\"frames\":{n},\"rounds\":{rounds},\"secs\":{drain_secs:.3},\"mb_per_s\":{:.1},\"disk_bytes_left\":{left}}}",
        bytes / drain_secs / 1e6
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Writes back what earlier steps left dirty, so each measurement starts from a quiet disk.
fn settle() {
    let _ = std::process::Command::new("sync").status();
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The physical limit: the same payload bytes appended to one file, fdatasync every interval.
fn raw_write(dir: &Path, payload: &Bytes, n: u64, every: Duration) -> f64 {
    let mut raw = std::io::BufWriter::with_capacity(
        1 << 20,
        std::fs::File::create(dir.join("raw.bin")).expect("raw"),
    );
    let start = Instant::now();
    let mut last = start;
    for _ in 0..n {
        raw.write_all(payload).expect("raw write");
        if last.elapsed() >= every {
            raw.flush().expect("flush");
            raw.get_ref().sync_data().expect("fdatasync");
            last = Instant::now();
        }
    }
    raw.flush().expect("flush");
    raw.get_ref().sync_data().expect("fdatasync");
    let secs = start.elapsed().as_secs_f64();
    drop(raw);
    let _ = std::fs::remove_file(dir.join("raw.bin"));
    secs
}

/// Appends n frames with a group commit every interval; (seconds, disk bytes used, the spool).
fn spool_write(dir: &Path, payload: &Bytes, n: u64, every: Duration) -> (f64, u64, Arc<Spool>) {
    let _ = std::fs::remove_dir_all(dir.join("spool"));
    let cfg = SpoolConfig {
        path: dir.join("spool"),
        max_bytes: ByteSize(n * payload.len() as u64 * 4 + (1 << 30)),
        free_reserve: ByteSize(0),
        ..Default::default()
    };
    let spool = Spool::open(&cfg).expect("open spool");
    let source: Arc<str> = "bench".into();
    let start = Instant::now();
    let mut last = start;
    for seq in 0..n {
        let frame = Frame {
            source: source.clone(),
            seq,
            capture_ns: rigd_drivers::realtime_ns(),
            clock: ClockState::Unsynced,
            media: Media::Serial { text: false },
            payload: payload.clone(),
        };
        spool.append(&frame.into()).expect("append");
        if last.elapsed() >= every {
            spool.commit().expect("commit");
            last = Instant::now();
        }
    }
    spool.commit().expect("commit");
    let secs = start.elapsed().as_secs_f64();
    let used = du(&dir.join("spool"));
    (secs, used, spool)
}

/// Reads back and removes every frame, in order; (seconds, disk bytes left).
fn spool_drain(dir: &Path, spool: Arc<Spool>) -> (f64, u64) {
    let source: Arc<str> = "bench".into();
    let start = Instant::now();
    let mut from = 0;
    loop {
        let batch = spool.read_from(&source, from, 64).expect("read");
        if batch.is_empty() {
            break;
        }
        for f in batch {
            from = f.seq + 1;
            spool.remove(&source, f.seq).expect("remove");
        }
    }
    spool.commit().expect("commit");
    let secs = start.elapsed().as_secs_f64();
    let left = du(&dir.join("spool"));
    drop(spool);
    (secs, left)
}
