//! The status snapshot the web UI and `/api/status` show, read from the runtime's counters.

use std::sync::atomic::Ordering;

use crate::app::Runtime;
use crate::config::SpoolMode;

fn age_ms(now_ns: i64, then_ns: i64) -> Option<u64> {
    (then_ns > 0).then(|| ((now_ns - then_ns).max(0) / 1_000_000) as u64)
}

impl rigd_web::StatusSource for Runtime {
    fn status(&self) -> rigd_web::Status {
        let now = self.clock.now();
        let mut uplink = rigd_web::UplinkStatus {
            configured: self.config.pulsar.url.is_some(),
            connected: false,
            broker: self.config.pulsar.url.clone(),
            ..Default::default()
        };
        let mut all_connected = !self.sources.is_empty();
        let mut sources = Vec::new();
        let mut oldest_ns = 0u64;
        for e in &self.sources {
            let sp = self.spool.stats(&e.id);
            if let Some(u) = &e.uplink {
                all_connected &= u.connected.load(Ordering::Relaxed);
                uplink.in_flight += u.in_flight.load(Ordering::Relaxed) as u64;
                uplink.published += u.published.load(Ordering::Relaxed);
                uplink.refused += u.refused.load(Ordering::Relaxed);
                let err = u.last_error.lock().map(|s| s.clone()).unwrap_or_default();
                if !err.is_empty() && !u.connected.load(Ordering::Relaxed) {
                    uplink.last_error = Some(err);
                }
            }
            let o = sp.oldest_ns.load(Ordering::Relaxed);
            if sp.records.load(Ordering::Relaxed) > 0 && o > 0 && (oldest_ns == 0 || o < oldest_ns)
            {
                oldest_ns = o;
            }
            sources.push(rigd_web::SourceStatus {
                id: e.id.to_string(),
                kind: e.kind.to_string(),
                state: format!("{:?}", e.health.state()).to_lowercase(),
                reason: e.health.reason(),
                frames: e.health.frames(),
                bytes: e.health.bytes(),
                drops: e.health.drops()
                    + sp.dropped.load(Ordering::Relaxed)
                    + e.lane.refused.load(Ordering::Relaxed),
                last_frame_age_ms: age_ms(now.ns, e.health.last_frame_ns()),
                published: e.lane.published.load(Ordering::Relaxed),
                spooled_records: sp.records.load(Ordering::Relaxed),
            });
        }
        uplink.connected = uplink.configured && all_connected;
        let all = self.spool.all_stats();
        rigd_web::Status {
            rig: self.config.rig.id.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            uptime_s: self.started.elapsed().as_secs(),
            clock: self.clock_status(),
            sources,
            uplink,
            spool: rigd_web::SpoolStatus {
                path: self.spool.path().display().to_string(),
                mode: match self.config.spool.mode {
                    SpoolMode::OnOutage => "on-outage",
                    SpoolMode::Always => "always",
                }
                .to_string(),
                bytes: self.spool.total_bytes(),
                records: all
                    .iter()
                    .map(|(_, s)| s.records.load(Ordering::Relaxed))
                    .sum(),
                dropped: all
                    .iter()
                    .map(|(_, s)| s.dropped.load(Ordering::Relaxed))
                    .sum(),
                quarantined: self.spool.quarantined(),
                oldest_age_ms: age_ms(now.ns, oldest_ns as i64),
            },
        }
    }
}

impl Runtime {
    fn clock_status(&self) -> rigd_web::ClockStatus {
        let raw = rigd_drivers::realtime_ns();
        let at_raw = self.clock.map_realtime(raw);
        let now = self.clock.now();
        let mut c = rigd_web::ClockStatus {
            state: now.state.as_str().to_string(),
            now_ns: now.ns,
            realtime_error_ns: at_raw.ns - raw,
            ..Default::default()
        };
        if let Some(ptp) = &self.ptp {
            let r = ptp.report();
            c.offset_ns = r.offset_ns;
            c.master = r.master;
            c.port_state = Some(r.port_state);
            c.path_delay_ns = r.path_delay_ns;
            c.steps = ptp.clock.steps();
            c.master_changes = r.master_changes;
            c.frequency_ppm = r.frequency_ppm;
            c.time_to_lock_s = r.time_to_lock_s;
            c.locked_for_s = r.locked_for_s;
            c.holdover_s = r.holdover_s;
            c.estimated_drift_ns = r.estimated_drift_ns;
            c.task_cpu_ms = Some(r.task_cpu_ns / 1_000_000);
            c.error = r.error;
        }
        c
    }
}
