//! The fleet's quota operations: the Lua scripts beside this file, run with EVALSHA (loaded
//! again on NOSCRIPT, e.g. after a Redis restart), and the keys of one tenant. Each call takes
//! `now` so tests can drive the scripts on their own clock; serving passes `None` and the
//! scripts read Redis's clock, so the nodes' clocks need not agree.

use redis::aio::ConnectionLike;
use redis::{RedisResult, Script};
use std::sync::LazyLock;
use std::time::Duration;
use superinfer_tenants::Quotas;

use crate::quota::Refusal;

static ADMIT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("admit.lua")));
static CHARGE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("charge.lua")));
static SEATS: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("seats.lua")));
static REFRESH: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("refresh.lua")));

/// The tokens bucket fills from empty in one minute (`tokens_per_min`).
const WINDOW_US: u64 = 60_000_000;

/// One tenant's keys. The `{…}` hash tag keeps them in one slot of a Redis Cluster, so one
/// script may touch all three.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantKeys {
    pub rate: String,
    pub tokens: String,
    pub leases: String,
}

impl TenantKeys {
    /// The keys of tenant `name` under `prefix` (tenant names are the same on every node: they
    /// come from one tenants file; ids need not be).
    pub fn new(prefix: &str, name: &str) -> TenantKeys {
        let base = format!("{prefix}{{{name}}}");
        TenantKeys {
            rate: format!("{base}:rate"),
            tokens: format!("{base}:tokens"),
            leases: format!("{base}:leases"),
        }
    }
}

/// What `admit.lua` decided.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Admitted; the lease is held until released or expired.
    Admitted,
    Refused(Refusal),
}

fn now_arg(now_us: Option<u64>) -> String {
    now_us.map_or_else(String::new, |n| n.to_string())
}

/// GCRA parameters of the request rate, as governor derives them (`local.rs`): the period
/// `T = 1 / requests_per_s` and `tau = T * (burst - 1)`, in microseconds (at least one).
pub fn rate_params_us(q: &Quotas) -> (u64, u64) {
    let period = (1e6 / q.requests_per_s.max(1e-6)).round().max(1.0) as u64;
    (period, period * u64::from(q.burst.max(1) - 1))
}

/// Admits one request: request rate, then tokens per minute, then a concurrency lease `lease`
/// that lives `ttl` unless refreshed.
pub async fn admit(
    conn: &mut impl ConnectionLike,
    keys: &TenantKeys,
    quotas: &Quotas,
    lease: &str,
    ttl: Duration,
    now_us: Option<u64>,
) -> RedisResult<Decision> {
    let (period, tau) = rate_params_us(quotas);
    let (admitted, reason, wait_us): (i64, String, u64) = ADMIT
        .key(&keys.rate)
        .key(&keys.tokens)
        .key(&keys.leases)
        .arg(period)
        .arg(tau)
        .arg(WINDOW_US)
        .arg(lease)
        .arg(ttl.as_micros() as u64)
        .arg(quotas.max_concurrent)
        .arg(now_arg(now_us))
        .invoke_async(conn)
        .await?;
    if admitted == 1 {
        return Ok(Decision::Admitted);
    }
    let wait = Duration::from_micros(wait_us);
    let refusal = match reason.as_str() {
        "rate" => Refusal::Rate {
            limit: quotas.requests_per_s,
            burst: quotas.burst,
            wait,
        },
        "tokens" => Refusal::Tokens {
            limit: quotas.tokens_per_min,
            wait,
        },
        "concurrency" => Refusal::Concurrency {
            limit: quotas.max_concurrent,
        },
        other => {
            return Err(redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "admit.lua refused for an unknown reason",
                other.to_string(),
            )))
        }
    };
    Ok(Decision::Refused(refusal))
}

/// Charges `tokens` to the tenant's tokens-per-minute bucket; returns its balance after the
/// charge (negative: in debt).
pub async fn charge(
    conn: &mut impl ConnectionLike,
    keys: &TenantKeys,
    tokens_per_min: u64,
    tokens: i64,
    now_us: Option<u64>,
) -> RedisResult<f64> {
    let balance: String = CHARGE
        .key(&keys.tokens)
        .arg(tokens)
        .arg(WINDOW_US)
        .arg(tokens_per_min)
        .arg(now_arg(now_us))
        .invoke_async(conn)
        .await?;
    balance.parse().map_err(|_| {
        redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "charge.lua returned no number",
            balance,
        ))
    })
}

/// Extends a held lease by `ttl`; `false` when it had already expired (it is not brought
/// back).
pub async fn refresh(
    conn: &mut impl ConnectionLike,
    keys: &TenantKeys,
    lease: &str,
    ttl: Duration,
    now_us: Option<u64>,
) -> RedisResult<bool> {
    let extended: i64 = REFRESH
        .key(&keys.leases)
        .arg(lease)
        .arg(ttl.as_micros() as u64)
        .arg(now_arg(now_us))
        .invoke_async(conn)
        .await?;
    Ok(extended == 1)
}

/// Takes the leases `ids` at once, all or none (`seats.lua`); `false` when they would
/// exceed `max_concurrent`.
pub async fn seats(
    conn: &mut impl ConnectionLike,
    keys: &TenantKeys,
    max_concurrent: u32,
    ids: &[String],
    ttl: Duration,
    now_us: Option<u64>,
) -> RedisResult<bool> {
    let mut call = SEATS.key(&keys.leases);
    call.arg(ttl.as_micros() as u64)
        .arg(max_concurrent)
        .arg(now_arg(now_us));
    for id in ids {
        call.arg(id);
    }
    let taken: i64 = call.invoke_async(conn).await?;
    Ok(taken == 1)
}

/// Gives a lease back.
pub async fn release(
    conn: &mut impl ConnectionLike,
    keys: &TenantKeys,
    lease: &str,
) -> RedisResult<()> {
    redis::cmd("ZREM")
        .arg(&keys.leases)
        .arg(lease)
        .query_async::<i64>(conn)
        .await
        .map(drop)
}

/// Leases held now (live or not yet dropped), for tests and diagnostics.
pub async fn leases(conn: &mut impl ConnectionLike, keys: &TenantKeys) -> RedisResult<u64> {
    redis::cmd("ZCARD")
        .arg(&keys.leases)
        .query_async(conn)
        .await
}
