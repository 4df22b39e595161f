//! The tenants as the request path sees them: an in-memory directory (the store's
//! [`Snapshot`] plus each tenant's limiters, statistics and metric handles) swapped atomically
//! whenever the store changes, so authenticating a request never touches sled.
//!
//! Freshness: a task waits on the store's change subscription and rebuilds the directory; the
//! admin API also rebuilds it right after its own writes, so a rotated-out key stops working
//! before the admin call returns.

use arc_swap::ArcSwap;
use std::collections::HashMap;
use std::sync::Arc;
use superinfer_tenants::{Auth, Snapshot, Tenant, TenantId, TenantStore};

use crate::error::GatewayError;
use crate::metrics::{Metrics, TenantMetrics};
use crate::quota::{Limiter, QuotaStore};
use crate::stats::TenantStats;

/// Everything the gateway holds about one tenant while serving it.
#[derive(Debug)]
pub struct TenantCtx {
    pub tenant: Tenant,
    pub limits: Arc<dyn Limiter>,
    pub stats: Arc<TenantStats>,
    pub metrics: Arc<TenantMetrics>,
}

impl TenantCtx {
    /// One sequence submitted to the engine, in the statistics and the metrics: the first of its
    /// request or not, and the prompt tokens it brings (0 for a choice following another
    /// with the same prompt, which the usage counts once).
    pub fn admitted(&self, first_of_request: bool, prompt_tokens: u32) {
        self.stats
            .admitted(first_of_request, u64::from(prompt_tokens));
        if first_of_request {
            self.metrics.admitted[0].increment(1);
        }
        self.metrics.admitted[1].increment(1);
        self.metrics
            .prompt_tokens
            .increment(u64::from(prompt_tokens));
    }
}

impl TenantCtx {
    /// A request the node refused for load (a full queue or inbox, draining) `waited_s` after
    /// it arrived: a TTFT miss of its tenant (`shed`), as a request shed in the queue is.
    pub fn shed(&self, waited_s: f64) {
        let att = self.stats.unserved(waited_s);
        self.metrics.ttft_attainment.set(att);
        self.metrics.slo_checks[0].increment(1);
        let shed = crate::metrics::UNSERVED_REASONS
            .iter()
            .position(|r| *r == "shed")
            .unwrap_or(0);
        self.metrics.ttft_unserved[shed].increment(1);
    }
}

#[derive(Default)]
struct Directory {
    snapshot: Snapshot,
    tenants: HashMap<TenantId, Arc<TenantCtx>>,
}

/// The live directory of tenants.
pub struct Registry {
    store: TenantStore,
    metrics: Metrics,
    /// Makes each tenant's limiter: in-process, or shared by the fleet.
    quota: Arc<dyn QuotaStore>,
    current: ArcSwap<Directory>,
    /// Serializes rebuilds, so an older snapshot never replaces a newer one.
    rebuild: tokio::sync::Mutex<()>,
}

impl Registry {
    /// Builds the first directory. Subscribe to the store before calling this, so no write
    /// falls between the subscription and the first snapshot.
    pub fn new(
        store: TenantStore,
        metrics: Metrics,
        quota: Arc<dyn QuotaStore>,
    ) -> Result<Registry, GatewayError> {
        let r = Registry {
            store,
            metrics,
            quota,
            current: ArcSwap::from_pointee(Directory::default()),
            rebuild: tokio::sync::Mutex::new(()),
        };
        let snapshot = r.store.snapshot()?;
        r.install(snapshot);
        Ok(r)
    }

    pub fn store(&self) -> &TenantStore {
        &self.store
    }

    /// Who presents this key, with the tenant's live state.
    pub fn authenticate(&self, key: &str) -> Auth<Arc<TenantCtx>> {
        let dir = self.current.load();
        match dir.snapshot.authenticate(key) {
            Auth::Granted(t) => dir
                .tenants
                .get(&t.id)
                .map_or(Auth::Denied, |c| Auth::Granted(c.clone())),
            Auth::Disabled(t) => dir
                .tenants
                .get(&t.id)
                .map_or(Auth::Denied, |c| Auth::Disabled(c.clone())),
            Auth::Denied => Auth::Denied,
        }
    }

    /// A tenant's live state by id.
    pub fn get(&self, id: TenantId) -> Option<Arc<TenantCtx>> {
        self.current.load().tenants.get(&id).cloned()
    }

    /// Re-reads the store (off the async executor) and installs the result if it is newer.
    pub async fn refresh(self: &Arc<Self>) -> Result<(), GatewayError> {
        let _one = self.rebuild.lock().await;
        let store = self.store.clone();
        let snapshot = tokio::task::spawn_blocking(move || store.snapshot())
            .await
            .map_err(|e| GatewayError::Internal(format!("snapshot task: {e}")))??;
        if snapshot.generation() >= self.current.load().snapshot.generation() {
            self.install(snapshot);
        }
        Ok(())
    }

    fn install(&self, snapshot: Snapshot) {
        let old = self.current.load();
        let tenants = snapshot
            .tenants()
            .iter()
            .map(|t| (t.id, Arc::new(self.context(t, old.tenants.get(&t.id)))))
            .collect();
        self.current
            .store(Arc::new(Directory { snapshot, tenants }));
    }

    /// The tenant's state, keeping what did not change: limiters (their balances too when
    /// the quotas were edited) while the name (the fleet's key) is the same, statistics
    /// always, metric handles while the name is the same.
    fn context(&self, t: &Tenant, old: Option<&Arc<TenantCtx>>) -> TenantCtx {
        let limits = match old {
            Some(o) if o.tenant.name == t.name => {
                if *o.limits.quotas() == t.quotas {
                    o.limits.clone()
                } else {
                    // An edit keeps the balances: a tenant in debt stays in debt.
                    o.limits.with_quotas(t.quotas)
                }
            }
            _ => self.quota.limiter(t),
        };
        let metrics = match old {
            Some(o) if o.tenant.name == t.name => o.metrics.clone(),
            _ => Arc::new(self.metrics.tenant(&t.name)),
        };
        TenantCtx {
            tenant: t.clone(),
            limits,
            stats: old.map_or_else(Default::default, |o| o.stats.clone()),
            metrics,
        }
    }

    /// Keeps the directory fresh until the store goes away: one rebuild per change event.
    pub fn spawn_watcher(
        self: &Arc<Self>,
        mut changes: superinfer_tenants::Subscriber,
    ) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            while (&mut changes).await.is_some() {
                if let Err(e) = me.refresh().await {
                    tracing::error!(error = %e, "cannot refresh the tenant directory");
                }
            }
        })
    }
}
