//! The composition root: assembles the Pingora server from a config, with the proxy
//! service on every listener, the metrics and demo services, and the reloader.
//!
//! It is the only module that knows every other one; nothing imports it but `main`. See the
//! module map in `docs/architecture.md`.

use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwap;
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::Server;
use pingora::services::background::background_service;
use pingora::services::listening::Service;

use crate::config::ConfigError;
use crate::metrics::{Metrics, MetricsError};
use crate::proxy::demo::DemoUpstream;
use crate::proxy::metrics_app::MetricsApp;
use crate::proxy::service::Tollgate;
use crate::reload::{unix_now, Reloader, Snapshot};
use crate::runtime::collector::RuntimeCollector;
use crate::runtime::{BuildError, Runtime};

/// How to run: the CLI's `run` options.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The config file.
    pub config: PathBuf,
    /// Fork into the background (Pingora's `--daemon`).
    pub daemon: bool,
    /// Take over the listeners of a running tollgate (Pingora's `--upgrade`); the old
    /// process hands them over when it receives SIGQUIT.
    pub upgrade: bool,
    /// The Unix socket listeners are handed over on during an upgrade.
    pub upgrade_sock: String,
    /// Where the daemon writes its PID.
    pub pid_file: String,
}

/// Why tollgate could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The config is unreadable or invalid.
    #[error("{0}")]
    Config(#[from] ConfigError),
    /// The runtime could not be built.
    #[error("{0}")]
    Build(#[from] BuildError),
    /// The metrics registry could not be built.
    #[error("{0}")]
    Metrics(#[from] MetricsError),
    /// A runtime metric could not be registered.
    #[error("cannot register runtime metrics: {0}")]
    Collector(#[from] prometheus::Error),
}

/// Loads the config and builds a bootstrapped server ready for `run_forever`.
pub fn build(opts: &RunOptions) -> Result<Server, StartError> {
    // Read once, as the reloader reads: it compares later reads with this one.
    let snapshot = Snapshot::read(&opts.config).map_err(|source| ConfigError::Read {
        file: opts.config.display().to_string(),
        source,
    })?;
    let loaded = snapshot.parse(&opts.config)?;
    for warning in &loaded.warnings {
        log::warn!("{warning}");
    }
    let metrics = Arc::new(Metrics::new()?);
    let config = Arc::new(loaded.config);
    let (runtime, _) = Runtime::build(config.clone(), None, &metrics)?;
    metrics.config_last_reload_success.set(unix_now());
    let runtime = Arc::new(ArcSwap::from_pointee(runtime));
    metrics.register(Box::new(RuntimeCollector::new(runtime.clone())?))?;

    let server_cfg = &config.server;
    let grace =
        server_cfg.grace_period.as_secs() + u64::from(server_cfg.grace_period.subsec_nanos() > 0);
    let conf = ServerConf {
        threads: server_cfg.threads,
        grace_period_seconds: Some(grace),
        graceful_shutdown_timeout_seconds: Some(grace.max(1)),
        upgrade_sock: opts.upgrade_sock.clone(),
        pid_file: opts.pid_file.clone(),
        ..ServerConf::default()
    };
    let opt = Opt {
        upgrade: opts.upgrade,
        daemon: opts.daemon,
        ..Opt::default()
    };
    let mut server = Server::new_with_opt_and_conf(opt, conf);
    server.bootstrap();

    let mut proxy = pingora_proxy::http_proxy_service_with_name(
        &server.configuration,
        Tollgate::new(runtime.clone()),
        "tollgate proxy",
    );
    for addr in &server_cfg.listen {
        proxy.add_tcp(&addr.to_string());
    }
    server.add_service(proxy);

    if let Some(addr) = server_cfg.metrics {
        let mut svc = Service::new("metrics".to_string(), MetricsApp::new(metrics.clone()));
        svc.threads = Some(1);
        svc.add_tcp(&addr.to_string());
        server.add_service(svc);
    }
    if let Some(addr) = server_cfg.demo_upstream {
        let mut svc = Service::new("demo upstream".to_string(), DemoUpstream);
        svc.threads = Some(1);
        svc.add_tcp(&addr.to_string());
        server.add_service(svc);
    }
    server.add_service(background_service(
        "config reloader",
        Reloader::new(opts.config.clone(), runtime, metrics, Some(snapshot)),
    ));
    Ok(server)
}
