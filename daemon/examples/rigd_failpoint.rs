//! `rigd` with a crash armed, for the end-to-end test of a crash between the chunks of a frame
//! (tests/e2e/test_uplink.py). Built by `cargo build --all-targets` beside the tests, never
//! packaged: the `rigd` binary has no way to arm it.
//!
//! `RIGD_FAILPOINT=abort-after-chunk=N target/release/examples/rigd_failpoint run --config FILE`
//! aborts right after chunk `N` of the first chunked frame is sent.

fn main() -> std::process::ExitCode {
    if let Some(n) = std::env::var("RIGD_FAILPOINT")
        .ok()
        .and_then(|v| v.strip_prefix("abort-after-chunk=")?.parse().ok())
    {
        rigd::uplink::crash_between_chunks(n);
    }
    rigd::cli::main()
}
