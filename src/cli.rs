//! The command line: `serve` (the default), `rules check DIR`, `keys sweep`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::config::Config;
use crate::{app, rules, sweep};

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
}

#[derive(Debug, Subcommand)]
pub enum RulesCommand {
    /// Validate a rules folder: prints each error as FILE:LINE: message; exit 1 on any.
    Check { dir: PathBuf },
}

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Remove every key under a prefix with SCAN + UNLINK in batches (never KEYS).
    Sweep {
        #[arg(long)]
        redis: String,
        #[arg(long)]
        prefix: String,
        /// Count what would be removed; remove nothing.
        #[arg(long)]
        dry_run: bool,
        /// Keys per SCAN and per UNLINK.
        #[arg(long, default_value_t = sweep::DEFAULT_BATCH)]
        batch: usize,
    },
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
                },
        } => keys_sweep(&redis, prefix, dry_run, batch),
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .json()
        .try_init();
}

fn serve(config_path: &std::path::Path) -> ExitCode {
    init_logging();
    let config = match Config::load(config_path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("vigia: config: {e}");
            return ExitCode::from(2);
        }
    };
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

fn keys_sweep(url: &str, prefix: String, dry_run: bool, batch: usize) -> ExitCode {
    let opts = sweep::SweepOptions {
        prefix,
        dry_run,
        batch,
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
    let verb = if dry_run { "would remove" } else { "removed" };
    let result = runtime.block_on(sweep::sweep(url, &opts, |p| {
        eprintln!(
            "batch {}: matched {}, {verb} {}",
            p.batches,
            p.matched,
            if dry_run { p.matched } else { p.removed }
        );
    }));
    match result {
        Ok(r) => {
            println!(
                "{} keys under {}: matched {}, {verb} {}",
                if dry_run { "dry run:" } else { "done:" },
                opts.prefix,
                r.matched,
                if dry_run { r.matched } else { r.removed }
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vigia: keys sweep: {e}");
            ExitCode::from(2)
        }
    }
}
