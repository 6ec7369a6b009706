//! The command line: `rigd run`, `rigd check`, and the offline tools `rigd spool`, `rigd replay`,
//! `rigd tail` (thin: each calls into its library module).

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

use crate::config::{Config, ConfigError, EMBEDDED_DEFAULT};

/// `rigd --version`: the release and the commit it was built from (daemon/build.rs).
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("RIGD_GIT_REV"), ")");

#[derive(Debug, Parser)]
#[command(
    name = "rigd",
    version = VERSION,
    about = "Edge ingestion daemon for sensor rigs: PTP time, capture, spool, Pulsar uplink"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the daemon (without --config: the embedded default, synthetic sources, no broker).
    /// Exits 2 when the config is wrong, 75 when the host is not ready for it (retried by systemd).
    Run {
        /// The config file (TOML; see the README's "Configuration").
        #[arg(long, short, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Validate a config without starting: exit 0 when valid (warnings on stderr), 2 with one
    /// line per problem.
    Check {
        /// The config file to check (it may be the running rig's).
        #[arg(long, short, value_name = "FILE")]
        config: PathBuf,
        /// Print the config with every default filled in (TOML, on stdout) instead of "ok".
        #[arg(long)]
        print_effective: bool,
    },
    /// Inspect a spool directory (of a stopped daemon, or a copy): `stat` or `verify`.
    Spool {
        #[command(subcommand)]
        command: SpoolCommand,
    },
    /// Export a spool to files, to one MCAP file, or republish it to Pulsar.
    Replay(ReplayArgs),
    /// Follow a rig live on Pulsar: one line per time bucket with the sources that arrived in it.
    Tail(TailArgs),
    /// Serve a rig's live view (Foxglove WebSocket, /foxglove) from its Pulsar topics.
    Live(LiveArgs),
    /// Ask a rig to upload a time range of its on-request sources (or say what it holds), and
    /// follow the request: exit 0 done, 1 partial, rejected or no answer.
    Recall(RecallArgs),
    /// Push, list or stop a rig's campaigns: conditions under which it uploads windows of its
    /// on-request sources by itself (docs/CAMPAIGNS.md). Exit 0 accepted, 1 rejected or no answer.
    Campaign {
        #[command(subcommand)]
        command: CampaignCommand,
    },
    /// The fleet's coverage index (docs/FLEET.md): which rigs hold which ranges of which sources
    /// at a place and time, and recall them.
    Fleet {
        #[command(subcommand)]
        command: FleetCommand,
    },
    /// CAN tools: `decode` a candump log (`candump -l`, `rigd replay --out`) with a DBC.
    Can {
        #[command(subcommand)]
        command: CanCommand,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) on stdout.
    Completions {
        /// The shell to complete for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff, for `man -l -`) on stdout, or write every page (rigd.1 and
    /// one per subcommand it names, rigd-run.1 ...) to a directory.
    Man {
        /// Write rigd.1 and a page per subcommand here (created if missing) instead; the
        /// Debian package ships them (docs/SYSTEMD.md).
        #[arg(long, value_name = "DIR")]
        out_dir: Option<PathBuf>,
    },
}

/// How an offline tool reaches a Pulsar cluster (`rigd tail`, `rigd recall`, `rigd replay
/// --pulsar`, `rigd live`): `#[command(flatten)]` it into the subcommand's args and call
/// [`PulsarClientArgs::access`] with the URL.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct PulsarClientArgs {
    /// File holding the Pulsar token (`pulsar.token-file`).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// CA certificates (PEM) for a pulsar+ssl:// URL (`pulsar.tls-ca-file`; default: the
    /// Mozilla roots).
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) for a broker that requires mutual TLS (`pulsar.tls-cert-file`);
    /// with --tls-key-file and a pulsar+ssl:// URL.
    #[arg(long, value_name = "FILE", requires = "tls_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM; `pulsar.tls-key-file`).
    #[arg(long, value_name = "FILE", requires = "tls_cert_file")]
    pub tls_key_file: Option<PathBuf>,
}

impl PulsarClientArgs {
    /// The token read and the TLS files checked against `url`: a usage error (message said,
    /// exit 2) for a token file that does not read, or TLS files with a clear `pulsar://` URL
    /// (the operator would believe the link encrypted, or authenticated by certificate).
    pub fn access(&self, url: &str) -> Result<crate::tail::Access, ExitCode> {
        if !url.starts_with("pulsar+ssl://") {
            let set = [
                ("--tls-cert-file", self.tls_cert_file.is_some()),
                ("--tls-key-file", self.tls_key_file.is_some()),
                ("--tls-ca", self.tls_ca.is_some()),
            ];
            if let Some((flag, _)) = set.iter().find(|(_, on)| *on) {
                say(format_args!(
                    "rigd: {flag} goes with a pulsar+ssl:// URL; {url} is a clear link, neither encrypted nor authenticated by certificate"
                ));
                return Err(ExitCode::from(2));
            }
        }
        Ok(crate::tail::Access {
            token: read_token(self.token_file.as_ref())?,
            tls_ca: self.tls_ca.clone(),
            tls_client: self.tls_cert_file.clone().zip(self.tls_key_file.clone()),
        })
    }
}

#[derive(Debug, clap::Args)]
struct TailArgs {
    /// The Pulsar cluster (pulsar://host:port).
    #[arg(long, value_name = "URL")]
    pulsar: String,
    /// The rig to follow (`rig.id`).
    #[arg(long, value_name = "ID", value_parser = rig_id)]
    rig: String,
    /// Topic template (`pulsar.topic`), placeholders {rig}, {source} and {modality}.
    #[arg(long, value_name = "TEMPLATE", default_value = crate::wire::DEFAULT_TOPIC)]
    topic: String,
    /// Follow only this source, and expect it in every bucket (repeatable; default: discover the
    /// rig's topics and expect every source seen).
    #[arg(long = "source", value_name = "S")]
    sources: Vec<String>,
    /// One JSON object per bucket line.
    #[arg(long)]
    json: bool,
    /// Start with the oldest messages the topics hold instead of new ones.
    #[arg(long)]
    from_earliest: bool,
    /// Stop after this many bucket lines.
    #[arg(long, value_name = "N")]
    max_buckets: Option<u64>,
    /// Report a bucket once frames this many buckets newer have arrived (late frames are counted).
    #[arg(long, value_name = "BUCKETS", default_value_t = 30)]
    lag: i64,
    #[command(flatten)]
    client: PulsarClientArgs,
}

#[derive(Debug, clap::Args)]
struct LiveArgs {
    /// The Pulsar cluster (pulsar://host:port).
    #[arg(long, value_name = "URL")]
    pulsar: String,
    /// The rig to serve (`rig.id`).
    #[arg(long, value_name = "ID", value_parser = rig_id)]
    rig: String,
    /// Where to serve the live view: ws://ADDR/foxglove.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8765")]
    bind: std::net::SocketAddr,
    /// Topic template (`pulsar.topic`), placeholders {rig}, {source} and {modality}.
    #[arg(long, value_name = "TEMPLATE", default_value = crate::wire::DEFAULT_TOPIC)]
    topic: String,
    /// Serve only this source (repeatable; default: every topic of the rig, as they appear).
    #[arg(long = "source", value_name = "S")]
    sources: Vec<String>,
    /// Clients served at once; the next one is refused (503).
    #[arg(long, value_name = "N", default_value_t = 4)]
    max_clients: usize,
    /// Advertise every camera's full resolution to every client, beside its proxy (without it,
    /// only to a client that connects with ?full=1; docs/LIVE.md "Proxies first").
    #[arg(long)]
    full: bool,
    #[command(flatten)]
    client: PulsarClientArgs,
    /// The fleet's RSA private key (PEM): frames of a rig with end-to-end encryption are
    /// decrypted with it. Without it they are skipped and counted. With it, a --bind that is not
    /// loopback needs --web-tls-cert-file: decrypted frames never cross a network in clear.
    #[arg(long, value_name = "FILE")]
    decrypt_key: Option<PathBuf>,
    /// Networks whose clients are answered (repeatable; `10.0.0.0/8`, a bare address; default:
    /// loopback only), as `[web] allow-from`.
    #[arg(long = "allow-from", value_name = "NET")]
    allow_from: Vec<String>,
    /// Another site's origin whose pages may use the live view (repeatable;
    /// `https://app.foxglove.dev`), as `[web] allowed-origins`: a browser page of any other
    /// origin is refused.
    #[arg(long = "allowed-origin", value_name = "ORIGIN")]
    allowed_origins: Vec<String>,
    /// A DNS name clients use for this host (repeatable), as `[web] server-names`: a request for
    /// any other name (DNS rebinding) is refused.
    #[arg(long = "server-name", value_name = "NAME")]
    server_names: Vec<String>,
    /// Serve wss:// with this certificate chain (PEM), as `[web] tls-cert-file`.
    #[arg(long, value_name = "FILE", requires = "web_tls_key_file")]
    web_tls_cert_file: Option<PathBuf>,
    /// The certificate's private key (PEM), as `[web] tls-key-file`.
    #[arg(long, value_name = "FILE", requires = "web_tls_cert_file")]
    web_tls_key_file: Option<PathBuf>,
}

impl LiveArgs {
    /// Who the live view answers, and over what: the peers (--allow-from, loopback by default),
    /// the names and pages ([`rigd_web::site`]), TLS. A usage error (said, exit 2) for a network,
    /// name or origin that does not parse, TLS files that do not load, or decrypted frames served
    /// in clear beyond loopback.
    fn gate_and_tls(
        &self,
    ) -> Result<
        (
            rigd_web::access::Gate,
            Option<std::sync::Arc<rustls::ServerConfig>>,
        ),
        ExitCode,
    > {
        let usage = |why: String| {
            say(format_args!("rigd live: {why}"));
            ExitCode::from(2)
        };
        let allow = if self.allow_from.is_empty() {
            rigd_web::access::AllowList::loopback()
        } else {
            let nets = self
                .allow_from
                .iter()
                .map(|n| n.parse().map_err(|e| usage(format!("--allow-from {e}"))))
                .collect::<Result<Vec<_>, _>>()?;
            rigd_web::access::AllowList::new(nets)
        };
        let mut names = rigd_web::site::this_host_names();
        names.extend(self.server_names.iter().cloned());
        let site = rigd_web::site::SitePolicy::new(&names, &self.allowed_origins)
            .map_err(|e| usage(format!("--server-name / --allowed-origin: {e}")))?;
        let tls = match (&self.web_tls_cert_file, &self.web_tls_key_file) {
            (Some(cert), Some(key)) => Some(
                rigd_web::tls_server_config(cert, key)
                    .map_err(|e| usage(format!("--web-tls-cert-file / --web-tls-key-file: {e}")))?,
            ),
            _ => None,
        };
        if self.decrypt_key.is_some() && tls.is_none() && !self.bind.ip().is_loopback() {
            return Err(usage(format!(
                "--bind {} with --decrypt-key would serve decrypted frames in clear on the network: \
                 give --web-tls-cert-file and --web-tls-key-file, or bind to loopback",
                self.bind
            )));
        }
        Ok((
            rigd_web::access::Gate {
                allow: Some(allow),
                site: Some(site),
            },
            tls,
        ))
    }
}

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["from", "coverage", "cancel"])))]
struct RecallArgs {
    /// The Pulsar cluster (pulsar://host:port).
    #[arg(long, value_name = "URL")]
    pulsar: String,
    /// The rig to ask (`rig.id`).
    #[arg(long, value_name = "ID", value_parser = rig_id)]
    rig: String,
    /// Upload this source (repeatable; default: every on-request source of the rig).
    #[arg(long = "source", value_name = "S")]
    sources: Vec<String>,
    /// Frames captured at or after T (RFC 3339, or unix nanoseconds)...
    #[arg(long, value_name = "T", value_parser = crate::civil::parse, requires = "to")]
    from: Option<i64>,
    /// ...and before T.
    #[arg(long, value_name = "T", value_parser = crate::civil::parse, requires = "from")]
    to: Option<i64>,
    /// Send again frames an earlier request already sent.
    #[arg(long)]
    force: bool,
    /// Ask what the rig holds, per source, instead.
    #[arg(long)]
    coverage: bool,
    /// Cancel the request with this id instead.
    #[arg(long, value_name = "ID")]
    cancel: Option<String>,
    /// The request's id (default: a new UUID).
    #[arg(long, value_name = "ID")]
    id: Option<String>,
    /// Follow the upload to its end (default: until the rig accepts it).
    #[arg(long)]
    wait: bool,
    /// One JSON object per answer on stdout.
    #[arg(long)]
    json: bool,
    /// The rig's control topic (`pulsar.control-topic`, with {rig}).
    #[arg(
        long,
        value_name = "TOPIC",
        default_value = "persistent://public/default/{rig}-control"
    )]
    control_topic: String,
    /// Give up after this many seconds without the awaited answer.
    #[arg(long, value_name = "S", default_value_t = 600)]
    timeout: u64,
    #[command(flatten)]
    client: PulsarClientArgs,
}

#[derive(Debug, clap::Subcommand)]
enum CampaignCommand {
    /// Push the campaign in FILE (JSON; docs/CAMPAIGNS.md); pushed again, it replaces it.
    Push {
        file: PathBuf,
        #[command(flatten)]
        link: CampaignLink,
    },
    /// One line per campaign: its state, triggers, windows and the day's bytes.
    List {
        #[command(flatten)]
        link: CampaignLink,
    },
    /// Stop campaign ID: no more triggers (windows already queued are still uploaded unless
    /// --cancel-windows).
    Stop {
        id: String,
        /// Cancel its windows not yet uploaded too (the one uploading stops at its next frame).
        #[arg(long)]
        cancel_windows: bool,
        #[command(flatten)]
        link: CampaignLink,
    },
    /// Every campaign's state in full (JSON), or campaign ID's.
    Status {
        id: Option<String>,
        #[command(flatten)]
        link: CampaignLink,
    },
}

/// How `rigd campaign` reaches the rig: as `rigd recall`.
#[derive(Debug, clap::Args)]
struct CampaignLink {
    /// The Pulsar cluster (pulsar://host:port).
    #[arg(long, value_name = "URL")]
    pulsar: String,
    /// The rig (`rig.id`).
    #[arg(long, value_name = "ID", value_parser = rig_id)]
    rig: String,
    /// The rig's control topic (`pulsar.control-topic`, with {rig}).
    #[arg(
        long,
        value_name = "TOPIC",
        default_value = "persistent://public/default/{rig}-control"
    )]
    control_topic: String,
    /// Give up after this many seconds without an answer.
    #[arg(long, value_name = "S", default_value_t = 30)]
    timeout: u64,
    /// The answer as JSON on stdout.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    client: PulsarClientArgs,
}

fn campaign(command: CampaignCommand) -> ExitCode {
    use crate::campaign::client::{self, Ask};
    use crate::recall::protocol::State;
    let (ask, link) = match command {
        CampaignCommand::Push { file, link } => (Ask::Push(file), link),
        CampaignCommand::List { link } => (Ask::List, link),
        CampaignCommand::Stop {
            id,
            cancel_windows,
            link,
        } => (Ask::Stop(id, cancel_windows), link),
        CampaignCommand::Status { id, link } => (Ask::Status(id), link),
    };
    let access = match link.client.access(&link.pulsar) {
        Ok(a) => a,
        Err(code) => return code,
    };
    init_pulsar_tool_logging();
    let interrupt = crate::progress::Interrupt::install();
    let control_topic = link.control_topic.replace("{rig}", &link.rig);
    let to = crate::recall::client::Link {
        url: &link.pulsar,
        control_topic: &control_topic,
        access: &access,
        timeout: std::time::Duration::from_secs(link.timeout),
    };
    match client::run(&to, &ask, &interrupt) {
        Ok(a) => {
            println!("{}", client::describe(&a, &ask, link.json));
            if a.state == State::Rejected {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(client::CampaignError::Usage(why)) => {
            say(format_args!("rigd: {why}"));
            ExitCode::from(2)
        }
        Err(e) => {
            say(format_args!("rigd: {e}"));
            ExitCode::from(1)
        }
    }
}

fn rig_id(s: &str) -> Result<String, String> {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        Ok(s.to_string())
    } else {
        Err(format!("{s:?}: a rig id is [a-z0-9-]+"))
    }
}

/// `--decrypt-key FILE` (`rigd replay`, `rigd live`): the fleet's private key, loaded once; a key
/// that does not load is a usage error (exit 2).
fn decryptor(path: Option<&std::path::Path>) -> Result<Option<crate::seal::Decryptor>, ExitCode> {
    match path.map(crate::seal::Decryptor::load) {
        None => Ok(None),
        Some(Ok(k)) => Ok(Some(k)),
        Some(Err(e)) => {
            say(format_args!("rigd: --decrypt-key {e}"));
            Err(ExitCode::from(2))
        }
    }
}

fn read_token(path: Option<&PathBuf>) -> Result<Option<String>, ExitCode> {
    match path {
        None => Ok(None),
        Some(f) => match crate::config::read_token(f) {
            Ok(t) => Ok(Some(t)),
            Err(e) => {
                say(format_args!("rigd: --token-file {e}"));
                Err(ExitCode::from(2))
            }
        },
    }
}

#[derive(Debug, Subcommand)]
enum CanCommand {
    /// Decode a candump log with a DBC: one JSON object per frame the DBC knows (`line`, `ts_ns`,
    /// `iface`, `id`, `extended`, `message`, `signals`, `labels`) on stdout; counts on stderr.
    Decode {
        /// The DBC file (the rig's `dbc`).
        #[arg(long, value_name = "FILE")]
        dbc: PathBuf,
        /// The log (default: standard input).
        #[arg(long, value_name = "FILE")]
        input: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
enum SpoolCommand {
    /// Per source: records, bytes, first and last capture time; quarantined records.
    Stat(SpoolArgs),
    /// Read every record back and check it: exit 1 when any is corrupt or the index is damaged,
    /// 77 when a file of the spool cannot be read by this user (a permission problem, not damage).
    Verify(SpoolArgs),
}

#[derive(Debug, clap::Args)]
struct SpoolArgs {
    /// The spool directory (`spool.path`); refused while a running rigd holds it.
    #[arg(long, value_name = "DIR")]
    spool: PathBuf,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// List records by reading every segment instead of the index (finds records already
    /// published and removed, too; for a spool whose index is lost).
    #[arg(long)]
    scan: bool,
}

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("output").required(true).args(["out", "mcap", "pulsar"])))]
struct ReplayArgs {
    /// The spool directory; refused while a running rigd holds it.
    #[arg(long, value_name = "DIR")]
    spool: PathBuf,
    /// Only this source (repeatable; default: all).
    #[arg(long = "source", value_name = "S")]
    sources: Vec<String>,
    /// Only frames captured at or after T (RFC 3339, or unix nanoseconds).
    #[arg(long, value_name = "T", value_parser = crate::civil::parse)]
    from: Option<i64>,
    /// Only frames captured before T (RFC 3339, or unix nanoseconds).
    #[arg(long, value_name = "T", value_parser = crate::civil::parse)]
    to: Option<i64>,
    /// Export to files under DIR: JPEG per camera frame, WAV per audio source, NDJSON per serial source.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Export to one MCAP file (a channel per source, Foxglove schemas, indexed for seeking).
    #[arg(long, value_name = "FILE")]
    mcap: Option<PathBuf>,
    /// With --mcap: message encoding (protobuf: Foxglove's protobuf schemas; json: Foxglove's
    /// JSON schemas, bytes as base64). Default: protobuf.
    #[arg(long, value_enum)]
    encoding: Option<crate::replay::mcap::Encoding>,
    /// With --mcap: chunk compression. Default: zstd.
    #[arg(long, value_enum)]
    compression: Option<crate::replay::mcap::Compression>,
    /// With --mcap: decode CAN sources with this DBC (`FILE` for every CAN source, `SOURCE=FILE`
    /// for one; repeatable): a channel per DBC message, `/{source}/{Message}`.
    #[arg(long, value_name = "[SOURCE=]FILE")]
    dbc: Vec<String>,
    /// With --mcap: overwrite FILE when it exists; with --out: write into DIR when it is not
    /// empty (files of the same name are replaced, the others stay). Without it either exits 2.
    #[arg(long)]
    force: bool,
    /// Republish to this Pulsar cluster (pulsar://host:port) with the rig's own topics, keys,
    /// properties, producer names and sequence ids: a broker with deduplication drops what it holds.
    #[arg(long, value_name = "URL")]
    pulsar: Option<String>,
    /// The rig id the spool was captured under (`rig.id`; topic and producer names). Default: the
    /// one the spool recorded.
    #[arg(long, value_name = "ID", value_parser = rig_id)]
    rig: Option<String>,
    /// Topic template (`pulsar.topic`), placeholders {rig}, {source} and {modality}. Default: the one the
    /// spool recorded, else the default template
    /// (`wire::DEFAULT_TOPIC`).
    #[arg(long, value_name = "TEMPLATE")]
    topic: Option<String>,
    /// With --pulsar: the token and TLS files.
    #[command(flatten)]
    client: PulsarClientArgs,
    /// The fleet's RSA private key (PEM): exports of an encrypted spool need it. Without it stat,
    /// verify and --pulsar still work (the sealed frames are republished as they are).
    #[arg(long, value_name = "FILE")]
    decrypt_key: Option<PathBuf>,
    /// With --pulsar, on a partitioned topic: how a key picks its partition (`pulsar.hashing-scheme`).
    #[arg(long, value_name = "SCHEME", value_parser = ["murmur3-32", "java-string"], default_value = "murmur3-32")]
    hashing_scheme: String,
    /// With --pulsar: give up after this many seconds without progress (no connection, no receipt).
    #[arg(long, value_name = "S", default_value_t = 60)]
    timeout: u64,
    /// Time-bucket width of the rig (`rig.bucket-ms`), for the bucket numbers in the output.
    /// Default: the one the spool recorded, else 33.
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u32).range(1..))]
    bucket_ms: Option<u32>,
    /// List records by reading every segment instead of the index.
    #[arg(long)]
    scan: bool,
    /// Print the summary as one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

/// The config, checked as `rigd check` does: its own problems, then the host's
/// ([`crate::preflight`]).
fn load(path: Option<&PathBuf>) -> Result<Config, ConfigError> {
    let host = crate::preflight::problems;
    match path {
        Some(p) => Config::load_with(p, host),
        None => Config::parse_with(EMBEDDED_DEFAULT, "<embedded default>", host),
    }
}

fn report(e: &ConfigError) -> ExitCode {
    say(format_args!("{e}"));
    ExitCode::from(2)
}

/// One line on stderr, ignoring a closed stderr (eprintln! panics on EPIPE).
fn say(line: std::fmt::Arguments) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// What became of a command's output on stdout. A reader that went away (`rigd spool verify
/// --json | head`) is no failure: the command ends quietly, with the exit code of its result.
fn output(written: std::io::Result<()>) -> Result<(), ExitCode> {
    match written {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => {
            say(format_args!("rigd: writing the output: {e}"));
            Err(ExitCode::from(1))
        }
    }
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
        Command::Check {
            config: path,
            print_effective,
        } => match Config::examine_file(
            &path,
            crate::preflight::check_problems,
            crate::preflight::warnings,
        ) {
            // Every problem and every warning in one run, problems first (issue 47).
            Ok(found) => {
                use std::io::Write;
                for line in found.problems.iter().chain(&found.warnings) {
                    say(format_args!("{line}"));
                }
                let Some(config) = found.config.filter(|_| found.problems.is_empty()) else {
                    return ExitCode::from(2);
                };
                let ok = if print_effective {
                    match config.effective() {
                        Ok(toml) => write!(std::io::stdout(), "{toml}"),
                        Err(e) => {
                            say(format_args!("rigd: cannot print the config: {e}"));
                            return ExitCode::from(1);
                        }
                    }
                } else {
                    writeln!(std::io::stdout(), "{}: ok", path.display())
                };
                output(ok).err().unwrap_or(ExitCode::SUCCESS)
            }
            Err(e) => report(&e),
        },
        Command::Spool { command } => spool(command),
        Command::Replay(args) => replay(args),
        Command::Tail(args) => tail(args),
        Command::Live(args) => live(args),
        Command::Recall(args) => recall(args),
        Command::Campaign { command } => campaign(command),
        Command::Fleet { command } => fleet(command),
        Command::Can { command } => can(command),
        Command::Completions { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(
                shell,
                &mut <Cli as clap::CommandFactory>::command(),
                "rigd",
                &mut out,
            );
            output(std::io::Write::write_all(&mut std::io::stdout(), &out))
                .err()
                .unwrap_or(ExitCode::SUCCESS)
        }
        Command::Man { out_dir } => {
            // Without `help` as a subcommand: every page the main one names exists.
            let cli = <Cli as clap::CommandFactory>::command().disable_help_subcommand(true);
            if let Some(dir) = out_dir {
                return man_pages(cli, &dir);
            }
            let mut out = Vec::new();
            let man = clap_mangen::Man::new(cli);
            if let Err(e) = man.render(&mut out) {
                say(format_args!("rigd: cannot render the manual page: {e}"));
                return ExitCode::from(1);
            }
            output(std::io::Write::write_all(&mut std::io::stdout(), &out))
                .err()
                .unwrap_or(ExitCode::SUCCESS)
        }
        Command::Run { config } => {
            let config = match load(config.as_ref()) {
                Ok(c) => c,
                Err(e) => {
                    say(format_args!("{e}"));
                    return ExitCode::from(e.exit_status());
                }
            };
            init_logging();
            crate::preflight::log_warnings(&config);
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(config.rig.worker_threads)
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    say(format_args!("rigd: cannot start the async runtime: {e}"));
                    return ExitCode::from(1);
                }
            };
            let run = async {
                crate::lifecycle::catch_hangup();
                crate::app::run(config).await
            };
            match rt.block_on(run) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e:#}");
                    say(format_args!("rigd: {e:#}"));
                    ExitCode::from(1)
                }
            }
        }
    }
}

/// `rigd man --out-dir DIR`: rigd.1 and a page per subcommand, recursively (rigd-spool-stat.1);
/// the paths written on stdout.
fn man_pages(cli: clap::Command, dir: &std::path::Path) -> ExitCode {
    use std::io::Write;
    let written = std::fs::create_dir_all(dir).and_then(|()| clap_mangen::generate_to(cli, dir));
    if let Err(e) = written {
        say(format_args!(
            "rigd: cannot write the manual pages to {}: {e}",
            dir.display()
        ));
        return ExitCode::from(1);
    }
    let mut pages: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    pages.retain(|p| p.extension().is_some_and(|x| x == "1"));
    pages.sort();
    let mut out = std::io::stdout().lock();
    let listed = pages
        .iter()
        .try_for_each(|p| writeln!(out, "{}", p.display()));
    output(listed).err().unwrap_or(ExitCode::SUCCESS)
}

/// Exit code and message for an offline tool's error.
fn fail(e: &crate::replay::ReplayError) -> ExitCode {
    say(format_args!("rigd: {e}"));
    if let crate::replay::ReplayError::Spool(crate::spool::SpoolError::Locked { path }) = e {
        let copy = std::env::temp_dir().join("rigd-spool-copy");
        say(format_args!(
            "rigd: to inspect it while rigd runs, copy it first: cp -a {} {} && rigd spool stat --spool {}",
            path.display(),
            copy.display(),
            copy.display()
        ));
    }
    ExitCode::from(e.exit_status())
}

/// One JSON object on stdout.
fn print_json(v: &impl serde::Serialize) -> Result<(), ExitCode> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let s = serde_json::to_string(v).map_err(|e| {
        say(format_args!("rigd: cannot encode JSON: {e}"));
        ExitCode::from(1)
    })?;
    output(writeln!(out, "{s}").and_then(|()| out.flush()))
}

fn spool(command: SpoolCommand) -> ExitCode {
    use crate::progress::Interrupt;
    use crate::replay::inspect;
    let (args, verify) = match command {
        SpoolCommand::Stat(a) => (a, false),
        SpoolCommand::Verify(a) => (a, true),
    };
    init_quiet_logging();
    let interrupt = Interrupt::install();
    let snap = match inspect::open(&args.spool, args.scan) {
        Ok(s) => s,
        Err(e) => return fail(&e),
    };
    let mut out = std::io::stdout().lock();
    if !verify {
        let s = inspect::stat(&snap);
        let printed = if args.json {
            print_json(&s)
        } else {
            output(inspect::print_stat(&mut out, &s))
        };
        return printed.err().unwrap_or(ExitCode::SUCCESS);
    }
    let v = match inspect::verify(&snap, &interrupt) {
        Ok(v) => v,
        Err(e) => return fail(&e),
    };
    let printed = if args.json {
        print_json(&v)
    } else {
        output(inspect::print_verify(&mut out, &v))
    };
    if let Err(code) = printed {
        return code;
    }
    if v.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn can(command: CanCommand) -> ExitCode {
    let CanCommand::Decode { dbc, input } = command;
    let dbc = match crate::can::Dbc::load(&dbc) {
        Ok(d) => d,
        Err(e) => {
            say(format_args!("rigd: {e}"));
            return ExitCode::from(2);
        }
    };
    let input: Box<dyn std::io::BufRead> = match &input {
        None => Box::new(std::io::stdin().lock()),
        Some(path) => match std::fs::File::open(path) {
            Ok(f) => Box::new(std::io::BufReader::new(f)),
            Err(e) => {
                say(format_args!("rigd: {}: {e}", path.display()));
                return ExitCode::from(2);
            }
        },
    };
    let out = std::io::BufWriter::new(std::io::stdout().lock());
    match crate::can::decode_log(&dbc, input, out, std::io::stderr()) {
        Ok(c) => {
            say(format_args!(
                "{} frames: {} decoded, {} with an id the DBC does not know, {} lines not frames",
                c.frames, c.decoded, c.unknown, c.bad_lines
            ));
            ExitCode::SUCCESS
        }
        Err(e) => output(Err(e)).err().unwrap_or(ExitCode::SUCCESS),
    }
}

fn replay(args: ReplayArgs) -> ExitCode {
    use crate::progress::Interrupt;
    use crate::replay::{files, inspect, mcap, republish, Selection};
    init_pulsar_tool_logging();
    if args.mcap.is_none() && (args.encoding.is_some() || args.compression.is_some()) {
        say(format_args!(
            "rigd: --encoding and --compression go with --mcap FILE"
        ));
        return ExitCode::from(2);
    }
    if args.mcap.is_none() && !args.dbc.is_empty() {
        say(format_args!("rigd: --dbc goes with --mcap FILE"));
        return ExitCode::from(2);
    }
    let mut dbc = Vec::new();
    for spec in &args.dbc {
        let (source, file) = match spec.split_once('=') {
            Some((s, f)) if !s.contains('/') => (Some(s.to_string()), f),
            _ => (None, spec.as_str()),
        };
        match crate::can::Dbc::load(std::path::Path::new(file)) {
            Ok(d) => dbc.push((source, std::sync::Arc::new(d))),
            Err(e) => {
                say(format_args!("rigd: --dbc {e}"));
                return ExitCode::from(2);
            }
        }
    }
    if args.force && args.pulsar.is_some() {
        say(format_args!(
            "rigd: --force goes with --out DIR or --mcap FILE (an output that exists)"
        ));
        return ExitCode::from(2);
    }
    let interrupt = Interrupt::install();
    let snap = match inspect::open(&args.spool, args.scan) {
        Ok(s) => s,
        Err(e) => return fail(&e),
    };
    let selection = Selection {
        sources: args.sources,
        from_ns: args.from,
        to_ns: args.to,
    };
    let plan = match selection.plan(&snap) {
        Ok(p) => p,
        Err(e) => return fail(&e),
    };
    for p in plan.iter().filter(|p| p.extended_from.is_some()) {
        let at = p
            .extended_from
            .map(crate::civil::format)
            .unwrap_or_default();
        eprintln!(
            "{}: --from falls inside a group of pictures; starting at its keyframe, captured {at}",
            p.source
        );
    }
    let rig = crate::replay::rig_identity(
        &snap,
        args.rig.clone(),
        args.topic.clone(),
        args.bucket_ms,
        args.pulsar.is_some(),
    );
    let rig = match rig {
        Ok(r) => r,
        Err(e) => return fail(&e),
    };
    let key = match decryptor(args.decrypt_key.as_deref()) {
        Ok(k) => k,
        Err(code) => return code,
    };
    let result = if let Some(dir) = &args.out {
        files::export(
            &snap,
            &plan,
            dir,
            args.force,
            rig.bucket_ms,
            key.as_ref(),
            &interrupt,
        )
    } else if let Some(file) = &args.mcap {
        let opts = mcap::Options {
            encoding: args.encoding.unwrap_or_default(),
            compression: args.compression.unwrap_or_default(),
            force: args.force,
            rig: rig.rig.clone(),
            bucket_ms: rig.bucket_ms,
            dbc,
        };
        mcap::export(&snap, &plan, file, &opts, key.as_ref(), &interrupt)
    } else if let Some(url) = &args.pulsar {
        let access = match args.client.access(url) {
            Ok(a) => a,
            Err(code) => return code,
        };
        let target = republish::Target {
            url: url.clone(),
            rig: rig.rig.clone(),
            topic: rig.topic.clone(),
            bucket_ms: rig.bucket_ms,
            access,
            stall_timeout: std::time::Duration::from_secs(args.timeout.max(1)),
            hashing: if args.hashing_scheme == "java-string" {
                crate::config::HashingScheme::JavaString
            } else {
                crate::config::HashingScheme::Murmur3_32
            },
        };
        republish::run(&snap, &plan, &target, &interrupt)
    } else {
        unreachable!("clap requires one output")
    };
    match result {
        Ok(summary) => {
            summary.print();
            if args.json {
                if let Err(code) = print_json(&summary) {
                    return code;
                }
            }
            if summary.interrupted {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => fail(&e),
    }
}

fn tail(args: TailArgs) -> ExitCode {
    use crate::tail::{self, TailConfig};
    let access = match args.client.access(&args.pulsar) {
        Ok(a) => a,
        Err(code) => return code,
    };
    init_pulsar_tool_logging();
    let interrupt = crate::progress::Interrupt::install();
    let cfg = TailConfig {
        url: args.pulsar,
        rig: args.rig,
        topic: args.topic,
        sources: args.sources,
        access,
        json: args.json,
        from_earliest: args.from_earliest,
        max_buckets: args.max_buckets,
        lag: args.lag,
    };
    match tail::run(&cfg, &interrupt) {
        Ok(s) => {
            say(format_args!(
                "rigd tail: {} buckets ({} complete), {} frames, {} late",
                s.buckets, s.complete, s.frames, s.late
            ));
            ExitCode::SUCCESS
        }
        // The reader of the bucket lines went away (`rigd tail ... | head`): done.
        Err(tail::TailError::Output(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            ExitCode::SUCCESS
        }
        Err(e) => {
            say(format_args!("rigd: {e}"));
            ExitCode::from(if e.is_usage() { 2 } else { 1 })
        }
    }
}

#[derive(Debug, Subcommand)]
enum FleetCommand {
    /// Which rigs hold which ranges there and then (from the compacted coverage topic): a
    /// table, or JSON. Exit 0 (also when no rig holds it), 1 when the topic cannot be read.
    Coverage(FleetArgs),
    /// The same query sent as recall requests to those rigs, each followed to its end: exit 0
    /// when every one is done, 1 otherwise.
    Recall {
        #[command(flatten)]
        args: FleetArgs,
        #[command(flatten)]
        recall: crate::fleet::cli::RecallOpts,
    },
    /// Digests of synthetic rigs made with the rig's own code, one JSON payload per line (tests
    /// and benchmarks; the summary on stderr).
    SynthDigests(crate::fleet::synth::SynthArgs),
}

#[derive(Debug, clap::Args)]
struct FleetArgs {
    /// The Pulsar cluster (pulsar://host:port).
    #[arg(long, value_name = "URL")]
    pulsar: String,
    #[command(flatten)]
    query: crate::fleet::cli::QueryArgs,
    #[command(flatten)]
    client: PulsarClientArgs,
}

fn fleet(command: FleetCommand) -> ExitCode {
    use crate::fleet::{cli, synth};
    let (args, recall) = match command {
        FleetCommand::SynthDigests(a) => {
            return match synth::write(&a, &mut std::io::stdout().lock()) {
                Ok(summary) => {
                    say(format_args!("rigd fleet synth-digests: {summary}"));
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    say(format_args!("rigd: {e}"));
                    ExitCode::from(1)
                }
            };
        }
        FleetCommand::Coverage(args) => (args, None),
        FleetCommand::Recall { args, recall } => (args, Some(recall)),
    };
    let (access, q) = match (args.client.access(&args.pulsar), args.query.query()) {
        (Ok(a), Ok(q)) => (a, q),
        (Err(code), _) => return code,
        (_, Err(why)) => {
            say(format_args!("rigd: {why}"));
            return ExitCode::from(2);
        }
    };
    init_pulsar_tool_logging();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            say(format_args!("rigd: cannot start the async runtime: {e}"));
            return ExitCode::from(1);
        }
    };
    let answer = match rt.block_on(cli::coverage(&args.pulsar, &access, &args.query, &q)) {
        Ok(a) => a,
        Err(why) => {
            say(format_args!("rigd: {}: {why}", args.pulsar));
            return ExitCode::from(1);
        }
    };
    drop(rt);
    if args.query.json {
        println!("{}", serde_json::to_string(&answer).expect("serializes"));
    } else {
        println!("{}", cli::table(&answer));
    }
    match recall {
        None => ExitCode::SUCCESS,
        Some(opts) => {
            let interrupt = crate::progress::Interrupt::install();
            let all_done = cli::recall(
                &args.pulsar,
                &access,
                &answer.rigs,
                &opts,
                args.query.json,
                &interrupt,
            );
            ExitCode::from(u8::from(!all_done))
        }
    }
}

fn recall(args: RecallArgs) -> ExitCode {
    use crate::recall::client::{self, Ask, RecallConfig};
    use crate::recall::protocol::State;
    let access = match args.client.access(&args.pulsar) {
        Ok(a) => a,
        Err(code) => return code,
    };
    let ask = match (args.from.zip(args.to), args.coverage, args.cancel) {
        (Some((from, to)), false, None) => {
            if from >= to {
                say(format_args!("rigd: --from must be before --to"));
                return ExitCode::from(2);
            }
            Ask::Upload {
                sources: args.sources,
                from,
                to,
                force: args.force,
            }
        }
        (None, true, None) => Ask::Coverage,
        (None, false, Some(id)) => Ask::Cancel { id },
        _ => {
            say(format_args!(
                "rigd: give one of --from/--to, --coverage or --cancel"
            ));
            return ExitCode::from(2);
        }
    };
    if let Some(Err(why)) = args.id.as_deref().map(crate::recall::protocol::valid_id) {
        say(format_args!("rigd: --id: {why}"));
        return ExitCode::from(2);
    }
    init_pulsar_tool_logging();
    let interrupt = crate::progress::Interrupt::install();
    let cfg = RecallConfig {
        url: args.pulsar,
        control_topic: args.control_topic.replace("{rig}", &args.rig),
        access,
        ask,
        id: args.id,
        wait: args.wait,
        json: args.json,
        timeout: std::time::Duration::from_secs(args.timeout),
    };
    match client::run(&cfg, &interrupt) {
        Ok(a) => {
            if !cfg.json {
                say(format_args!("rigd recall: {}", client::describe(&a)));
            }
            match a.state {
                State::Done | State::Coverage | State::Accepted | State::Progress => {
                    ExitCode::SUCCESS
                }
                State::Cancelled if matches!(cfg.ask, Ask::Cancel { .. }) => ExitCode::SUCCESS,
                _ => ExitCode::from(1),
            }
        }
        Err(e) => {
            say(format_args!("rigd: {e}"));
            ExitCode::from(1)
        }
    }
}

fn live(args: LiveArgs) -> ExitCode {
    use crate::relay::{self, RelayConfig};
    let (gate, web_tls) = match args.gate_and_tls() {
        Ok(g) => g,
        Err(code) => return code,
    };
    let scheme = if web_tls.is_some() { "wss" } else { "ws" };
    let access = match args.client.access(&args.pulsar) {
        Ok(a) => a,
        Err(code) => return code,
    };
    let decryptor = match decryptor(args.decrypt_key.as_deref()) {
        Ok(k) => k.map(std::sync::Arc::new),
        Err(code) => return code,
    };
    init_quiet_logging();
    let interrupt = crate::progress::Interrupt::install();
    let cfg = RelayConfig {
        url: args.pulsar,
        rig: args.rig,
        topic: args.topic,
        sources: args.sources,
        access,
        bind: args.bind,
        max_clients: args.max_clients,
        full: args.full,
        decryptor,
        gate,
        web_tls,
    };
    say(format_args!(
        "rigd live: {} from {} on {scheme}://{}/foxglove",
        cfg.rig, cfg.url, cfg.bind
    ));
    match relay::run(&cfg, &interrupt) {
        Ok(s) => {
            let mut line = format!("rigd live: {} frames from {} sources", s.frames, s.sources);
            if s.reassembled > 0 || s.incomplete > 0 {
                line += &format!(
                    ", {} reassembled from chunks, {} chunked frames dropped incomplete",
                    s.reassembled, s.incomplete
                );
            }
            if s.encrypted > 0 {
                line += &format!(
                    ", {} encrypted messages skipped (no --decrypt-key)",
                    s.encrypted
                );
            }
            if s.undecryptable > 0 {
                line += &format!(
                    ", {} encrypted messages --decrypt-key did not open",
                    s.undecryptable
                );
            }
            say(format_args!("{line}"));
            ExitCode::SUCCESS
        }
        Err(e) => {
            say(format_args!("rigd: {e}"));
            ExitCode::from(if e.is_usage() { 2 } else { 1 })
        }
    }
}

/// Logging for the offline tools: warnings only unless `RIGD_LOG` says otherwise.
fn init_quiet_logging() {
    init_tool_logging("warn");
}

/// Logging for a tool that talks to Pulsar (`tail`, `recall`, `replay`): its own warnings, not
/// the `pulsar` crate's retry lines nor the daemon's uplink telling that frames go to the spool
/// (true of a rig, not of a tool): the tool's last line says what became of the connection.
/// `RIGD_LOG` shows them again.
fn init_pulsar_tool_logging() {
    init_tool_logging("warn,pulsar=off,rigd::uplink=error");
}

fn init_tool_logging(default: &str) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("RIGD_LOG").unwrap_or_else(|_| default.into());
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .log_internal_errors(false)
        .try_init();
}

/// The daemon's log, on stderr (the journal under systemd). A stderr that goes away (a closed
/// pipe: EPIPE) loses the log lines, never the daemon: tracing's fmt layer reports a failed write
/// with eprintln!, which panics on EPIPE in whichever thread logged (capture threads, tokio
/// workers), so that report is off.
///
/// Logs on stderr (the journal under systemd): `RIGD_LOG` filters (`info,rigd::uplink=debug`
/// raises one module), `RIGD_LOG_FORMAT=json` writes one JSON object per line (journald,
/// Loki, Vector) instead of text.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("RIGD_LOG")
        .unwrap_or_else(|_| "info,statime=warn".into());
    use std::io::IsTerminal;
    let format = std::env::var("RIGD_LOG_FORMAT").unwrap_or_default();
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .log_internal_errors(false);
    match format.as_str() {
        "json" => logs
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .init(),
        other => {
            logs.with_ansi(std::io::stderr().is_terminal()).init();
            if !other.is_empty() && other != "text" {
                tracing::warn!(
                    RIGD_LOG_FORMAT = other,
                    "unknown log format (text or json); text it is"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn client_of(args: &[&str]) -> PulsarClientArgs {
        match Cli::try_parse_from(args).expect("parses").command {
            Command::Tail(a) => a.client,
            Command::Recall(a) => a.client,
            Command::Replay(a) => a.client,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn tail_recall_and_replay_take_the_same_client_certificate_flags() {
        let tls = [
            "--tls-ca",
            "ca.pem",
            "--tls-cert-file",
            "rig.pem",
            "--tls-key-file",
            "rig.key.pem",
        ];
        let url = "pulsar+ssl://broker:6651";
        for head in [
            &["rigd", "tail", "--pulsar", url, "--rig", "van-07"][..],
            &[
                "rigd",
                "recall",
                "--pulsar",
                url,
                "--rig",
                "van-07",
                "--coverage",
            ],
            &["rigd", "replay", "--spool", "s", "--pulsar", url],
        ] {
            let args: Vec<&str> = head.iter().chain(tls.iter()).copied().collect();
            let access = client_of(&args).access(url).expect("usable");
            assert_eq!(access.tls_ca, Some(PathBuf::from("ca.pem")));
            assert_eq!(
                access.tls_client,
                Some((PathBuf::from("rig.pem"), PathBuf::from("rig.key.pem")))
            );
            // A certificate with a clear link is a usage error, before any connection.
            assert!(client_of(&args).access("pulsar://broker:6650").is_err());
            // One of the pair alone: clap refuses it.
            let half: Vec<&str> = head
                .iter()
                .chain(["--tls-cert-file", "rig.pem"].iter())
                .copied()
                .collect();
            assert!(Cli::try_parse_from(&half).is_err(), "{half:?}");
        }
        let plain = client_of(&["rigd", "tail", "--pulsar", "pulsar://b", "--rig", "r"]);
        let access = plain.access("pulsar://b").expect("no TLS flags");
        assert!(access.tls_client.is_none() && access.token.is_none());
    }
}
