//! `/metrics`: the status in the Prometheus text exposition format (0.0.4). Every name starts with
//! `rigd_`; counters end in `_total`; queue depths are two counters (pushed, popped), never a gauge
//! that races. docs/WEB.md lists every family.

use std::fmt::Write;

use crate::{Histogram, RecallStatus, Status};

pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Writes metric families; one `# HELP`/`# TYPE` header per family.
struct Exposition {
    out: String,
}

impl Exposition {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {}", number(value));
    }

    /// A family of one sample without labels, when there is a value.
    fn single(&mut self, name: &str, kind: &str, help: &str, value: Option<f64>) {
        self.family(name, kind, help);
        if let Some(v) = value {
            self.sample(name, &[], v);
        }
    }

    /// A family with one sample per source.
    fn per_source(
        &mut self,
        s: &Status,
        name: &str,
        kind: &str,
        help: &str,
        value: impl Fn(&crate::SourceStatus) -> Option<f64>,
    ) {
        self.family(name, kind, help);
        for src in &s.sources {
            if let Some(v) = value(src) {
                self.sample(name, &[("source", &src.id)], v);
            }
        }
    }

    fn per_source_histogram<'s>(
        &mut self,
        s: &'s Status,
        name: &str,
        help: &str,
        value: impl Fn(&'s crate::SourceStatus) -> Option<&'s Histogram>,
    ) {
        self.family(name, "histogram", help);
        for src in &s.sources {
            if let Some(h) = value(src) {
                self.histogram(name, &[("source", &src.id)], h);
            }
        }
    }

    fn histogram(&mut self, name: &str, labels: &[(&str, &str)], h: &Histogram) {
        let bucket = format!("{name}_bucket");
        for (le, c) in h.bounds_s.iter().zip(&h.cumulative) {
            let le = number(*le);
            let mut l = labels.to_vec();
            l.push(("le", &le));
            self.sample(&bucket, &l, *c as f64);
        }
        let mut l = labels.to_vec();
        l.push(("le", "+Inf"));
        self.sample(&bucket, &l, h.count as f64);
        self.sample(&format!("{name}_sum"), labels, h.sum_s);
        self.sample(&format!("{name}_count"), labels, h.count as f64);
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

fn flag(b: bool) -> f64 {
    if b {
        1.0
    } else {
        0.0
    }
}

/// The whole exposition.
pub fn render(s: &Status) -> String {
    let mut e = Exposition {
        out: String::with_capacity(8192),
    };
    e.family("rigd_info", "gauge", "Build and rig identity (always 1).");
    e.sample(
        "rigd_info",
        &[("rig", &s.rig), ("version", &s.version)],
        1.0,
    );
    e.family(
        "rigd_uptime_seconds",
        "gauge",
        "Seconds since rigd started.",
    );
    e.sample("rigd_uptime_seconds", &[], s.uptime_s as f64);

    // Sources.
    e.per_source(
        s,
        "rigd_source_frames_total",
        "counter",
        "Frames captured.",
        |x| Some(x.frames as f64),
    );
    e.per_source(
        s,
        "rigd_source_bytes_total",
        "counter",
        "Payload bytes captured.",
        |x| Some(x.bytes as f64),
    );
    e.family(
        "rigd_source_drops_total",
        "counter",
        "Frames lost, by where: capture (device/driver), spool (full or cleared), uplink (refused by the broker).",
    );
    for src in &s.sources {
        for (stage, n) in [
            ("capture", src.device_drops),
            ("spool", src.spool_dropped),
            ("uplink", src.refused),
        ] {
            e.sample(
                "rigd_source_drops_total",
                &[("source", &src.id), ("stage", stage)],
                n as f64,
            );
        }
    }
    e.family(
        "rigd_source_up",
        "gauge",
        "1 while the source is running, 0 while it is retrying or failed.",
    );
    for src in &s.sources {
        e.sample(
            "rigd_source_up",
            &[("source", &src.id), ("kind", &src.kind)],
            flag(src.state == "running"),
        );
    }
    e.per_source(
        s,
        "rigd_source_last_frame_age_seconds",
        "gauge",
        "Seconds since the source's newest frame was captured.",
        |x| x.last_frame_age_ms.map(|ms| ms as f64 / 1e3),
    );

    e.per_source(
        s,
        "rigd_source_priority",
        "gauge",
        "The source's uplink priority (0 first).",
        |x| Some(x.priority as f64),
    );
    e.per_source(
        s,
        "rigd_source_capture_waits_total",
        "counter",
        "Frames whose hand-off to the rig's pipeline waited for room (the rig held capture).",
        |x| Some(x.capture_waits as f64),
    );
    e.per_source(
        s,
        "rigd_source_uplink_bytes_total",
        "counter",
        "Bytes the source's producers wrote to the broker (its share of the budget; framing included).",
        |x| Some(x.uplink_bytes as f64),
    );
    e.per_source(
        s,
        "rigd_source_waiting_for_bandwidth_total",
        "counter",
        "Frames spooled while the uplink was up because the budget was spent.",
        |x| Some(x.waiting_for_bandwidth as f64),
    );
    e.per_source(
        s,
        "rigd_uplink_starved_seconds",
        "gauge",
        "Seconds the source's queued frames have waited on the broker connection now (0: not waiting).",
        |x| Some(x.starved_ms as f64 / 1e3),
    );
    e.per_source(
        s,
        "rigd_source_backlog_eta_seconds",
        "gauge",
        "Seconds until the source's backlog is drained at the rate it drains now.",
        |x| x.backlog_eta_s,
    );

    // Uplink.
    e.family(
        "rigd_uplink_budget_bytes_per_second",
        "gauge",
        "pulsar.max-bandwidth in bytes per second (absent: unlimited).",
    );
    if let Some(b) = s.uplink.budget_bytes_per_second {
        e.sample("rigd_uplink_budget_bytes_per_second", &[], b as f64);
    }
    if let Some(x) = &s.uplink.estimate {
        e.family(
            "rigd_uplink_estimate_bytes_per_second",
            "gauge",
            "max-bandwidth = \"auto\": the link's estimated capacity.",
        );
        e.sample(
            "rigd_uplink_estimate_bytes_per_second",
            &[],
            x.bytes_per_second as f64,
        );
        e.family(
            "rigd_uplink_queueing_seconds",
            "gauge",
            "max-bandwidth = \"auto\": how long bytes wait in the link's queues now.",
        );
        e.sample("rigd_uplink_queueing_seconds", &[], x.queueing_ms / 1e3);
        e.family(
            "rigd_uplink_broker_delays_total",
            "counter",
            "max-bandwidth = \"auto\": receipts late while the path held no queue (the broker's delay: no cut).",
        );
        e.sample(
            "rigd_uplink_broker_delays_total",
            &[],
            x.broker_delays as f64,
        );
        if let Some(b) = x.base_rtt_ms {
            e.family(
                "rigd_uplink_base_rtt_seconds",
                "gauge",
                "max-bandwidth = \"auto\": the smallest write-to-receipt time of the last 10 s.",
            );
            e.sample("rigd_uplink_base_rtt_seconds", &[], b / 1e3);
        }
    }
    if !s.uplink.links.is_empty() {
        link_samples(&mut e, &s.uplink.links);
    }
    if !s.uplink.rank_shares.is_empty() {
        e.family(
            "rigd_uplink_rank_bytes_per_second",
            "gauge",
            "Bytes per second the budget granted each rank (0-9 live, 10 recall, 11-20 backlogs).",
        );
        for r in &s.uplink.rank_shares {
            let rank = r.rank.to_string();
            e.sample(
                "rigd_uplink_rank_bytes_per_second",
                &[("rank", rank.as_str())],
                r.bytes_per_second,
            );
        }
    }
    e.family(
        "rigd_uplink_configured",
        "gauge",
        "1 when a broker URL is configured.",
    );
    e.sample("rigd_uplink_configured", &[], flag(s.uplink.configured));
    e.family(
        "rigd_uplink_connected",
        "gauge",
        "1 when every source's producer is connected to the broker.",
    );
    e.sample("rigd_uplink_connected", &[], flag(s.uplink.connected));
    e.family(
        "rigd_uplink_paused",
        "gauge",
        "1 while a technician has paused publishing.",
    );
    e.sample("rigd_uplink_paused", &[], flag(s.uplink.paused));
    e.family(
        "rigd_uplink_in_flight",
        "gauge",
        "Messages sent and awaiting a broker receipt.",
    );
    e.sample("rigd_uplink_in_flight", &[], s.uplink.in_flight as f64);
    e.family(
        "rigd_uplink_reconnects_total",
        "counter",
        "Broker connections re-established.",
    );
    e.sample(
        "rigd_uplink_reconnects_total",
        &[],
        s.uplink.reconnects as f64,
    );
    e.per_source(
        s,
        "rigd_uplink_published_total",
        "counter",
        "Frames with a broker receipt.",
        |x| Some(x.published as f64),
    );
    e.per_source_histogram(
        s,
        "rigd_publish_latency_seconds",
        "Time from handing a frame to the producer to its broker receipt.",
        |x| x.latency.as_ref(),
    );
    e.per_source_histogram(
        s,
        "rigd_capture_to_receipt_seconds",
        "Time from a frame's capture to its broker receipt, for frames published live.",
        |x| x.capture_latency.as_ref(),
    );

    // Spool.
    e.per_source(
        s,
        "rigd_spool_pushed_total",
        "counter",
        "Records appended to the spool (depth = pushed - popped).",
        |x| Some(x.spool_pushed as f64),
    );
    e.per_source(
        s,
        "rigd_spool_popped_total",
        "counter",
        "Records removed from the spool (published, dropped, cleared or quarantined).",
        |x| Some(x.spool_popped as f64),
    );
    e.per_source(
        s,
        "rigd_spool_dropped_total",
        "counter",
        "Spooled records dropped (spool full, or cleared by a technician).",
        |x| Some(x.spool_dropped as f64),
    );
    e.family(
        "rigd_spool_bytes",
        "gauge",
        "Bytes the spool holds, all sources.",
    );
    e.sample("rigd_spool_bytes", &[], s.spool.bytes as f64);
    e.family(
        "rigd_spool_index_bytes",
        "gauge",
        "Of rigd_spool_bytes, the index.",
    );
    e.sample("rigd_spool_index_bytes", &[], s.spool.index_bytes as f64);
    e.family(
        "rigd_spool_index_damaged",
        "gauge",
        "1 when the index was rebuilt from the segments at start or found damaged since (status says why).",
    );
    e.sample(
        "rigd_spool_index_damaged",
        &[],
        if s.spool.index_damage.is_some() {
            1.0
        } else {
            0.0
        },
    );
    e.family(
        "rigd_spool_max_bytes",
        "gauge",
        "The spool's configured capacity.",
    );
    e.sample("rigd_spool_max_bytes", &[], s.spool.max_bytes as f64);
    e.family(
        "rigd_spool_quarantined_total",
        "counter",
        "Corrupt spool records set aside.",
    );
    e.sample(
        "rigd_spool_quarantined_total",
        &[],
        s.spool.quarantined as f64,
    );
    e.family(
        "rigd_spool_oldest_age_seconds",
        "gauge",
        "Age of the oldest spooled frame (absent when the spool is empty).",
    );
    if let Some(ms) = s.spool.oldest_age_ms {
        e.sample("rigd_spool_oldest_age_seconds", &[], ms as f64 / 1e3);
    }

    // Clock.
    e.family(
        "rigd_clock_state",
        "gauge",
        "1 for the rig clock's current state, 0 for the others.",
    );
    for st in ["unsynced", "locking", "locked", "holdover"] {
        e.sample(
            "rigd_clock_state",
            &[("state", st)],
            flag(s.clock.state == st),
        );
    }
    e.family(
        "rigd_clock_offset_seconds",
        "gauge",
        "Offset from the PTP master at the last sample (absent without PTP).",
    );
    if let Some(o) = s.clock.offset_ns {
        e.sample("rigd_clock_offset_seconds", &[], o as f64 / 1e9);
    }
    e.family(
        "rigd_clock_path_delay_seconds",
        "gauge",
        "Mean path delay to the PTP master (absent without PTP).",
    );
    if let Some(d) = s.clock.path_delay_ns {
        e.sample("rigd_clock_path_delay_seconds", &[], d as f64 / 1e9);
    }
    e.family(
        "rigd_clock_steps_total",
        "counter",
        "Clock steps since start.",
    );
    e.sample("rigd_clock_steps_total", &[], s.clock.steps as f64);

    e.per_source(
        s,
        "rigd_live_dropped_total",
        "counter",
        "Messages live-view clients (Foxglove, /foxglove) lost because they read slower than the rig captures.",
        |x| Some(x.live_dropped as f64),
    );
    e.per_source(
        s,
        "rigd_retention_evicted_total",
        "counter",
        "Frames of on-request sources their retention (retain-age, retain-bytes) evicted from the spool.",
        |x| Some(x.retention_evicted as f64),
    );
    e.family(
        "rigd_live_clients",
        "gauge",
        "Live-view clients connected now.",
    );
    e.sample("rigd_live_clients", &[], s.live.clients as f64);
    e.family(
        "rigd_events_marked_total",
        "counter",
        "Event markers made by technicians.",
    );
    e.sample("rigd_events_marked_total", &[], s.events.marked as f64);
    recall(&mut e, s.recall.as_ref());
    campaigns(&mut e, s.campaigns.as_ref());
    e.out
}

/// A family of one sample per item: name, type, help, the item's value.
type Family<T> = (&'static str, &'static str, &'static str, fn(&T) -> f64);

/// Campaigns' families (docs/CAMPAIGNS.md): samples while recall runs, one series per campaign.
/// `[[pulsar.link]]`: one sample per link in each family.
fn link_samples(e: &mut Exposition, links: &[crate::LinkStatus]) {
    type Value = fn(&crate::LinkStatus) -> Option<f64>;
    let families: [(&str, &str, &str, Value); 5] = [
        (
            "rigd_uplink_link_up",
            "gauge",
            "1 when the link's interface is up and it is not given up.",
            |l| Some(flag(l.up && !l.held)),
        ),
        (
            "rigd_uplink_link_given_up_total",
            "counter",
            "Times the link was given up (silent, or its interface down) and its producers moved.",
            |l| Some(l.given_up as f64),
        ),
        (
            "rigd_uplink_link_producers",
            "gauge",
            "Producers and consumers on the link now.",
            |l| Some(l.producers as f64),
        ),
        (
            "rigd_uplink_link_estimate_bytes_per_second",
            "gauge",
            "max-bandwidth = \"auto\": the link's estimated capacity.",
            |l| l.estimate.as_ref().map(|x| x.bytes_per_second as f64),
        ),
        (
            "rigd_uplink_link_queueing_seconds",
            "gauge",
            "max-bandwidth = \"auto\": how long bytes wait in the link's queues now.",
            |l| l.estimate.as_ref().map(|x| x.queueing_ms / 1e3),
        ),
    ];
    for (name, kind, help, value) in families {
        e.family(name, kind, help);
        for l in links {
            if let Some(v) = value(l) {
                e.sample(name, &[("link", &l.name)], v);
            }
        }
    }
    let name = "rigd_uplink_link_moved_in_total";
    e.family(
        name,
        "counter",
        "Producers moved onto the link from one still serving them: back to the cheaper link, or to spread links of one cost.",
    );
    for l in links {
        for (reason, n) in [
            ("cheaper", l.moved_in.cheaper),
            ("spread", l.moved_in.spread),
        ] {
            e.sample(name, &[("link", &l.name), ("reason", reason)], n as f64);
        }
    }
}

fn campaigns(e: &mut Exposition, c: Option<&crate::CampaignsStatus>) {
    e.single(
        "rigd_campaigns_active",
        "gauge",
        "Campaigns evaluated now.",
        c.map(|c| c.active as f64),
    );
    e.family(
        "rigd_campaign_rejected_total",
        "counter",
        "Campaign messages rejected, by reason.",
    );
    for (reason, n) in c.iter().flat_map(|c| &c.rejected_by_reason) {
        e.sample(
            "rigd_campaign_rejected_total",
            &[("reason", reason)],
            *n as f64,
        );
    }
    let list = c.map_or(&[][..], |c| &c.campaigns[..]);
    let families: [Family<crate::CampaignStatus>; 5] = [
        (
            "rigd_campaign_triggers_total",
            "counter",
            "Times a campaign's condition turned true.",
            |s| s.triggers as f64,
        ),
        (
            "rigd_campaign_windows_total",
            "counter",
            "Windows a campaign queued for upload.",
            |s| s.windows as f64,
        ),
        (
            "rigd_campaign_bytes_today",
            "gauge",
            "Payload bytes a campaign uploaded this UTC day.",
            |s| s.bytes_today as f64,
        ),
        (
            "rigd_campaign_quota_bytes",
            "gauge",
            "A campaign's byte quota per day.",
            |s| s.quota_bytes as f64,
        ),
        (
            "rigd_campaign_quota_reached",
            "gauge",
            "1 while a campaign's quota for the day is spent.",
            |s| flag(s.quota_reached),
        ),
    ];
    for (name, kind, help, value) in families {
        e.family(name, kind, help);
        for s in list {
            e.sample(name, &[("campaign", &s.id)], value(s));
        }
    }
}

/// Recall's families; their samples only while recall runs (a broker and an on-request source).
fn recall(e: &mut Exposition, r: Option<&RecallStatus>) {
    e.family(
        "rigd_recall_requests_total",
        "counter",
        "Recall requests received, by op (a technician's marker asking for an upload counts as an upload).",
    );
    if let Some(r) = r {
        for (op, n) in [
            ("upload", r.uploads),
            ("cancel", r.cancels),
            ("coverage", r.coverages),
        ] {
            e.sample("rigd_recall_requests_total", &[("op", op)], n as f64);
        }
    }
    e.family(
        "rigd_recall_rejected_total",
        "counter",
        "Recall requests rejected, by reason (one series per reason seen since start).",
    );
    for (reason, n) in r.iter().flat_map(|r| &r.rejected_by_reason) {
        e.sample(
            "rigd_recall_rejected_total",
            &[("reason", reason)],
            *n as f64,
        );
    }
    e.single(
        "rigd_recall_frames_total",
        "counter",
        "Frames recall uploaded with a broker receipt.",
        r.map(|r| r.frames_sent as f64),
    );
    e.single(
        "rigd_recall_bytes_total",
        "counter",
        "Bytes (as the spool holds them) of the frames recall uploaded with a broker receipt.",
        r.map(|r| r.bytes_sent as f64),
    );
    e.single(
        "rigd_recall_pending",
        "gauge",
        "Recall upload requests accepted and not finished.",
        r.map(|r| r.pending as f64),
    );
    e.single(
        "rigd_recall_connected",
        "gauge",
        "1 while the rig reads its recall control topic.",
        r.map(|r| flag(r.connected)),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(s: &Status) -> Vec<String> {
        render(s)
            .lines()
            .filter(|l| l.starts_with("rigd_recall_"))
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn recall_has_a_series_per_op_and_per_rejection_reason() {
        let mut s = Status {
            recall: Some(RecallStatus {
                connected: true,
                pending: 2,
                uploads: 5,
                cancels: 1,
                coverages: 3,
                rejected: 4,
                rejected_by_reason: [("bad-range".to_string(), 3), ("malformed".to_string(), 1)]
                    .into_iter()
                    .collect(),
                frames_sent: 900,
                bytes_sent: 123_456,
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            lines(&s),
            [
                r#"rigd_recall_requests_total{op="upload"} 5"#,
                r#"rigd_recall_requests_total{op="cancel"} 1"#,
                r#"rigd_recall_requests_total{op="coverage"} 3"#,
                r#"rigd_recall_rejected_total{reason="bad-range"} 3"#,
                r#"rigd_recall_rejected_total{reason="malformed"} 1"#,
                "rigd_recall_frames_total 900",
                "rigd_recall_bytes_total 123456",
                "rigd_recall_pending 2",
                "rigd_recall_connected 1",
            ]
        );
        let text = render(&s);
        for family in [
            "rigd_recall_requests_total counter",
            "rigd_recall_rejected_total counter",
            "rigd_recall_frames_total counter",
            "rigd_recall_bytes_total counter",
            "rigd_recall_pending gauge",
            "rigd_recall_connected gauge",
        ] {
            assert!(text.contains(&format!("# TYPE {family}\n")), "{family}");
        }
        // Not running: the families are described, with no samples.
        s.recall = None;
        assert_eq!(lines(&s), Vec::<String>::new());
        assert!(render(&s).contains("# TYPE rigd_recall_connected gauge\n"));
    }
}
