//! Tenant quotas: requests/s with burst, tokens per minute and requests in flight, behind one
//! interface ([`Limiter`], made per tenant by a [`QuotaStore`]) with two implementations:
//! - [`local`]: in-process limiters (governor's GCRA for the request rate, a token bucket that
//!   may go into debt for tokens, a counter of requests in flight): each node on its own. The
//!   default.
//! - [`fleet`]: the same three limits kept in Redis (`serve --quota-store redis://…`) by
//!   server-side Lua scripts, shared by every node, with leased concurrency slots that expire
//!   when a node dies; Redis slow or down falls back to the local limiter (fail open) or
//!   refuses with 503 (fail closed).
//!
//! The quota layer (after auth, before validation) admits a request or answers 429 with
//! `Retry-After`. The concurrency slot it takes travels with the request as a [`Slot`] and is
//! freed when the response (streamed or not) is complete.

pub mod fleet;
mod layer;
pub mod local;

use futures_util::future::BoxFuture;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use superinfer_tenants::{Quotas, Tenant};

use crate::error::GatewayError;

pub use layer::layer;
pub use local::{LocalLimiter, LocalStore};

/// Where quota state lives: makes each tenant's [`Limiter`].
pub trait QuotaStore: Send + Sync {
    /// The limiter of `tenant` (its name and quotas); made again when either changes.
    fn limiter(&self, tenant: &Tenant) -> Arc<dyn Limiter>;
}

/// One tenant's live limits.
pub trait Limiter: Send + Sync + std::fmt::Debug {
    /// The quotas this limiter enforces.
    fn quotas(&self) -> &Quotas;
    /// Admits one request or says why not. The returned guard holds a concurrency slot until
    /// it is dropped (when the response, streamed or not, is complete).
    fn admit(&self) -> BoxFuture<'_, Result<InFlight, Refusal>>;
    /// Takes `seats` more concurrency seats for the other sequences of a request already
    /// admitted (its prompts × `best_of`), all or none; the request rate and tokens are not
    /// checked again. The guard frees them together.
    fn admit_seats(&self, seats: u32) -> BoxFuture<'_, Result<InFlight, Refusal>>;
    /// Charges `tokens` against tokens per minute (a request's reservation at admission,
    /// what it used beyond it at the end: `usage::UsageTicket`).
    fn charge_tokens(&self, tokens: u64);
    /// Gives back `tokens` charged before and not used (up to a full bucket).
    fn refund_tokens(&self, tokens: u64);
    /// Requests of this tenant in flight on this node now.
    fn in_flight(&self) -> u32;
    /// The tokens-per-minute bucket's balance now (negative: in debt), where this node keeps
    /// it; `None` where a shared store does (the fleet's is in Redis).
    fn tokens_available(&self) -> Option<f64>;
    /// This tenant's limiter under edited `quotas`, keeping what it owes and holds: the
    /// tokens-per-minute balance (debt included, capped at the new quota), the seats in
    /// flight, and the request-rate state while the rate and burst are unchanged.
    fn with_quotas(&self, quotas: Quotas) -> Arc<dyn Limiter>;
}

/// Why a request was refused, with how long to wait.
#[derive(Clone, Debug, PartialEq)]
pub enum Refusal {
    Rate {
        limit: f64,
        burst: u32,
        wait: Duration,
    },
    Tokens {
        limit: u64,
        wait: Duration,
    },
    Concurrency {
        limit: u32,
    },
    /// A request whose sequences (prompts × `best_of`) need more seats than are free.
    Seats {
        limit: u32,
        asked: u32,
    },
    /// The shared quota store did not answer and the node fails closed.
    StoreUnavailable,
}

impl Refusal {
    /// The `reason` label of `superinfer_requests_rejected_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::Rate { .. } => "rate",
            Refusal::Tokens { .. } => "tokens",
            Refusal::Concurrency { .. } | Refusal::Seats { .. } => "concurrency",
            Refusal::StoreUnavailable => "quota_store",
        }
    }

    /// What the client reads, and the `Retry-After` seconds.
    pub fn message(&self) -> (String, u64) {
        match self {
            Refusal::Rate { limit, burst, wait } => (
                format!(
                    "request rate over this tenant's quota ({limit} requests/s, burst {burst}); \
                     retry after the Retry-After seconds or ask for a higher quota"
                ),
                ceil_secs(*wait),
            ),
            Refusal::Tokens { limit, wait } => (
                format!(
                    "token usage over this tenant's quota ({limit} tokens/min); retry after the \
                     Retry-After seconds or ask for a higher quota"
                ),
                ceil_secs(*wait),
            ),
            Refusal::Concurrency { limit } => (
                format!(
                    "too many requests in flight for this tenant (limit {limit}); wait for one \
                     to finish"
                ),
                1,
            ),
            Refusal::Seats { limit, asked } => (
                format!(
                    "this request runs {asked} sequences (prompts × n or best_of) and this \
                     tenant's sequences in flight would exceed its limit of {limit} \
                     (max_concurrent); wait for some to finish or send fewer sequences"
                ),
                1,
            ),
            Refusal::StoreUnavailable => (
                "the fleet's quota store is unavailable, so no quota can be checked; retry \
                 after the Retry-After seconds"
                    .into(),
                1,
            ),
        }
    }

    /// The HTTP answer: 429 for a quota, 503 when the quota store is down (fail closed).
    pub fn into_error(self) -> GatewayError {
        let (message, retry_after_s) = self.message();
        match self {
            Refusal::StoreUnavailable => GatewayError::Overloaded {
                message,
                retry_after_s,
            },
            _ => GatewayError::RateLimited {
                message,
                retry_after_s,
            },
        }
    }
}

pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// A concurrency slot (local counter or fleet lease); frees itself on drop.
pub struct InFlight {
    _held: Box<dyn Send + Sync>,
}

impl InFlight {
    pub(crate) fn new(held: impl Send + Sync + 'static) -> InFlight {
        InFlight {
            _held: Box::new(held),
        }
    }
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InFlight")
    }
}

/// The concurrency slot of one request, taken out by the handler.
#[derive(Clone, Debug)]
pub struct Slot(Arc<Mutex<Option<InFlight>>>);

impl Slot {
    pub fn take(&self) -> Option<InFlight> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}
