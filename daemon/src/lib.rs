//! rigd: the daemon's library. `main` only calls [`cli::main`].
//!
//! Map: [`config`] (TOML schema and validation), [`clock`] (the PTP-disciplined frame clock), [`wire`] (bucket key and Pulsar properties),
//! [`uplink`] (Pulsar producer with chunking and dedup-safe sequence ids), [`spool`] (sled
//! store-and-forward), [`pipeline`] (per-source lanes between capture, spool and uplink), [`app`]
//! (wiring and shutdown order), [`status`], [`metrics`] and [`control`] (what the web UI shows
//! and what a technician may do), [`lifecycle`] (signals),
//! [`notify`] (systemd readiness, status and watchdog),
//! [`replay`] (the offline tools: inspect, export and republish a spool), [`tail`] (a rig's
//! buckets, live from Pulsar).

#![forbid(unsafe_code)]

pub mod app;
pub mod cli;
pub mod clock;
pub mod config;
pub mod control;
pub mod lifecycle;
pub mod metrics;
pub mod notify;
pub mod pipeline;
pub mod replay;
pub mod spool;
pub mod status;
pub mod tail;
pub mod uplink;
pub mod wire;
