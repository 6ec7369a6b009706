//! rigd: the daemon's library. `main` only calls [`cli::main`].
//!
//! Map, from the bottom up (a module imports only modules named before it here):
//! [`civil`] (RFC 3339 times in and out), [`backoff`] (retry pacing), [`service`] (Pulsar service URLs),
//! [`wire`] (bucket key, topic and producer names, Pulsar properties), [`payload`] (compress and cut a frame's payload), [`seal`]
//! (sealing frames for the fleet key), [`config`] (TOML schema and
//! validation), [`clock`] (the PTP-disciplined frame clock), [`spool`] (store-and-forward),
//! [`uplink`] (Pulsar producer with chunking and dedup-safe sequence ids), [`metrics`],
//! [`lifecycle`] (signals, heartbeats), [`pipeline`] (per-source lanes between capture, spool and
//! uplink), [`recall`] (on-request sources' retention), [`fleet`] (coverage digests and their query), [`events`] (technician event markers), [`runtime`] (the running daemon as status and
//! control see it), [`notify`] (systemd readiness, status and watchdog; the stall rule),
//! [`status`], [`control`] (what the web UI shows and what a technician may do), [`app`] (wiring
//! and shutdown order), [`preflight`] (what the host must offer a config), [`replay`] (the offline tools:
//! inspect, export and republish a spool), [`tail`] (a rig's buckets, live from Pulsar), [`cli`].

#![forbid(unsafe_code)]

pub mod app;
pub mod backoff;
pub mod campaign;
pub mod can;
pub mod civil;
pub mod cli;
pub mod clock;
pub mod config;
pub mod control;
pub mod events;
pub mod fleet;
pub mod foxglove;
pub mod lifecycle;
pub mod live;
pub mod metrics;
pub mod nmea;
pub mod notify;
pub mod payload;
pub mod pipeline;
pub mod preflight;
pub mod progress;
pub mod recall;
pub mod relay;
pub mod replay;
pub mod runtime;
pub mod seal;
pub mod service;
pub mod spool;
pub mod status;
pub mod tail;
pub mod uplink;
pub mod wire;
