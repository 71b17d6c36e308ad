//! The `acp-gateway` binary: parse the configuration, set up logging, serve until Ctrl-C/SIGTERM
//! (or run an operator command: `migrate`, `check-agent`).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

use acp_gateway::telemetry::traces::{Traces, WithTraceIds};

use acp_gateway::config::{Command, Config, LogFormat};

/// mimalloc instead of the system allocator: every event passes through a few short-lived
/// buffers on several threads, where glibc's malloc spent a tenth of the gateway's CPU
/// (`bench/README.md`). Built without its request for transparent huge pages (`no_thp`): a
/// 2 MiB page held for a few open streams' bytes tripled what 1,000 watchers cost.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let config = match Config::load() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("acp-gateway: {}", shown(&e));
            return std::process::ExitCode::FAILURE;
        }
    };
    let traces = match Traces::start(config.otlp_endpoint.as_deref()) {
        Ok(traces) => traces,
        Err(e) => {
            eprintln!("acp-gateway: OpenTelemetry: {}", shown(&e));
            return std::process::ExitCode::FAILURE;
        }
    };
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx::postgres::notice=warn"));
    // One filter for both layers: the spans and events it lets through are exported (when
    // traces are on) and logged alike.
    let otel = traces.as_ref().map(|t| {
        // Only what the spans say: no thread, source location or busy/idle times, and
        // no OpenTelemetry context attached on every enter (the gateway reads a span's
        // context where it sends it on), which costs on every poll of a traced future.
        tracing_opentelemetry::layer()
            .with_tracer(t.tracer.clone())
            .with_context_activation(false)
            .with_tracked_inactivity(false)
            .with_threads(false)
            .with_location(false)
    });
    let registry = tracing_subscriber::registry().with(filter).with(otel);
    match config.log_format {
        LogFormat::Pretty => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(std::io::stderr().is_terminal())
                    .with_writer(std::io::stderr),
            )
            .init(),
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .event_format(WithTraceIds(tracing_subscriber::fmt::format().json()))
                    .with_writer(std::io::stderr),
            )
            .init(),
    }
    acp_gateway::telemetry::traces::remember_dispatch();
    let log_format = config.log_format;
    let code = match serve_or_migrate(config).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // Said once: in the log's own format when it is JSON, else as a line for people.
            match log_format {
                LogFormat::Json => tracing::error!("{}", shown(&e)),
                LogFormat::Pretty => eprintln!("acp-gateway: {}", shown(&e)),
            }
            std::process::ExitCode::FAILURE
        }
    };
    if let Some(traces) = traces {
        traces.shutdown().await;
    }
    code
}

/// An error as the log and stderr show it: its whole chain, with no URL's credentials.
fn shown(e: &anyhow::Error) -> String {
    acp_gateway::redact::text(&format!("{e:#}")).into_owned()
}

async fn serve_or_migrate(config: Config) -> anyhow::Result<()> {
    match config.command {
        Some(Command::Migrate {
            from: Some(ref from),
            to: Some(ref to),
        }) => {
            return acp_gateway::copy_command(from, to).await;
        }
        Some(Command::Migrate { .. }) => {
            acp_gateway::migrate(&config).await?;
            println!("migrations applied");
            return Ok(());
        }
        Some(Command::Backup { ref to }) => {
            return acp_gateway::backup_command(&config, to).await;
        }
        Some(Command::Agents { ref action }) => {
            return acp_gateway::agents_command(&config, action).await;
        }
        Some(Command::CheckAgent { ref only }) => {
            let checked = acp_gateway::check::check_agents(&config, only.as_deref()).await?;
            print!("{}", checked.report);
            return checked.result();
        }
        Some(Command::Connect {
            ref url,
            once,
            heartbeat,
            exact_url,
            ref token,
        }) => {
            let key = token
                .as_deref()
                .or(config.api_keys.last().map(String::as_str));
            let link = acp_gateway::bridge::Link {
                once,
                heartbeat: (heartbeat > 0).then(|| std::time::Duration::from_secs(heartbeat)),
                exact: exact_url,
                max_message_bytes: config.max_line_bytes,
            };
            let ended = acp_gateway::bridge::connect(url, key, link).await;
            // Stdin is read on a blocking thread that no runtime shutdown can stop (it would
            // wait for the next line): the bridge leaves at once.
            if let Err(e) = &ended {
                tracing::error!("{}", shown(e));
                eprintln!("acp-gateway: {}", shown(e));
            }
            std::process::exit(i32::from(ended.is_err()));
        }
        Some(Command::Serve) | None => {}
    }
    let effective: serde_json::Map<String, serde_json::Value> = config
        .effective
        .iter()
        .map(|(k, v)| (k.clone(), v.clone().into()))
        .collect();
    tracing::info!(config = %serde_json::Value::Object(effective), "effective configuration");
    let settings = acp_gateway::settings::Settings::load(config)?;
    let url = &settings.config.database_url;
    let opened = acp_gateway::open_database(&settings.database, url, true).await?;
    let listener = tokio::net::TcpListener::bind(settings.config.listen).await?;
    // Tests and scripts read this line to find an ephemeral port.
    println!("listening on http://{}", listener.local_addr()?);
    acp_gateway::run(settings, opened, listener, shutdown_signal()).await
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
