//! Fleet-wide quotas in Redis (`serve --quota-store redis://host:port[/db]`): every node
//! charges the same counters, so a tenant's quota is the fleet's, not each node's.
//!
//! One admission is one atomic script ([`scripts`], `admit.lua`): GCRA for the request rate,
//! GCRA over tokens for tokens per minute (the local bucket's semantics: in debt → refused),
//! and a concurrency lease in a sorted set scored by expiry. A running request's lease is
//! extended by a heartbeat every third of `--quota-lease-ttl-ms` and removed when it ends;
//! the leases of a node that died expire on their own. Output tokens are charged as requests
//! end, off the request path.
//!
//! Every call is bounded by `--quota-store-timeout-ms`. A call that fails or times out is
//! counted and logged ([`health`]) and, per `--quota-store-failure`, the request is decided by
//! this node's local limiter (`open`) or refused with 503 (`closed`).

mod health;
pub mod scripts;

use futures_util::future::BoxFuture;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use serde::Deserialize;
use std::future::Future;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use superinfer_tenants::{Quotas, Tenant};
use tokio::task::JoinHandle;

use super::{InFlight, Limiter, LocalLimiter, QuotaStore, Refusal};
use crate::metrics::Metrics;
pub use health::{ErrorKind, StoreHealth, LOG_PERIOD};
use scripts::{Decision, TenantKeys};

/// What a node does when the quota store does not answer in time.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum FailureMode {
    /// Decide with this node's local limiter (each node then allows the full quota).
    #[default]
    Open,
    /// Refuse with 503 and `Retry-After`.
    Closed,
}

/// `--quota-store` and its settings, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct FleetConfig {
    /// `redis://host:port[/db]`.
    pub url: String,
    pub failure: FailureMode,
    /// The longest any Redis call may take.
    pub timeout: Duration,
    /// A concurrency lease not refreshed for this long expires.
    pub lease_ttl: Duration,
    /// Prefix of every key.
    pub key_prefix: String,
}

/// The key prefix of the fleet's quota state.
pub const KEY_PREFIX: &str = "superinfer:quota:";

/// The Redis quota store of this node.
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    conn: ConnectionManager,
    cfg: FleetConfig,
    health: StoreHealth,
    /// Lease ids are `<node>:<n>`: unique across the fleet.
    node: String,
    next_lease: AtomicU64,
    runtime: tokio::runtime::Handle,
}

impl RedisStore {
    /// Sets up the connection (made lazily, and again after any failure); call inside the
    /// server's runtime. An unreachable Redis is not an error here: it is the failure mode's
    /// business, request by request.
    pub fn new(cfg: FleetConfig, metrics: Metrics) -> anyhow::Result<RedisStore> {
        let client = redis::Client::open(cfg.url.as_str())
            .map_err(|e| anyhow::anyhow!("quota_store: {e}"))?;
        let manager = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(cfg.timeout))
            .set_response_timeout(Some(cfg.timeout))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(cfg.timeout);
        let conn = ConnectionManager::new_lazy_with_config(client, manager)
            .map_err(|e| anyhow::anyhow!("quota_store: {e}"))?;
        Ok(RedisStore {
            inner: Arc::new(Inner {
                conn,
                health: StoreHealth::new(metrics),
                node: format!("{:016x}", rand::random::<u64>()),
                next_lease: AtomicU64::new(0),
                runtime: tokio::runtime::Handle::current(),
                cfg,
            }),
        })
    }

    /// Pings Redis once (at start, so `superinfer_quota_store_up` and the log say at once
    /// whether it answers).
    pub async fn ping(&self) -> bool {
        let mut c = self.inner.conn.clone();
        let cmd = redis::cmd("PING");
        let ping = cmd.query_async::<String>(&mut c);
        self.inner.bounded("ping", ping).await.is_ok()
    }
}

impl Inner {
    /// Runs one Redis call within the timeout, recording the outcome.
    async fn bounded<T>(
        &self,
        op: &str,
        call: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, ErrorKind> {
        match tokio::time::timeout(self.cfg.timeout, call).await {
            Ok(Ok(v)) => {
                self.health.ok();
                Ok(v)
            }
            Ok(Err(e)) => {
                let kind = ErrorKind::of(&e);
                self.health.error(kind, &format!("{op}: {e}"));
                Err(kind)
            }
            Err(_) => {
                let ms = self.cfg.timeout.as_millis();
                self.health
                    .error(ErrorKind::Timeout, &format!("{op}: no answer in {ms} ms"));
                Err(ErrorKind::Timeout)
            }
        }
    }
}

impl QuotaStore for RedisStore {
    fn limiter(&self, tenant: &Tenant) -> Arc<dyn Limiter> {
        Arc::new(FleetLimiter {
            inner: self.inner.clone(),
            keys: Arc::new(TenantKeys::new(&self.inner.cfg.key_prefix, &tenant.name)),
            quotas: tenant.quotas,
            local: Arc::new(LocalLimiter::new(tenant.quotas)),
            held: Arc::new(AtomicU32::new(0)),
        })
    }
}

/// One tenant's fleet-wide limits, with its local limiter for failing open.
pub struct FleetLimiter {
    inner: Arc<Inner>,
    keys: Arc<TenantKeys>,
    quotas: Quotas,
    local: Arc<LocalLimiter>,
    /// Fleet leases this node holds for the tenant.
    held: Arc<AtomicU32>,
}

impl std::fmt::Debug for FleetLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetLimiter")
            .field("keys", &self.keys)
            .field("quotas", &self.quotas)
            .field("held", &self.held)
            .finish()
    }
}

impl FleetLimiter {
    async fn admit_fleet(&self) -> Result<InFlight, Refusal> {
        let n = self.inner.next_lease.fetch_add(1, Ordering::Relaxed);
        let id = format!("{}:{n}", self.inner.node);
        let ttl = self.inner.cfg.lease_ttl;
        let mut c = self.inner.conn.clone();
        let call = scripts::admit(&mut c, &self.keys, &self.quotas, &id, ttl, None);
        match self.inner.bounded("admit", call).await {
            Ok(Decision::Admitted) => Ok(InFlight::new(Lease::start(self, id))),
            Ok(Decision::Refused(r)) => Err(r),
            Err(_) => match self.inner.cfg.failure {
                FailureMode::Open => {
                    self.inner.health.fallback();
                    self.local.admit()
                }
                FailureMode::Closed => Err(Refusal::StoreUnavailable),
            },
        }
    }
}

impl FleetLimiter {
    async fn seats_fleet(&self, seats: u32) -> Result<InFlight, Refusal> {
        let ids: Vec<String> = (0..seats)
            .map(|_| {
                let n = self.inner.next_lease.fetch_add(1, Ordering::Relaxed);
                format!("{}:{n}", self.inner.node)
            })
            .collect();
        let ttl = self.inner.cfg.lease_ttl;
        let limit = self.quotas.max_concurrent;
        let mut c = self.inner.conn.clone();
        let call = scripts::seats(&mut c, &self.keys, limit, &ids, ttl, None);
        match self.inner.bounded("seats", call).await {
            Ok(true) => Ok(InFlight::new(
                ids.into_iter()
                    .map(|id| Lease::start(self, id))
                    .collect::<Vec<_>>(),
            )),
            Ok(false) => Err(Refusal::Seats {
                limit,
                asked: seats + 1,
            }),
            Err(_) => match self.inner.cfg.failure {
                FailureMode::Open => {
                    self.inner.health.fallback();
                    self.local.admit_seats(seats)
                }
                FailureMode::Closed => Err(Refusal::StoreUnavailable),
            },
        }
    }
}

impl FleetLimiter {
    /// Charges (or, negative, refunds) tokens in the background; failing open, the local
    /// bucket takes what the fleet's could not.
    fn charge_signed(&self, tokens: i64) {
        if tokens == 0 {
            return;
        }
        let (inner, keys, local) = (self.inner.clone(), self.keys.clone(), self.local.clone());
        let per_min = self.quotas.tokens_per_min;
        self.inner.runtime.spawn(async move {
            let mut c = inner.conn.clone();
            let call = scripts::charge(&mut c, &keys, per_min, tokens, None);
            if inner.bounded("charge", call).await.is_err()
                && inner.cfg.failure == FailureMode::Open
            {
                if tokens > 0 {
                    local.charge_tokens(tokens.unsigned_abs());
                } else {
                    local.refund_tokens(tokens.unsigned_abs());
                }
            }
        });
    }
}

impl Limiter for FleetLimiter {
    fn quotas(&self) -> &Quotas {
        &self.quotas
    }

    fn admit(&self) -> BoxFuture<'_, Result<InFlight, Refusal>> {
        Box::pin(self.admit_fleet())
    }

    fn admit_seats(&self, seats: u32) -> BoxFuture<'_, Result<InFlight, Refusal>> {
        Box::pin(self.seats_fleet(seats))
    }

    fn charge_tokens(&self, tokens: u64) {
        self.charge_signed(i64::try_from(tokens).unwrap_or(i64::MAX));
    }

    fn refund_tokens(&self, tokens: u64) {
        self.charge_signed(-i64::try_from(tokens).unwrap_or(i64::MAX));
    }

    fn in_flight(&self) -> u32 {
        self.held.load(Ordering::Relaxed) + self.local.in_flight()
    }

    /// The fleet's balance is in Redis, shared by every node.
    fn tokens_available(&self) -> Option<f64> {
        None
    }

    /// The fleet's balances live in Redis under the tenant's name, so they carry over as
    /// they are; the local fallback carries its own.
    fn with_quotas(&self, quotas: Quotas) -> Arc<dyn Limiter> {
        Arc::new(FleetLimiter {
            inner: self.inner.clone(),
            keys: self.keys.clone(),
            quotas,
            local: Arc::new(self.local.carried(quotas)),
            held: self.held.clone(),
        })
    }
}

/// The first wait before a failed lease release is tried again; it doubles up to
/// [`RELEASE_RETRY_MAX`].
const RELEASE_RETRY_FIRST: Duration = Duration::from_millis(50);
const RELEASE_RETRY_MAX: Duration = Duration::from_millis(200);

/// A fleet concurrency lease: refreshed while held, removed when dropped (a failed removal is
/// retried until it goes through or the lease would have expired).
struct Lease {
    inner: Arc<Inner>,
    keys: Arc<TenantKeys>,
    id: String,
    held: Arc<AtomicU32>,
    heartbeat: JoinHandle<()>,
}

impl Lease {
    fn start(limiter: &FleetLimiter, id: String) -> Lease {
        limiter.held.fetch_add(1, Ordering::AcqRel);
        let (inner, keys) = (limiter.inner.clone(), limiter.keys.clone());
        let beat_id = id.clone();
        let heartbeat = inner.runtime.spawn({
            let (inner, keys) = (inner.clone(), keys.clone());
            async move {
                let ttl = inner.cfg.lease_ttl;
                loop {
                    tokio::time::sleep(ttl / 3).await;
                    let mut c = inner.conn.clone();
                    let call = scripts::refresh(&mut c, &keys, &beat_id, ttl, None);
                    if let Ok(false) = inner.bounded("heartbeat", call).await {
                        inner.health.error(
                            ErrorKind::LeaseLost,
                            &format!("heartbeat: lease {beat_id} had expired"),
                        );
                        return;
                    }
                }
            }
        });
        Lease {
            inner,
            keys,
            id,
            held: limiter.held.clone(),
            heartbeat,
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.heartbeat.abort();
        self.held.fetch_sub(1, Ordering::AcqRel);
        let (inner, keys, id) = (
            self.inner.clone(),
            self.keys.clone(),
            std::mem::take(&mut self.id),
        );
        // A release that fails (Redis paused or unreachable) is tried again until it goes
        // through or the lease's TTL has run out anyway: a pause then costs the fleet this
        // seat for about the pause, not for a whole TTL.
        self.inner.runtime.spawn(async move {
            let give_up = tokio::time::Instant::now() + inner.cfg.lease_ttl;
            let mut wait = RELEASE_RETRY_FIRST;
            loop {
                let mut c = inner.conn.clone();
                let call = scripts::release(&mut c, &keys, &id);
                if inner.bounded("release", call).await.is_ok()
                    || tokio::time::Instant::now() + wait >= give_up
                {
                    return;
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(RELEASE_RETRY_MAX);
            }
        });
    }
}
