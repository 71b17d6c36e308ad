//! acp-gateway: HTTP + Server-Sent Events in front of a pool of ACP coding agents.
//!
//! [`run`] is what `main` and the tests call: it opens the store, starts the pool and serves the
//! router of [`api`] on a listener until `shutdown` resolves, then stops every agent process.

pub mod agent_rpc;
pub mod api;
pub mod bridge;
pub mod check;
pub mod cluster;
pub mod config;
pub mod events;
pub mod gateway;
pub mod install;
pub mod pool;
pub mod redact;
pub mod settings;
pub mod store;
pub mod surrogates;
pub mod telemetry;
pub mod workspace;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request};
use axum::http::StatusCode;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_http::classify::ServerErrorsFailureClass;
use tower_http::cors::CorsLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

use crate::api::auth::Keys;
use crate::api::error::ApiError;
use crate::api::limits::{LimitConfig, Limits};
use crate::cluster::Cluster;
use crate::config::{AgentSpec, Config};
use crate::events::{EventHub, Retention};
use crate::gateway::{Gateway, GatewayConfig};
use crate::pool::{AgentSetup, PoolConfig, ProviderParams};
use crate::settings::Settings;

/// The full HTTP application around a gateway, as `config` sets it: the guard, routes,
/// authentication with `keys`, `cors`, limits, tracing.
pub fn app(
    gateway: Gateway,
    config: &Config,
    keys: Option<Arc<Keys>>,
    cors: Option<CorsLayer>,
    stop: CancellationToken,
) -> Router {
    let guard = api::guard::Guard::new(
        keys.is_some(),
        &config.access.allowed_hosts,
        &config.cors_origins,
        config.advertise_url.as_deref(),
    );
    let limits = LimitConfig {
        rate_per_sec: config.rate_limit,
        max_in_flight: config.max_concurrent_requests,
        max_streams: config.max_streams,
        timeout: Config::secs_or_never(config.request_timeout),
    };
    let (router, _) = api::router().split_for_parts();
    let acp = api::acp_server::Endpoint::new(gateway.clone(), stop);
    let router = router
        .route(api::acp_server::PATH, axum::routing::any(api::acp_server::serve).with_state(acp))
        .fallback(|| async { ApiError::NotFound("no such route".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(axum::middleware::from_fn(api::restore_surrogates))
        .layer(axum::middleware::from_fn_with_state(
            api::hosted::Hosts::new(gateway.clone()),
            api::hosted::to_host,
        ))
        .layer(axum::middleware::from_fn_with_state(
            api::forward::Forwarder::new(gateway.clone()),
            api::forward::forward,
        ))
        .layer(axum::middleware::from_fn_with_state(
            api::idempotency::IdempotencyLayer {
                gateway: gateway.clone(),
                max_body_bytes: config.max_body_bytes,
                wait: Duration::from_secs(config.keep.idempotency_wait),
            },
            api::idempotency::idempotent,
        ))
        // Outside idempotency and forwarding, which believe only a proven forwarding mark.
        .layer(axum::middleware::from_fn_with_state(
            api::proof::Proof::new(&gateway),
            api::proof::admit,
        ))
        .with_state(api::AppState {
            gateway,
            openapi: serde_json::to_vec(&api::openapi())
                .expect("the document serialises")
                .into(),
            sign_in: keys
                .as_ref()
                .and_then(|k| k.oidc())
                .filter(|_| config.oidc.oidc_console_client_id.is_some()),
            shares_limit: Arc::default(),
        })
        .layer(DefaultBodyLimit::max(config.max_body_bytes))
        .layer(
            TraceLayer::new_for_http().make_span_with(|req: &Request| {
                let route = req.extensions().get::<MatchedPath>().map(|p| p.as_str().to_owned());
                let request_id = req.headers().get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
                let route = route.as_deref().unwrap_or("-");
                let session_id = telemetry::traces::session_in(route, req.uri().path());
                let span = tracing::info_span!("request", method = %req.method(), route, request_id, session_id, tenant = tracing::field::Empty, "http.response.status_code" = tracing::field::Empty, "otel.name" = %format_args!("{} {route}", req.method()), "otel.kind" = "server");
                telemetry::traces::continue_in(&span, req.headers());
                span
            })
            .on_response(|res: &axum::http::Response<_>, latency: Duration, span: &tracing::Span| {
                span.record("http.response.status_code", i64::from(res.status().as_u16()));
                tower_http::trace::OnResponse::on_response(tower_http::trace::DefaultOnResponse::default(), res, latency, span);
            })
            .on_failure(log_failure),
        )
        .layer(axum::middleware::from_fn_with_state(Limits::new(limits), api::limits::limit))
        .layer(axum::middleware::from_fn_with_state(keys, api::auth::authenticate))
        .layer(PropagateRequestIdLayer::x_request_id())
        .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
        .layer(axum::middleware::from_fn(telemetry::http_metrics));
    // Outside authentication, so that preflights are answered before it.
    let router = match cors {
        Some(cors) => router.layer(cors),
        None => router,
    };
    // Outermost: a request for a host the gateway does not answer to reaches nothing.
    router.layer(axum::middleware::from_fn_with_state(
        guard,
        api::guard::guard,
    ))
}

/// A failed response, for the log: a 503 says "not now, retry later" (a pool that is starting,
/// full or crash-looping; readiness probes while the agents start), its cause logged where it
/// arises, so it is not an error of its own; anything else 5xx is.
fn log_failure(class: ServerErrorsFailureClass, latency: Duration, _span: &tracing::Span) {
    let latency_ms = latency.as_millis() as u64;
    match class {
        ServerErrorsFailureClass::StatusCode(StatusCode::SERVICE_UNAVAILABLE) => {
            tracing::info!(latency_ms, "service unavailable (503)")
        }
        class => tracing::error!(classification = %class, latency_ms, "response failed"),
    }
}

/// The pool settings of one agent.
pub fn pool_config(agent: &AgentSpec, config: &Config) -> PoolConfig {
    PoolConfig {
        command: agent.command.clone(),
        size: agent.pool_size,
        init_timeout: config.init_timeout(),
        auth_method: agent.auth_method.clone(),
        auth_meta: agent.auth_meta.clone(),
        remote: agent.remote.clone(),
        remote_token: agent.remote_token.clone(),
        provider: None,
    }
}

/// The pools of a local agent (`shared`: its settings) for the tenants with an environment or
/// an LLM provider of their own: each the agent's settings, with the tenant's variables over
/// its own and its provider.
fn tenant_pools(shared: &PoolConfig, config: &Config) -> Vec<(String, PoolConfig)> {
    (config.tenants.own_agents())
        .map(|(tenant, env, provider)| {
            let mut own = shared.clone();
            let vars = env.map_or(&[][..], |e| e.vars());
            let command = &mut own.command;
            command
                .env
                .retain(|(k, _)| vars.iter().all(|(t, _)| t != k));
            command.env.extend(vars.iter().cloned());
            own.provider = provider.map(|p| ProviderParams(p.params()));
            (tenant.to_owned(), own)
        })
        .collect()
}

/// A database opened to serve: its store and replica registry, and on SQLite the lock that
/// keeps a second gateway off the file, held as long as this is.
pub struct ServedDatabase {
    pub database: store::Database,
    _lock: Option<store::ReplicaLock>,
}

/// Opens `database` (`url` as given) and applies its migrations, first taking the SQLite lock
/// when `serve`. A failure says once which URL, what is wrong and what to do.
pub async fn open_database(
    database: &store::DatabaseUrl,
    url: &str,
    serve: bool,
) -> anyhow::Result<ServedDatabase> {
    let shown = redact::url(url);
    let lock = match serve {
        true => {
            store::lock_single_replica(database).with_context(|| format!("database {shown}"))?
        }
        false => None,
    };
    let opened = store::open(database, cluster::replica_id()).await;
    let database = opened.map_err(|e| anyhow::anyhow!(database.unusable(&shown, &e)))?;
    Ok(ServedDatabase {
        database,
        _lock: lock,
    })
}

/// [`open_database`] of a URL not yet read (the operator commands').
pub async fn open_url(url: &str) -> anyhow::Result<store::Database> {
    let database = store::DatabaseUrl::parse(url)
        .map_err(|e| anyhow::anyhow!("database {}: {e}", redact::url(url)))?;
    Ok(open_database(&database, url, false).await?.database)
}

/// Serves `opened` until `shutdown` resolves, then stops every agent process and returns.
pub async fn run(
    settings: Settings,
    opened: ServedDatabase,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let Settings {
        config,
        agents,
        default_agent: default,
        keys,
        cors,
        workspace_roots,
        database: _,
    } = settings;
    // Before anything records a metric.
    telemetry::handle();
    let mcp_servers = config.access.mcp_servers(keys.is_some());
    // Held until `run` returns (or the process ends): one gateway per SQLite file.
    let ServedDatabase {
        database: store::Database { store, replicas },
        _lock,
    } = opened;
    let stop = CancellationToken::new();
    let retention = Retention {
        max_events: (config.keep.retention_events > 0).then_some(config.keep.retention_events),
        max_age: Config::secs_or_never(config.keep.retention_age),
    };
    let hub = EventHub::new(store.clone(), stop.clone(), retention);
    if telemetry::traces::exporting() {
        hub.traced().turn_on(telemetry::traces::sampled);
    }
    // One pool per agent, the default first (as `agents` are), and one of each local agent
    // per tenant with its own environment.
    let pools = agents
        .iter()
        .map(|a| {
            let shared = pool_config(a, &config);
            let tenants = match shared.remote.is_empty() {
                true => tenant_pools(&shared, &config),
                false => Vec::new(),
            };
            AgentSetup {
                name: a.name.clone(),
                config: shared,
                max_sessions: a.max_sessions,
                tenants,
            }
        })
        .collect();
    let address = match &config.advertise_url {
        Some(url) => url.clone(),
        None => format!("http://{}", listener.local_addr()?),
    };
    // Two fresh UUIDs: 244 random bits, unless another replica stored its secret first.
    let fresh = [uuid::Uuid::new_v4(), uuid::Uuid::new_v4()]
        .map(|u| *u.as_bytes())
        .concat();
    let secret = store
        .cluster_secret(&fresh)
        .await
        .context("reading the replicas' shared secret")?;
    let cluster = Cluster::new(
        replicas,
        (address, secret),
        agents.iter().map(|a| a.name.clone()).collect(),
        Duration::from_secs(config.heartbeat_interval),
    );
    // Registered before anything is served, so that no session is claimed by a replica the
    // others do not know yet (and take for dead).
    cluster
        .beat(0)
        .await
        .context("registering this replica in the database")?;
    // Sessions recorded before agents had names belong to the default agent.
    let adopted = store
        .adopt_sessions(&default)
        .await
        .context("giving earlier sessions to the default agent")?;
    if adopted > 0 {
        tracing::info!(
            adopted,
            "sessions recorded before agents had names now belong to the default agent"
        );
    }
    let git = workspace::git::Git::probe(&config.workspaces.git).await;
    let git = match git {
        Ok((git, version)) => {
            tracing::info!(%version, "worktree workspaces, diffs and checkpoints use the host's git");
            Ok(git)
        }
        Err(e) => {
            tracing::warn!(error = %e, "no git: scratch workspaces and their files only (no worktrees, diffs or checkpoints)");
            Err(format!("the gateway's host has no git: {e}"))
        }
    };
    let gateway = Gateway::start(
        store,
        hub.clone(),
        cluster,
        pools,
        GatewayConfig {
            control_timeout: config.control_timeout(),
            acquire_timeout: config.acquire_timeout(),
            cancel_grace: Duration::from_secs(config.cancel_grace),
            permission_timeout: Config::secs_or_never(config.permission_timeout),
            permission_policy: config.permission_policy,
            max_pending_requests: config.max_pending_requests,
            max_updates_per_turn: config.max_updates_per_turn,
            max_sessions_per_member: config.max_sessions_per_member,
            max_sessions: config.max_sessions,
            idle_timeout: Config::secs_or_never(config.idle_timeout),
            shutdown_timeout: Duration::from_secs(config.shutdown_timeout),
            workspace_roots,
            workspace_dir: std::path::absolute(&config.workspaces.workspace_dir)
                .context("--workspace-dir")?,
            keep_workspaces: config.workspaces.keep_workspaces,
            git,
            upstream_tenant: if keys.is_some() {
                gateway::ADMIN_TENANT
            } else {
                gateway::DEFAULT_TENANT
            }
            .to_owned(),
            sync_interval: Config::secs_or_never(config.sync_interval),
            webhooks: webhook_config(&config.webhooks),
            mcp_servers,
            idempotency_ttl: Duration::from_secs(config.keep.idempotency_ttl),
            max_queued_prompts: config.max_queued_prompts as usize,
            tenants: config.tenants.clone(),
            installs: install_config(&config)?,
        },
    );
    // On shutdown: stop accepting and end the SSE streams; cancel running turns and close live
    // sessions (bounded by --shutdown-timeout); stop the agents, which ends any turn still
    // waiting; then let the server finish the requests still in flight.
    let stopper = {
        let (stop, gateway, hub) = (stop.clone(), gateway.clone(), hub.clone());
        let shutdown_timeout = Duration::from_secs(config.shutdown_timeout);
        tokio::spawn(async move {
            stop.cancelled().await;
            // A store outage holds the log (and agents waiting on its queue) no longer than the
            // turns' window and as long again.
            hub.give_up_after(shutdown_timeout * 2);
            gateway.shutdown().await;
            // Everything the turns and agents produced is in the log before we exit (unless the
            // store stays down longer than the shutdown timeout).
            hub.close().await;
        })
    };
    // Only a keys file or expiring tokens need watching: fixed keys never change.
    let watcher = keys
        .clone()
        .filter(|k| config.api_keys_file.is_some() || k.oidc().is_some())
        .map(|keys| tokio::spawn(keys.watch(stop.clone())));
    let app = app(gateway.clone(), &config, keys, cors, stop.clone());
    let stall = Config::secs_or_never(config.stall_timeout);
    let shutdown = {
        let stop = stop.clone();
        async move {
            shutdown.await;
            tracing::info!("shutting down");
            stop.cancel();
        }
    };
    let served = api::serve::serve(listener, app, shutdown, stall).await;
    stop.cancel();
    let _ = stopper.await;
    if let Some(watcher) = watcher {
        let _ = watcher.await;
    }
    served.context("serving HTTP")
}

/// Applies the migrations of the configured database.
pub async fn migrate(config: &Config) -> anyhow::Result<()> {
    open_url(&config.database_url).await?;
    Ok(())
}

/// `migrate --from --to`: copies a whole store into a new one, saying on stderr how far it is
/// (at most once a second, and at each table's end), then what it copied and its digest.
pub async fn copy_command(from: &str, to: &str) -> anyhow::Result<()> {
    let read = |url: &str| {
        store::DatabaseUrl::parse(url)
            .map_err(|e| anyhow::anyhow!("database {}: {e}", redact::url(url)))
    };
    let (source, target) = (read(from)?, read(to)?);
    let (shown_from, shown_to) = (redact::url(from), redact::url(to));
    let mut said = std::time::Instant::now();
    let mut progress = |table: &str, copied: u64, total: u64| {
        if copied == total || said.elapsed() >= Duration::from_secs(1) {
            eprintln!("{table}: {copied} of {total} rows");
            said = std::time::Instant::now();
        }
    };
    let report = store::copy_store(&source, &target, &shown_from, &mut progress)
        .await
        .map_err(|e| match e {
            store::StoreError::Refused(why) => anyhow::anyhow!(why),
            e => anyhow::anyhow!("copying {shown_from} to {shown_to}: {e}"),
        })?;
    for (table, rows) in &report.tables {
        println!("{table}: {rows} rows");
    }
    let again = if report.resumed {
        " (finishing an earlier run)"
    } else {
        ""
    };
    println!(
        "copied {shown_from} to {shown_to}{again}; both hold the same rows, digest {}",
        report.digest
    );
    Ok(())
}

/// `backup --to FILE`: the SQLite store of `--database-url`, copied while it is served.
pub async fn backup_command(config: &Config, to: &std::path::Path) -> anyhow::Result<()> {
    let shown = redact::url(&config.database_url);
    let database = store::DatabaseUrl::parse(&config.database_url)
        .map_err(|e| anyhow::anyhow!("database {shown}: {e}"))?;
    let size = store::backup_sqlite(&database, to)
        .await
        .map_err(|e| anyhow::anyhow!("backup of {shown}: {e}"))?;
    println!("backed up {shown} to {} ({size} bytes)", to.display());
    Ok(())
}

/// Where agents are installed from and to, and how an installed one is started: as a
/// configured agent is, with the tenants' pools.
fn install_config(config: &Config) -> anyhow::Result<gateway::InstallConfig> {
    let client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .build()
        .context("building the registry's HTTP client")?;
    let root = std::path::absolute(&config.installs.agents_dir).context("--agents-dir")?;
    // An archive on this host's disk only from a registry on this host's disk.
    let local = !["http://", "https://"]
        .iter()
        .any(|s| config.installs.registry.starts_with(s));
    let installer =
        install::installer::Installer::new(root, client.clone()).allow_local_archives(local);
    let shared = config.clone();
    let template: gateway::AgentTemplate = Arc::new(move |name, command| {
        let spec = shared.installed_agent(name, command);
        let pools = pool_config(&spec, &shared);
        AgentSetup {
            name: spec.name,
            tenants: tenant_pools(&pools, &shared),
            config: pools,
            max_sessions: spec.max_sessions,
        }
    });
    Ok(gateway::InstallConfig {
        registry: config.installs.registry.clone(),
        installer,
        client,
        template,
    })
}

/// `acp-gateway agents …`: installs a registry's agent and records it in the database (the
/// gateways using it start it), or lists those recorded.
pub async fn agents_command(config: &Config, action: &config::AgentsCommand) -> anyhow::Result<()> {
    let store::Database { store, .. } = open_url(&config.database_url).await?;
    match action {
        config::AgentsCommand::Add { agent, name } => {
            let (id, version) = match agent.split_once('@') {
                Some((id, version)) => (id, Some(version)),
                None => (agent.as_str(), None),
            };
            let installs = install_config(config)?;
            let record = gateway::install_offline(
                store,
                &installs,
                (id, version, name.as_deref()),
                &|line: &str| eprintln!("{line}"),
            )
            .await?;
            println!(
                "installed {} ({} {} {})",
                record.name, record.registry_id, record.kind, record.version
            );
        }
        config::AgentsCommand::List => {
            for r in store
                .installs()
                .await
                .context("reading the installed agents")?
            {
                println!("{}\t{}\t{}\t{}", r.name, r.registry_id, r.kind, r.version);
            }
        }
    }
    Ok(())
}

/// The delivery settings of `--webhook-…`.
fn webhook_config(flags: &config::WebhookFlags) -> gateway::WebhookConfig {
    gateway::WebhookConfig {
        allowed: gateway::reach::Allowed {
            private: flags.webhook_allow_private,
            link_local: flags.webhook_allow_link_local,
        },
        timeout: Duration::from_secs(flags.webhook_timeout.max(1)),
        retry_base: Duration::from_millis(flags.webhook_retry_base_ms.max(1)),
        retry_max: Duration::from_secs(flags.webhook_retry_max.max(1)),
        max_age: Duration::from_secs(flags.webhook_max_age),
        poll: Duration::from_millis(flags.webhook_poll_ms.max(10)),
        max_body: flags.webhook_max_body_bytes,
    }
}
