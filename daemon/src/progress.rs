//! Progress bars on a terminal (nothing when stderr is not one) and Ctrl-C as a request to stop
//! at the next record, so outputs are closed properly instead of being cut mid-write.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A byte-counting progress bar on stderr, hidden when stderr is not a terminal.
#[derive(Debug)]
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    pub fn new(total_bytes: u64, what: &str) -> Self {
        if !std::io::stderr().is_terminal() {
            return Progress {
                bar: ProgressBar::hidden(),
            };
        }
        let bar = ProgressBar::with_draw_target(Some(total_bytes), ProgressDrawTarget::stderr());
        let style = ProgressStyle::with_template(
            "{prefix:>8} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
        bar.set_style(style);
        bar.set_prefix(what.to_string());
        bar.enable_steady_tick(Duration::from_millis(200));
        Progress { bar }
    }

    pub fn inc(&self, bytes: u64) {
        self.bar.inc(bytes);
    }

    pub fn set_message(&self, msg: impl Into<String>) {
        self.bar.set_message(msg.into());
    }

    /// Prints a line above the bar (or to stderr when there is no bar).
    pub fn println(&self, line: &str) {
        if self.bar.is_hidden() {
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "{line}");
        } else {
            self.bar.println(line);
        }
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// Set by SIGINT (Ctrl-C) or SIGTERM; long operations check it between records.
#[derive(Debug, Clone, Default)]
pub struct Interrupt(Arc<AtomicBool>);

impl Interrupt {
    /// Installs the signal handlers (a small thread waits for the signals).
    pub fn install() -> Self {
        let flag = Interrupt::default();
        let rt = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch for Ctrl-C; it will stop the process at once");
                return flag;
            }
        };
        use tokio::signal::unix::{signal, SignalKind};
        let signals = rt.block_on(async {
            Ok::<_, std::io::Error>((
                signal(SignalKind::interrupt())?,
                signal(SignalKind::terminate())?,
            ))
        });
        let (mut int, mut term) = match signals {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch for Ctrl-C; it will stop the process at once");
                return flag;
            }
        };
        let set = flag.clone();
        std::thread::spawn(move || {
            rt.block_on(async {
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                }
            });
            set.0.store(true, Ordering::Release);
        });
        flag
    }

    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    /// Resolves once the flag is set (polls; for async loops).
    pub async fn wait(&self) {
        while !self.is_set() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
