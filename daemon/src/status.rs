//! The status snapshot the web UI, `/api/status` and `/metrics` show, read from the runtime's
//! counters; rates and the recent latency window come from samples kept in
//! [`Runtime::observed`](crate::runtime::Runtime).

use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::config::{Modality, SpoolMode, WhenFull};
use crate::metrics::LatencySnapshot;
use crate::notify::{stall_after, SOURCE_STALL_AFTER};
use crate::runtime::Runtime;

fn age_ms(now_ns: i64, then_ns: i64) -> Option<u64> {
    (then_ns > 0).then(|| ((now_ns - then_ns).max(0) / 1_000_000) as u64)
}

fn dbfs(linear: f32) -> f64 {
    if linear > 0.0 {
        (20.0 * (linear as f64).log10()).max(-120.0)
    } else {
        -120.0
    }
}

/// A budget's pacing now (bytes per second) and, under `auto`, its estimate.
fn budget_status(b: &crate::uplink::Budget) -> (u64, Option<rigd_web::LinkEstimate>) {
    let reading = b.reading();
    let pacing = reading.map_or(b.rate(), |r| r.pacing as u64);
    let estimate = reading.map(|r| rigd_web::LinkEstimate {
        bytes_per_second: r.estimate as u64,
        pacing_bytes_per_second: r.pacing as u64,
        base_rtt_ms: r.base_rtt.map(|d| d.as_secs_f64() * 1e3),
        queueing_ms: r.queueing.as_secs_f64() * 1e3,
        mode: r.mode.name().to_string(),
        broker_delays: r.broker_delays,
        path_queue_ms: r.path_queue.map(|d| d.as_secs_f64() * 1e3),
    });
    (pacing, estimate)
}

/// `[[pulsar.link]]`: each link's health, load and estimate.
fn links_status(pool: &crate::uplink::Pool) -> Vec<rigd_web::LinkStatus> {
    let now = std::time::Instant::now();
    pool.paths()
        .iter()
        .map(|p| {
            let producers = p.load();
            let state = p.state(now);
            let (pacing, estimate) = p.budget.as_deref().map(budget_status).unzip();
            rigd_web::LinkStatus {
                name: p.name.clone(),
                interface: p.interface.clone().unwrap_or_default(),
                cost: p.cost,
                up: state.up,
                held: state.held,
                given_up: state.given_up,
                last_given_up: state.why,
                moved_in: rigd_web::LinkMoves {
                    cheaper: state.moved_in_cheaper,
                    spread: state.moved_in_spread,
                },
                producers,
                budget_bytes_per_second: pacing,
                estimate: estimate.flatten(),
            }
        })
        .collect()
}

impl rigd_web::StatusSource for Runtime {
    fn status(&self) -> rigd_web::Status {
        let now = self.clock.now();
        let t = Instant::now();
        let mut observed = self
            .observed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut uplink = rigd_web::UplinkStatus {
            configured: self.config.pulsar.url.is_some(),
            connected: false,
            broker: self.config.pulsar.url.clone(),
            paused: self.uplink_paused.load(Ordering::Relaxed),
            ..Default::default()
        };
        let mut all_connected = !self.sources.is_empty();
        let mut sources = Vec::new();
        let mut oldest_ns = 0u64;
        let mut latency = LatencySnapshot::default();
        for e in &self.sources {
            let sp = self.spool.stats(&e.id);
            // Counted once, where the refusal is logged (the producer).
            let mut refused = 0;
            let mut wire = 0;
            let mut starved = std::time::Duration::ZERO;
            if let Some(u) = &e.uplink {
                wire = u.wire_bytes.load(Ordering::Relaxed);
                starved = u.starved.longest();
                all_connected &= u.connected.load(Ordering::Relaxed);
                uplink.in_flight += u.in_flight.load(Ordering::Relaxed) as u64;
                uplink.published += u.published.load(Ordering::Relaxed);
                uplink.reconnects += u.reconnects.load(Ordering::Relaxed);
                refused = u.refused.load(Ordering::Relaxed);
                let err = u.last_error.lock().map(|s| s.clone()).unwrap_or_default();
                if !err.is_empty() && !u.connected.load(Ordering::Relaxed) {
                    uplink.last_error = Some(err);
                }
                if u.terminated.load(Ordering::Relaxed) {
                    uplink.terminated.push(e.id.to_string());
                }
            }
            uplink.refused += refused;
            let records = sp.records.load(Ordering::Relaxed);
            let o = sp.oldest_ns.load(Ordering::Relaxed);
            // What an on-request source holds is its retention, not a backlog.
            if !e.on_request && records > 0 && o > 0 && (oldest_ns == 0 || o < oldest_ns) {
                oldest_ns = o;
            }
            let snap = e.lane.latency.snapshot();
            latency.add(&snap);
            let device_drops = e.health.drops();
            let spool_dropped = sp.dropped.load(Ordering::Relaxed);
            let drops = device_drops + spool_dropped + refused;
            let (frames, bytes) = (e.health.frames(), e.health.bytes());
            let modality = e.modality;
            let level = e.health.audio_level().or_else(|| e.lane.preview.level());
            sources.push(rigd_web::SourceStatus {
                id: e.id.to_string(),
                kind: e.kind.to_string(),
                modality: modality.as_str().to_string(),
                state: format!("{:?}", e.health.state()).to_lowercase(),
                reason: e.health.reason(),
                detail: e.health.detail(),
                frames,
                bytes,
                drops,
                device_drops,
                capture_waits: e.health.capture_waits(),
                spool_dropped,
                refused,
                last_frame_age_ms: age_ms(now.ns, e.health.last_frame_ns()),
                stall_after_ms: self
                    .config
                    .sources
                    .iter()
                    .find(|c| c.id() == &*e.id)
                    .and_then(|c| stall_after(c, self.config.rig.bucket_ms))
                    .unwrap_or(SOURCE_STALL_AFTER)
                    .as_millis() as u64,
                frame_rate: observed.rate(&e.id, "frames", t, frames),
                byte_rate: observed.rate(&e.id, "bytes", t, bytes),
                drop_rate: observed.rate(&e.id, "drops", t, drops),
                published: e
                    .uplink
                    .as_ref()
                    .map_or(0, |u| u.published.load(Ordering::Relaxed)),
                priority: e.priority,
                uplink_rate: e
                    .uplink
                    .as_ref()
                    .and_then(|_| observed.rate(&e.id, "wire", t, wire)),
                uplink_bytes: wire,
                waiting_for_bandwidth: e.lane.waiting_for_bandwidth.load(Ordering::Relaxed),
                bandwidth_waiting: records > 0
                    && e.uplink
                        .as_ref()
                        .is_some_and(|u| u.connected.load(Ordering::Relaxed))
                    && !self.uplink_paused.load(Ordering::Relaxed),
                starved_ms: starved.as_millis() as u64,
                starved: starved >= crate::uplink::pool::STARVED_AFTER,
                backlog_eta_s: {
                    let pushed = sp.pushed.load(Ordering::Relaxed);
                    let popped = sp.popped.load(Ordering::Relaxed);
                    let i = observed.rate(&e.id, "spool-pushed", t, pushed);
                    let o = observed.rate(&e.id, "spool-popped", t, popped);
                    match (i, o) {
                        (Some(i), Some(o)) if records > 0 && o - i > 0.01 => {
                            Some(records as f64 / (o - i))
                        }
                        _ => None,
                    }
                },
                spooled_records: records,
                spool_bytes: sp.bytes.load(Ordering::Relaxed),
                spool_pushed: sp.pushed.load(Ordering::Relaxed),
                spool_popped: sp.popped.load(Ordering::Relaxed),
                preview_seq: (modality == Modality::Camera)
                    .then(|| e.lane.preview.jpeg_seq())
                    .flatten(),
                audio: (modality == Modality::Audio)
                    .then_some(level)
                    .flatten()
                    .map(|l| rigd_web::AudioLevelStatus {
                        rms_dbfs: dbfs(l.rms),
                        peak_dbfs: dbfs(l.peak),
                    }),
                last_records: match modality {
                    Modality::Serial => e.lane.preview.records(),
                    Modality::Can => crate::can::status_lines(
                        self.config
                            .sources
                            .iter()
                            .find(|c| c.id() == &*e.id)
                            .and_then(|c| c.dbc())
                            .and_then(crate::can::cached_dbc)
                            .as_deref(),
                        &e.lane.preview.can_records(),
                    ),
                    _ => Vec::new(),
                },
                live_dropped: self.live.dropped(&e.id),
                upload: if e.on_request { "on-request" } else { "live" }.to_string(),
                retention_evicted: sp.evicted.load(Ordering::Relaxed),
                held_since_age_ms: if records > 0 {
                    age_ms(now.ns, o as i64)
                } else {
                    None
                },
                latency: uplink.configured.then(|| snap.to_web()),
                capture_latency: uplink
                    .configured
                    .then(|| e.lane.capture_latency.snapshot().to_web()),
            });
        }
        uplink.connected = uplink.configured && all_connected;
        uplink.credentials = crate::uplink::identity::problem(
            self.client_cert.as_ref(),
            uplink.last_error.as_deref(),
        );
        uplink.policy = crate::uplink::identity::policy_refusal(
            self.config.pulsar.encryption_key_file.is_some(),
            uplink.last_error.as_deref(),
        );
        uplink.publish_rate = observed.rate("", "published", t, uplink.published);
        if let Some(pool) = self.pool.as_ref().filter(|_| uplink.configured) {
            let budgets: Vec<_> = pool
                .paths()
                .iter()
                .filter_map(|p| p.budget.clone())
                .collect();
            if pool.multi() {
                uplink.links = links_status(pool);
            } else if let Some(b) = budgets.first() {
                let (pacing, estimate) = budget_status(b);
                uplink.budget_bytes_per_second = Some(pacing);
                uplink.estimate = estimate;
            }
            let mut granted = [0u64; crate::uplink::budget::RANKS];
            for b in &budgets {
                for (sum, g) in granted.iter_mut().zip(b.granted()) {
                    *sum += g;
                }
            }
            for (rank, total) in granted.into_iter().enumerate() {
                let key = format!("rank{rank}");
                match observed.rate(&key, "granted", t, total) {
                    Some(rate) if total > 0 => uplink.rank_shares.push(rigd_web::RankShare {
                        rank: rank as u32,
                        bytes_per_second: rate,
                    }),
                    _ => {}
                }
            }
        }
        let wire_total: u64 = self
            .sources
            .iter()
            .filter_map(|e| e.uplink.as_ref())
            .map(|u| u.wire_bytes.load(Ordering::Relaxed))
            .sum();
        uplink.wire_rate = uplink
            .configured
            .then(|| observed.rate("", "wire", t, wire_total))
            .flatten();
        let window = observed.latency.window(t, &latency);
        uplink.latency_samples = window.count();
        uplink.latency_p50_ms = window.quantile(0.5).map(|d| d.as_secs_f64() * 1e3);
        uplink.latency_p99_ms = window.quantile(0.99).map(|d| d.as_secs_f64() * 1e3);

        let all = self.spool.all_stats();
        let sum = |f: fn(&crate::spool::SourceSpoolStats) -> u64| -> u64 {
            all.iter().map(|(_, s)| f(s)).sum()
        };
        let records = sum(|s| s.records.load(Ordering::Relaxed));
        let pushed = sum(|s| s.pushed.load(Ordering::Relaxed));
        let popped = sum(|s| s.popped.load(Ordering::Relaxed));
        let push_rate = observed.rate("", "spool-pushed", t, pushed);
        let pop_rate = observed.rate("", "spool-popped", t, popped);
        let drain_eta_s = match (push_rate, pop_rate) {
            (Some(i), Some(o)) if records > 0 && o - i > 0.01 => Some(records as f64 / (o - i)),
            _ => None,
        };
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
                when_full: match self.config.spool.when_full {
                    WhenFull::DropOldest => "drop-oldest",
                    WhenFull::DropNewest => "drop-newest",
                }
                .to_string(),
                bytes: self.spool.total_bytes(),
                index_bytes: self.spool.index_bytes(),
                index_damage: self.spool.index_damage(),
                max_bytes: self.config.spool.max_bytes.0,
                records,
                dropped: sum(|s| s.dropped.load(Ordering::Relaxed)),
                quarantined: self.spool.quarantined(),
                oldest_age_ms: age_ms(now.ns, oldest_ns as i64),
                pushed,
                popped,
                push_rate,
                pop_rate,
                drain_eta_s,
            },
            events: rigd_web::EventsStatus {
                marked: self.events.marked(),
                topic: self.events.topic.clone(),
                last: self.events.lane.preview.records(),
            },
            live: rigd_web::LiveStatus {
                clients: self.live.clients() as u64,
                max_clients: self.live.max_clients() as u64,
            },
            recall: self.recall.as_deref().map(|r| self.recall_status(r)),
            campaigns: self
                .recall
                .as_deref()
                .and_then(|r| r.extension())
                .map(|c| c.status()),
        }
    }

    fn preview(&self, source: &str) -> Option<rigd_web::PreviewImage> {
        let e = self.sources.iter().find(|e| &*e.id == source)?;
        let p = e.lane.preview.jpeg()?;
        Some(rigd_web::PreviewImage {
            seq: p.seq,
            jpeg: p.jpeg,
        })
    }
}

impl Runtime {
    fn recall_status(&self, r: &crate::recall::Recall) -> rigd_web::RecallStatus {
        let s = &r.stats;
        let by_reason: std::collections::BTreeMap<String, u64> = s
            .rejected
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(kind, n)| (kind.to_string(), *n))
            .collect();
        rigd_web::RecallStatus {
            control_topic: self.config.pulsar.control_topic(&self.config.rig.id),
            connected: s.connected.load(Ordering::Relaxed),
            pending: s.pending.load(Ordering::Relaxed),
            uploads: s.uploads.load(Ordering::Relaxed),
            cancels: s.cancels.load(Ordering::Relaxed),
            coverages: s.coverages.load(Ordering::Relaxed),
            rejected: by_reason.values().sum(),
            rejected_by_reason: by_reason,
            frames_sent: s.frames_sent.load(Ordering::Relaxed),
            bytes_sent: s.bytes_sent.load(Ordering::Relaxed),
            last_error: s
                .last_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        }
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stall_thresholds_are_the_watchdogs() {
        let cfg = crate::config::Config::parse(
            "[rig]\nid = \"r\"\n[[source]]\nid = \"cam\"\nkind = \"synthetic-camera\"\nfps = 0.2\n\
             [[source]]\nid = \"gps\"\nkind = \"synthetic-serial\"\nrate-hz = 10\n\
             [[source]]\nid = \"tty\"\nkind = \"serial\"\ndevice = \"/dev/ttyS0\"\n",
            "t",
        )
        .unwrap();
        let after = |i: usize| stall_after(&cfg.sources[i], 33);
        assert_eq!(after(0), Some(std::time::Duration::from_secs(20)));
        assert_eq!(after(1), Some(SOURCE_STALL_AFTER));
        assert_eq!(after(2), None);
        assert_eq!(cfg.sources[2].modality(), Modality::Serial);
        assert_eq!(dbfs(0.0), -120.0);
        assert!((dbfs(0.5) + 6.02).abs() < 0.01);
    }
}
