//! `serve --tenants-file FILE`: the declarative tenants file (docs/TENANTS.md, "Tenants
//! files") applied through the tenant store at start and again on each SIGHUP. A file that
//! does not parse or validate is refused whole: at start the server does not start; on
//! SIGHUP the error is logged and the tenants stay as they were.

use std::sync::Arc;
use superinfer_tenants::{ApplyReport, TenantStore, TenantsFile};

use crate::config::TenantsFileConfig;
use crate::error::GatewayError;
use crate::registry::Registry;

/// Reads the file and applies it to `store` (blocking: it reads a file and flushes sled).
pub fn apply(store: &TenantStore, cfg: &TenantsFileConfig) -> Result<ApplyReport, GatewayError> {
    let file = TenantsFile::load(&cfg.path)?;
    Ok(store.apply(&file, cfg.prune)?)
}

/// Applies the file again on the running server and installs the result in the request
/// path's directory before returning (what SIGHUP does).
pub async fn reload(
    registry: &Arc<Registry>,
    cfg: &TenantsFileConfig,
) -> Result<ApplyReport, GatewayError> {
    let store = registry.store().clone();
    let c = cfg.clone();
    let report = tokio::task::spawn_blocking(move || apply(&store, &c))
        .await
        .map_err(|e| GatewayError::Internal(format!("tenants file task: {e}")))??;
    registry.refresh().await?;
    Ok(report)
}

/// Re-applies the file on every SIGHUP. The handler is installed before this returns, so a
/// SIGHUP sent once the server listens never takes the default action (exit).
#[cfg(unix)]
pub fn spawn_on_sighup(
    registry: Arc<Registry>,
    cfg: TenantsFileConfig,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hup = signal(SignalKind::hangup())?;
    Ok(tokio::spawn(async move {
        while hup.recv().await.is_some() {
            let path = cfg.path.display().to_string();
            match reload(&registry, &cfg).await {
                Ok(report) => tracing::info!(%path, %report, "tenants file applied (SIGHUP)"),
                Err(e) => tracing::error!(
                    %path, error = %e,
                    "tenants file not applied (SIGHUP); the tenants are unchanged"
                ),
            }
        }
    }))
}
