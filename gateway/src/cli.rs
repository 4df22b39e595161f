//! The `superinfer` command line: `serve` (the server), `tenants …` (the tenant store,
//! offline, while the server is stopped), `usage --node …` (a fleet's usage, from every
//! node's admin API) and `model tiny` (write the embedded model). Bad flags exit with status 2; a failure while
//! running exits with status 1.

pub mod fleet_usage;
mod model;
mod tenants;

use clap::{Parser, Subcommand};
use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::config::{ServeConfig, Settings};
use crate::server;

#[derive(Parser, Debug)]
#[command(
    name = "superinfer",
    version,
    about = "SuperInfer: multi-tenant, SLO-aware LLM serving"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Serve the OpenAI-compatible API (defaults: 127.0.0.1:8000, ./superinfer-data).
    Serve(Box<ServeArgs>),
    /// Manage tenants in the data directory while the server is stopped.
    Tenants(tenants::TenantsArgs),
    /// A fleet's usage: every node's ledger (`--node URL`, each once) summed exactly once.
    Usage(fleet_usage::FleetUsageArgs),
    /// Write models: `superinfer model tiny --out DIR` writes the embedded tiny model.
    Model(model::ModelArgs),
}

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// A TOML file of settings (same names as the flags, `_` for `-`); flags and
    /// SUPERINFER_* variables override it.
    #[arg(long, env = "SUPERINFER_CONFIG")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub settings: Settings,
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    run(std::env::args_os())
}

pub fn run<I: IntoIterator<Item = OsString>>(argv: I) -> ExitCode {
    let cli = match Cli::try_parse_from(argv) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(e.exit_code().clamp(0, 255) as u8);
        }
    };
    let result = match cli.command {
        Command::Serve(args) => serve(*args),
        Command::Tenants(args) => tenants::run(args),
        Command::Usage(args) => fleet_usage::run(args),
        Command::Model(args) => model::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    init_logging();
    let file = match &args.config {
        Some(p) => Settings::from_file(p)?,
        None => Settings::default(),
    };
    let cfg = ServeConfig::resolve(args.settings.or(file))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("superinfer-http")
        .build()?;
    rt.block_on(async move {
        // Listening for the stop signals starts before the server says it listens: a SIGTERM
        // sent right after that line drains gracefully instead of killing the process.
        let stop = shutdown_signal()?;
        let server = server::start(cfg).await?;
        if let Some(key) = &server.default_api_key {
            let mut out = std::io::stdout().lock();
            writeln!(out, "default tenant api key: {key}")?;
            writeln!(out, "(shown once; it is stored only as a hash)")?;
            out.flush()?;
        }
        println!("serving model {}", server.state.model.id);
        println!("listening on http://{}", server.addr);
        if let Some(m) = server.metrics_addr {
            println!("metrics on http://{m}/metrics");
        }
        let engine = server.state.engine.clone();
        let failed = std::sync::Arc::new(std::sync::Mutex::new(None));
        let watch = engine_failure(engine, failed.clone());
        server
            .run_until(async move {
                tokio::select! {
                    () = stop => {}
                    () = watch => {}
                }
            })
            .await?;
        // A failed engine is not restarted in this process (its device state cannot be
        // trusted): the process exits non-zero after the drain, for its supervisor
        // (systemd's Restart=on-failure, Kubernetes) to start it again.
        let message = failed.lock().ok().and_then(|f| f.clone());
        match message {
            Some(message) => {
                anyhow::bail!("the engine failed ({message}); exiting for a restart")
            }
            None => Ok(()),
        }
    })
}

/// Resolves once the engine has failed (a panic on its thread), leaving its message in
/// `failed`. `/health` and `/readyz` answer 503 from that moment; in-flight requests have
/// already ended with an error event.
async fn engine_failure(
    engine: superinfer_engine::EngineHandle,
    failed: std::sync::Arc<std::sync::Mutex<Option<String>>>,
) {
    loop {
        if let superinfer_engine::EngineHealth::Failed { message } = engine.health() {
            tracing::error!(error = %message, "the engine failed; draining and exiting for a restart");
            if let Ok(mut f) = failed.lock() {
                *f = Some(message);
            }
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
}

/// SIGTERM or Ctrl-C (SIGINT), listened for from this call on.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        Ok(async move {
            tokio::select! {
                _ = term.recv() => {},
                _ = int.recv() => {},
            }
        })
    }
    #[cfg(not(unix))]
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
    })
}
