//! The command line: `serve` (the default), `rules check DIR`, `keys sweep`, `simulate`,
//! `scenario`.

use std::io::Write;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::config::{Config, LogFormat};
use crate::{app, rules, simulate, sweep};

/// vigia: rate limiting and risk scoring for marketing APIs.
#[derive(Debug, Parser)]
#[command(name = "vigia", version, about)]
pub struct Cli {
    /// The config file (when no subcommand is given, `serve` runs with it).
    #[arg(long, global = true, default_value = "config.toml")]
    pub config: PathBuf,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the HTTP API (the default).
    Serve,
    /// Rule-file tools.
    Rules {
        #[command(subcommand)]
        command: RulesCommand,
    },
    /// Store-key maintenance.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Replay a traffic file against a rule set, offline, and report what it decides.
    Simulate(SimulateArgs),
    /// Write traffic for `simulate` from a scenario file (populations arriving over time).
    Scenario(ScenarioArgs),
}

/// `vigia scenario`.
#[derive(Debug, clap::Args)]
pub struct ScenarioArgs {
    /// The scenario (TOML): honest users, shared NATs, attacker cohorts.
    pub file: PathBuf,
    /// Write the traffic here instead of to standard output.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Use this seed instead of the file's.
    #[arg(long)]
    pub seed: Option<u64>,
}

/// `vigia simulate`.
#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    /// The rules folder to test.
    #[arg(long, default_value = "rules")]
    pub rules: PathBuf,
    /// Traffic: one JSON line per check or event, in time order (`vigia scenario` or
    /// `[record]` writes it).
    pub traffic: PathBuf,
    /// Grant this many units first come, first served to allowed checks, and report who
    /// got them.
    #[arg(long)]
    pub stock: Option<u64>,
    /// Write each check's decision here, one JSON line per check.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// How to print the report.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

/// Report formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum RulesCommand {
    /// Validate a rules folder: prints each error as FILE:LINE: message; exit 1 on any.
    Check { dir: PathBuf },
}

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Remove every key PREFIX:* with SCAN + UNLINK in batches (never KEYS).
    ///
    /// Without --redis or --prefix, the missing one is read from the config (--config,
    /// default config.toml): [store] redis_url and key_prefix, with the VIGIA_* environment
    /// applied as for serve; the flags win. On a Redis Cluster every master is scanned.
    /// On a terminal it shows a progress bar on stderr; otherwise it prints only the
    /// summary line on stdout at the end.
    Sweep {
        /// The Redis to sweep: one node's URL, or a Redis Cluster's seed node URLs
        /// separated by commas (a cluster is recognised by asking the node; every master is
        /// swept). Default: [store] redis_url in the config (or VIGIA_REDIS_URL).
        #[arg(long, value_name = "URL")]
        redis: Option<String>,
        /// Keys PREFIX:* are removed (`lt`, `lt:coupon_claim`). Default: [store] key_prefix
        /// in the config.
        #[arg(long)]
        prefix: Option<String>,
        /// Count what would be removed; remove nothing.
        #[arg(long)]
        dry_run: bool,
        /// Keys per SCAN and per UNLINK.
        #[arg(long, default_value_t = sweep::DEFAULT_BATCH)]
        batch: usize,
        /// Remove at most N keys per second (a dry run counts at most N per second), to
        /// spare a production Redis the unlinking, memory freeing and replication of the
        /// deletes. The batch is lowered to N if larger. Default: unthrottled.
        #[arg(long, value_name = "N", value_parser = parse_rate)]
        rate: Option<NonZeroU32>,
    },
}

/// `--rate`: a whole number of keys per second, at least 1.
fn parse_rate(s: &str) -> Result<NonZeroU32, String> {
    match s.parse::<u32>() {
        Ok(n) => NonZeroU32::new(n).ok_or_else(|| "must be at least 1 key per second".into()),
        Err(e) => Err(format!("not a whole number of keys per second ({e})")),
    }
}

/// Runs the command line; the binary's whole `main`.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => serve(&cli.config),
        Command::Rules {
            command: RulesCommand::Check { dir },
        } => rules_check(&dir),
        Command::Keys {
            command:
                KeysCommand::Sweep {
                    redis,
                    prefix,
                    dry_run,
                    batch,
                    rate,
                },
        } => keys_sweep(&cli.config, redis, prefix, dry_run, batch, rate),
        Command::Simulate(args) => simulate_cmd(&args),
        Command::Scenario(args) => scenario_cmd(&args),
    }
}

/// The service's log: `RUST_LOG` filters (default `info`), `log_format` shapes each line.
fn init_logging(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        // Colours only for a person at a terminal, never escape codes in a file.
        LogFormat::Text => builder
            .with_ansi(std::io::stdout().is_terminal())
            .try_init(),
    };
}

fn serve(config_path: &std::path::Path) -> ExitCode {
    // The config decides the log's format, so it is read first; its errors go to stderr.
    let config = match Config::load(config_path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("vigia: config: {e}");
            return ExitCode::from(2);
        }
    };
    init_logging(config.log_format);
    let result = actix_web::rt::System::new().block_on(app::serve(&config));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vigia: {e}");
            ExitCode::from(2)
        }
    }
}

fn rules_check(dir: &std::path::Path) -> ExitCode {
    match rules::load_dir(dir) {
        Ok(set) => {
            println!(
                "{}: ok, {} scenes, version {}",
                dir.display(),
                set.scenes.len(),
                set.version
            );
            ExitCode::SUCCESS
        }
        Err(errors) => {
            let mut out = std::io::stdout().lock();
            for e in &errors.0 {
                let _ = writeln!(out, "{e}");
            }
            ExitCode::from(1)
        }
    }
}

fn keys_sweep(
    config: &std::path::Path,
    redis: Option<String>,
    prefix: Option<String>,
    dry_run: bool,
    batch: usize,
    rate: Option<NonZeroU32>,
) -> ExitCode {
    let sweep::Target { url, prefix } = match sweep::target(redis, prefix, config) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("vigia: keys sweep: {e}");
            return ExitCode::from(2);
        }
    };
    let opts = sweep::SweepOptions {
        prefix,
        dry_run,
        batch,
        rate,
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("vigia: {e}");
            return ExitCode::from(2);
        }
    };
    let progress = SweepBar::new(dry_run);
    let result = runtime.block_on(sweep::sweep(&url, &opts, |p| progress.update(p)));
    progress.finish();
    match result {
        Ok(report) => {
            println!("{}", report.summary(&opts.prefix));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vigia: keys sweep: {e}");
            ExitCode::from(2)
        }
    }
}

/// The sweep's progress: a spinner with running counts on stderr when it is a terminal;
/// nothing otherwise (a log or CI gets only the summary line).
struct SweepBar {
    bar: Option<indicatif::ProgressBar>,
    dry_run: bool,
    started: std::time::Instant,
}

impl SweepBar {
    fn new(dry_run: bool) -> Self {
        use std::io::IsTerminal;
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new_spinner();
            bar.set_style(
                indicatif::ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
            );
            bar.set_message("connecting");
            // Ticks on its own: a throttled sweep may wait between updates.
            bar.enable_steady_tick(std::time::Duration::from_millis(100));
            bar
        });
        SweepBar {
            bar,
            dry_run,
            started: std::time::Instant::now(),
        }
    }

    fn update(&self, p: &sweep::SweepProgress) {
        if let Some(bar) = &self.bar {
            bar.set_message(p.message(self.dry_run, self.started.elapsed()));
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// Progress on stderr: a bar on a terminal, otherwise a line every few seconds (a log
/// file gets a record of a long replay without a line per redraw).
struct ProgressOut {
    bar: Option<indicatif::ProgressBar>,
    started: std::time::Instant,
    last_line: std::time::Instant,
}

impl ProgressOut {
    fn new(total_bytes: u64) -> Self {
        use std::io::IsTerminal;
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new(total_bytes);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} [{bar:40}] {percent:>3}% {msg} ({eta} left)",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            bar
        });
        let now = std::time::Instant::now();
        ProgressOut {
            bar,
            started: now,
            last_line: now,
        }
    }

    fn update(&mut self, p: simulate::Progress) {
        let rate = p.checks as f64 / self.started.elapsed().as_secs_f64().max(1e-3);
        match &self.bar {
            Some(bar) => {
                bar.set_length(p.total_bytes);
                bar.set_position(p.bytes);
                bar.set_message(format!("{} checks, {rate:.0}/s", p.checks));
            }
            None if self.last_line.elapsed() >= std::time::Duration::from_secs(5) => {
                self.last_line = std::time::Instant::now();
                eprintln!(
                    "simulate: {:.0}% of the file, {} checks, {rate:.0} checks/s",
                    p.bytes as f64 * 100.0 / p.total_bytes.max(1) as f64,
                    p.checks
                );
            }
            None => {}
        }
    }

    fn finish(&self, checks: u64) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        let secs = self.started.elapsed().as_secs_f64();
        eprintln!(
            "simulate: {checks} checks replayed in {secs:.1} s ({:.0} checks/s)",
            checks as f64 / secs.max(1e-3)
        );
    }
}

fn simulate_cmd(args: &SimulateArgs) -> ExitCode {
    init_logging_quiet();
    let opts = simulate::Options {
        rules_dir: args.rules.clone(),
        traffic: args.traffic.clone(),
        stock: args.stock,
        out: args.out.clone(),
    };
    let mut progress = ProgressOut::new(0);
    let result = actix_web::rt::System::new()
        .block_on(async { simulate::run(&opts, &mut |p| progress.update(p)).await });
    match result {
        Ok(report) => {
            progress.finish(report.checks);
            let text = match args.format {
                Format::Text => report.to_text(),
                Format::Json => serde_json::to_string_pretty(&report).unwrap_or_default() + "\n",
            };
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vigia simulate: {e}");
            ExitCode::from(2)
        }
    }
}

/// Tools print their own output; only warnings and errors from the library get through.
fn init_logging_quiet() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

fn scenario_cmd(args: &ScenarioArgs) -> ExitCode {
    use simulate::scenario::{self, Scenario};
    let scenario = match Scenario::load(&args.file) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("vigia scenario: {e}");
            return ExitCode::from(2);
        }
    };
    let seed = args.seed.unwrap_or(scenario.seed);
    let written = match &args.out {
        Some(path) => std::fs::File::create(path)
            .map(std::io::BufWriter::new)
            .and_then(|mut out| {
                let summary = scenario::write(&scenario, seed, &mut out)?;
                out.flush()?;
                Ok(summary)
            })
            .map_err(|e| format!("{}: {e}", path.display())),
        None => {
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            scenario::write(&scenario, seed, &mut out)
                .and_then(|summary| out.flush().map(|()| summary))
                .map_err(|e| format!("standard output: {e}"))
        }
    };
    match written {
        Ok(summary) => {
            let labels: Vec<String> = summary
                .by_label
                .iter()
                .map(|(label, n)| format!("{label} {n}"))
                .collect();
            eprintln!(
                "vigia scenario: seed {seed}: {} checks ({}) and {} events",
                summary.checks,
                labels.join(", "),
                summary.events
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vigia scenario: {e}");
            ExitCode::from(2)
        }
    }
}
