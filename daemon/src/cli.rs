//! The command line: `rigd run` and `rigd check`.

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

use crate::config::{Config, ConfigError, EMBEDDED_DEFAULT};

#[derive(Debug, Parser)]
#[command(
    name = "rigd",
    version,
    about = "Edge ingestion daemon for sensor rigs: PTP time, capture, spool, Pulsar uplink"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the daemon (without --config: the embedded default, synthetic sources, no broker).
    Run {
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
    /// Validate a config without starting: exit 0 when valid, 2 with one line per problem.
    Check {
        #[arg(long, short)]
        config: PathBuf,
    },
}

fn load(path: Option<&PathBuf>) -> Result<Config, ConfigError> {
    match path {
        Some(p) => Config::load(p),
        None => Config::parse(EMBEDDED_DEFAULT, "<embedded default>"),
    }
}

fn report(e: &ConfigError) -> ExitCode {
    eprintln!("{e}");
    ExitCode::from(2)
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match cli.command {
        Command::Check { config } => match Config::load(&config) {
            Ok(_) => {
                println!("{}: ok", config.display());
                ExitCode::SUCCESS
            }
            Err(e) => report(&e),
        },
        Command::Run { config } => {
            let config = match load(config.as_ref()) {
                Ok(c) => c,
                Err(e) => return report(&e),
            };
            init_logging();
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("rigd: cannot start the async runtime: {e}");
                    return ExitCode::from(1);
                }
            };
            match rt.block_on(crate::app::run(config)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e:#}");
                    eprintln!("rigd: {e:#}");
                    ExitCode::from(1)
                }
            }
        }
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("RIGD_LOG")
        .unwrap_or_else(|_| "info,statime=warn".into());
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
}
