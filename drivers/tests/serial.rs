//! The serial driver on pseudo-terminals: the same tty layer a USB-serial sensor goes through.
//! In-process pty pairs (`TTYPort::pair`) for framing, socat as a separate device-like process for
//! "sensor unplugged and plugged back".

mod common;

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Capture;
use rigd_drivers::serial::{FlowControl, Framing, Parity, SerialSettings, SerialSource};
use rigd_drivers::synthetic::{nmea_checksum, rmc_sentence};
use rigd_drivers::{Media, SystemClock};
use serialport::{SerialPort, TTYPort};

const WAIT: Duration = Duration::from_secs(10);

fn settings(device: &str, framing: Framing, max_record_bytes: usize) -> SerialSettings {
    SerialSettings {
        device: device.to_string(),
        baud: 115_200,
        parity: Parity::None,
        flow_control: FlowControl::None,
        data_bits: 8,
        stop_bits: 1,
        framing,
        delimiter: b"\n".to_vec(),
        max_record_bytes,
        bucket_ms: 33,
    }
}

/// A pty pair: the driver opens the slave by path, the test writes into the master.
fn pty() -> (TTYPort, String) {
    let (master, slave) = TTYPort::pair().expect("opening a pty pair");
    let path = slave.name().expect("pty slave has a name");
    // The driver opens the slave itself (exclusively); the master keeps the pty alive.
    drop(slave);
    (master, path)
}

/// Writes everything; while the driver has not opened the slave yet the master reports a hang-up
/// (`BrokenPipe`), so that is retried until `WAIT` runs out.
fn send(port: &mut TTYPort, mut bytes: &[u8]) {
    let deadline = Instant::now() + WAIT;
    while !bytes.is_empty() {
        match port.write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::TimedOut
                ) && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(2))
            }
            Err(e) => panic!("writing to the pty: {e}"),
        }
    }
}

fn start(settings: SerialSettings) -> Capture {
    let source = SerialSource::new("gnss", settings, Arc::new(SystemClock));
    Capture::start(Box::new(source), Duration::from_millis(50))
}

fn payloads(frames: &[rigd_drivers::Frame]) -> Vec<String> {
    frames
        .iter()
        .map(|f| String::from_utf8_lossy(&f.payload).into_owned())
        .collect()
}

fn good(n: u64) -> String {
    rmc_sentence(1_700_000_000_000_000_000 + n as i64 * 100_000_000, n)
}

/// `good(n)` with one character of the body changed, so the checksum no longer matches.
fn bad(n: u64) -> String {
    let s = good(n);
    let flipped = if s.as_bytes()[3] == b'X' { "Y" } else { "X" };
    format!("{}{}{}", &s[..3], flipped, &s[4..])
}

#[test]
fn nmea_good_and_bad_checksums_are_counted() {
    let (mut master, path) = pty();
    let cap = start(settings(&path, Framing::Nmea, 82));
    let mut expected = Vec::new();
    let mut stream = String::new();
    for n in 0..200u64 {
        if n % 5 == 4 {
            stream.push_str(&bad(n));
        } else {
            stream.push_str(&good(n));
            expected.push(good(n));
        }
        stream.push_str("\r\n");
    }
    send(&mut master, stream.as_bytes());
    cap.wait_for("160 good sentences and 40 drops", WAIT, |c| {
        c.frame_count() == 160 && c.health.drops() == 40
    });
    std::thread::sleep(Duration::from_millis(50));
    let frames = cap.stop();
    assert_eq!(payloads(&frames), expected);
    assert!(frames
        .iter()
        .all(|f| f.media == Media::Serial { text: true }));
    let seqs: Vec<u64> = frames.iter().map(|f| f.seq).collect();
    assert_eq!(seqs, (1..=160).collect::<Vec<_>>());
    assert!(
        frames
            .windows(2)
            .all(|w| w[0].capture_ns <= w[1].capture_ns),
        "stamps go forward"
    );
}

#[test]
fn random_bytes_do_not_stop_the_driver() {
    let (mut master, path) = pty();
    let cap = start(settings(&path, Framing::Nmea, 82));
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let garbage: Vec<u8> = (0..256 * 1024)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect();
    send(&mut master, &garbage);
    let after: Vec<String> = (0..20).map(good).collect();
    send(
        &mut master,
        format!("\r\n{}\r\n", after.join("\r\n")).as_bytes(),
    );
    cap.wait_for("the sentences after the garbage", WAIT, |c| {
        c.frames
            .lock()
            .unwrap()
            .last()
            .is_some_and(|f| f.payload == after[19].as_bytes())
    });
    let drops = cap.health.drops();
    let errors = cap.errors.lock().unwrap().clone();
    let frames = cap.stop();
    let got = payloads(&frames);
    assert_eq!(got[got.len() - 20..], after[..]);
    assert!(errors.is_empty(), "{errors:?}");
    assert!(drops > 100, "garbage runs are counted: {drops}");
    // A random run can only pass as a sentence with a matching checksum and printable body.
    for f in &frames[..frames.len() - 20] {
        let (body, sum) = f.payload[1..].split_at(f.payload.len() - 4);
        assert_eq!(
            format!("*{:02X}", nmea_checksum(body)),
            String::from_utf8_lossy(sum).to_uppercase()
        );
    }
}

#[test]
fn one_mib_line_without_delimiter_is_dropped_and_bounded() {
    let (mut master, path) = pty();
    let cap = start(settings(&path, Framing::Line, 4096));
    send(&mut master, b"before\n");
    let writer = std::thread::spawn(move || {
        let chunk = vec![b'x'; 64 * 1024];
        for _ in 0..16 {
            send(&mut master, &chunk);
        }
        send(&mut master, b"\nafter\n");
        master
    });
    cap.wait_for("the line after the long one", WAIT, |c| {
        c.frame_count() == 2
    });
    let _master = writer.join().unwrap();
    let drops = cap.health.drops();
    let frames = cap.stop();
    assert_eq!(payloads(&frames), ["before", "after"]);
    assert_eq!(drops, 1);
}

#[test]
fn raw_framing_groups_bytes_per_bucket() {
    let (mut master, path) = pty();
    let cap = start(settings(&path, Framing::Raw, 1 << 16));
    let mut sent = Vec::new();
    for i in 0..20u8 {
        let chunk: Vec<u8> = (0..50)
            .map(|j| i.wrapping_mul(50).wrapping_add(j))
            .collect();
        send(&mut master, &chunk);
        sent.extend_from_slice(&chunk);
        std::thread::sleep(Duration::from_millis(10));
    }
    cap.wait_for("every byte", WAIT, |c| {
        c.frames
            .lock()
            .unwrap()
            .iter()
            .map(|f| f.payload.len())
            .sum::<usize>()
            == sent.len()
    });
    let frames = cap.stop();
    let got: Vec<u8> = frames.iter().flat_map(|f| f.payload.to_vec()).collect();
    assert_eq!(got, sent);
    assert!(frames.len() >= 3, "200 ms of data spans several buckets");
    let buckets: Vec<i64> = frames.iter().map(|f| f.capture_ns / 33_000_000).collect();
    assert!(
        buckets.windows(2).all(|w| w[0] < w[1]),
        "one record per bucket: {buckets:?}"
    );
    assert!(frames
        .iter()
        .all(|f| f.media == Media::Serial { text: false }));
}

/// socat joining two ptys, as a separate process: killing it is the sensor being unplugged.
struct Socat {
    child: Child,
}

impl Socat {
    fn start(dir: &std::path::Path) -> Option<Self> {
        let (a, b) = (dir.join("ttyA"), dir.join("ttyB"));
        let _ = std::fs::remove_file(&a);
        let _ = std::fs::remove_file(&b);
        let child = Command::new("socat")
            .arg(format!("pty,raw,echo=0,link={}", a.display()))
            .arg(format!("pty,raw,echo=0,link={}", b.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let deadline = Instant::now() + Duration::from_secs(5);
        while !(a.exists() && b.exists()) {
            assert!(Instant::now() < deadline, "socat did not create its ptys");
            std::thread::sleep(Duration::from_millis(5));
        }
        Some(Self { child })
    }

    /// Kills exactly the process this test started.
    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Socat {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn open_writer(path: &std::path::Path) -> TTYPort {
    serialport::new(path.to_string_lossy(), 115_200)
        .timeout(Duration::from_secs(1))
        .open_native()
        .expect("opening the writer end")
}

#[test]
fn peer_closed_and_reopened_keeps_records_intact() {
    let dir = tempfile::tempdir().unwrap();
    let Some(socat) = Socat::start(dir.path()) else {
        skip!("socat is not installed (tests/setup.sh installs it)");
    };
    let cap = start(settings(
        &dir.path().join("ttyA").to_string_lossy(),
        Framing::Nmea,
        82,
    ));
    let mut writer = open_writer(&dir.path().join("ttyB"));
    let first: Vec<String> = (0..50).map(good).collect();
    for s in &first {
        writer.write_all(format!("{s}\r\n").as_bytes()).unwrap();
    }
    // Half a sentence, then the sensor goes away.
    writer.write_all(b"$GPRMC,123519,A,48").unwrap();
    cap.wait_for("the first 50 sentences", WAIT, |c| c.frame_count() == 50);
    std::thread::sleep(Duration::from_millis(50));
    drop(writer);
    socat.kill();
    cap.wait_for("the read error", WAIT, |c| {
        !c.errors.lock().unwrap().is_empty()
    });

    // Plugged back under the same name: the driver reopens it.
    let socat = Socat::start(dir.path()).expect("restarting socat");
    let mut writer = open_writer(&dir.path().join("ttyB"));
    let second: Vec<String> = (50..100).map(good).collect();
    for s in &second {
        writer.write_all(format!("{s}\r\n").as_bytes()).unwrap();
    }
    cap.wait_for("the next 50 sentences", WAIT, |c| c.frame_count() == 100);
    let drops = cap.health.drops();
    let errors = cap.errors.lock().unwrap().clone();
    let frames = cap.stop();
    drop(socat);
    let expected: Vec<String> = first.into_iter().chain(second).collect();
    assert_eq!(payloads(&frames), expected);
    assert_eq!(drops, 1, "the half sentence");
    assert!(errors.iter().all(|(_, retryable)| *retryable), "{errors:?}");
    assert!(
        errors[0].0.contains("ttyA"),
        "the error names the device: {errors:?}"
    );
}

/// Records per second the serial path sustains through a pty (NMEA framing, ~70-byte sentences).
/// `cargo test --release -p rigd-drivers --features serial --test serial -- --ignored --nocapture`
#[test]
#[ignore = "benchmark"]
fn bench_serial_records_per_second() {
    let (mut master, path) = pty();
    let cap = start(settings(&path, Framing::Nmea, 82));
    let cpu0 = cpu_ns();
    let t0 = Instant::now();
    let secs = 3;
    let writer = std::thread::spawn(move || {
        let mut batch = String::new();
        let mut n = 0u64;
        while t0.elapsed() < Duration::from_secs(secs) {
            batch.clear();
            for _ in 0..100 {
                batch.push_str(&good(n));
                batch.push_str("\r\n");
                n += 1;
            }
            send(&mut master, batch.as_bytes());
        }
        (n, master)
    });
    let (written, _master) = writer.join().unwrap();
    cap.wait_for("every record", WAIT, |c| {
        c.frame_count() as u64 + c.health.drops() >= written
    });
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu = (cpu_ns() - cpu0) as f64 / 1e9;
    let got = cap.frame_count() as u64;
    let drops = cap.health.drops();
    let bytes: usize = cap
        .frames
        .lock()
        .unwrap()
        .iter()
        .map(|f| f.payload.len() + 2)
        .sum();
    cap.stop();
    println!(
        "serial bench: {got} records ({drops} dropped) in {elapsed:.2} s = {:.0} records/s, {:.1} MB/s; \
         process CPU {cpu:.2} s (writer + driver + collector) = {:.2} us/record",
        got as f64 / elapsed,
        bytes as f64 / elapsed / 1e6,
        cpu * 1e6 / got as f64
    );
    assert_eq!(drops, 0);
}

fn cpu_ns() -> i64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as i64 * 1_000_000_000 + t.tv_nsec as i64
}
