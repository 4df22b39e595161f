//! The in-process limiters of one node (the default [`QuotaStore`]): a governor GCRA for
//! requests/s with burst, a tokens-per-minute bucket, and a count of requests in flight.
//! [`super::fleet`] keeps the same three in Redis with the same semantics, and falls back to
//! these when Redis does not answer (fail open).
//!
//! Tokens per minute: a request is admitted while the tenant's bucket is not in debt; its
//! prompt tokens are charged at admission and its output tokens as it finishes, so the bucket
//! may go below zero and a long answer is never cut short. The bucket refills at
//! `tokens_per_min / 60` per second up to `tokens_per_min`.

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use superinfer_tenants::{Quotas, Tenant};

use super::{InFlight, Limiter, QuotaStore, Refusal};

/// Limiters in this process only: each node enforces each quota on its own.
#[derive(Clone, Copy, Debug, Default)]
pub struct LocalStore;

impl QuotaStore for LocalStore {
    fn limiter(&self, tenant: &Tenant) -> Arc<dyn Limiter> {
        Arc::new(LocalLimiter::new(tenant.quotas))
    }
}

/// The live limiters of one tenant, built from its [`Quotas`].
pub struct LocalLimiter {
    quotas: Quotas,
    rate: Arc<DefaultDirectRateLimiter>,
    /// Shared with every limiter carried from this one, so that a request admitted before
    /// an edit refunds and charges the bucket the tenant has now.
    tokens: Arc<Mutex<TokenBucket>>,
    in_flight: Arc<AtomicU32>,
}

impl std::fmt::Debug for LocalLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalLimiter")
            .field("quotas", &self.quotas)
            .field("in_flight", &self.in_flight)
            .finish()
    }
}

impl LocalLimiter {
    pub fn new(quotas: Quotas) -> LocalLimiter {
        LocalLimiter {
            quotas,
            rate: Arc::new(RateLimiter::direct(rate_quota(&quotas))),
            tokens: Arc::new(Mutex::new(TokenBucket::new(
                quotas.tokens_per_min,
                Instant::now(),
            ))),
            in_flight: Arc::new(AtomicU32::new(0)),
        }
    }

    pub fn quotas(&self) -> &Quotas {
        &self.quotas
    }

    /// The limiter under edited `quotas`, keeping this one's balances
    /// ([`Limiter::with_quotas`]): the same seats and token bucket (resized), so what
    /// requests admitted before the edit give back reaches the tenant's balance.
    pub fn carried(&self, quotas: Quotas) -> LocalLimiter {
        let same_rate = (quotas.requests_per_s, quotas.burst)
            == (self.quotas.requests_per_s, self.quotas.burst);
        let rate = if same_rate {
            self.rate.clone()
        } else {
            Arc::new(RateLimiter::direct(rate_quota(&quotas)))
        };
        self.bucket().resize(quotas.tokens_per_min, Instant::now());
        LocalLimiter {
            quotas,
            rate,
            tokens: self.tokens.clone(),
            in_flight: self.in_flight.clone(),
        }
    }

    /// Requests of this tenant in flight now.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// The tokens-per-minute balance now (negative: in debt).
    pub fn tokens_available(&self) -> f64 {
        self.bucket().balance(Instant::now())
    }

    /// Admits one request or says why not. The returned guard holds a concurrency slot until
    /// it is dropped (when the response, streamed or not, is complete).
    pub fn admit(&self) -> Result<InFlight, Refusal> {
        if let Err(not_until) = self.rate.check() {
            let wait = not_until.wait_time_from(DefaultClock::default().now());
            return Err(Refusal::Rate {
                limit: self.quotas.requests_per_s,
                burst: self.quotas.burst,
                wait,
            });
        }
        if let Some(wait) = self.bucket().debt_wait(Instant::now()) {
            return Err(Refusal::Tokens {
                limit: self.quotas.tokens_per_min,
                wait,
            });
        }
        let before = self.in_flight.fetch_add(1, Ordering::AcqRel);
        if before >= self.quotas.max_concurrent {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(Refusal::Concurrency {
                limit: self.quotas.max_concurrent,
            });
        }
        Ok(InFlight::new(LocalSlot {
            counter: self.in_flight.clone(),
            seats: 1,
        }))
    }

    /// Takes `seats` more concurrency seats, all or none ([`Limiter::admit_seats`]).
    pub fn admit_seats(&self, seats: u32) -> Result<InFlight, Refusal> {
        let limit = self.quotas.max_concurrent;
        let taken = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                now.checked_add(seats).filter(|&after| after <= limit)
            });
        if taken.is_err() {
            return Err(Refusal::Seats {
                limit,
                asked: seats + 1,
            });
        }
        Ok(InFlight::new(LocalSlot {
            counter: self.in_flight.clone(),
            seats,
        }))
    }

    /// Charges `tokens` against the tokens-per-minute bucket.
    pub fn charge_tokens(&self, tokens: u64) {
        self.bucket().charge(tokens, Instant::now());
    }

    fn bucket(&self) -> std::sync::MutexGuard<'_, TokenBucket> {
        // The bucket is plain numbers, consistent after any panic.
        self.tokens.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The governor quota of `q`'s request rate (also the reference of the fleet's GCRA in tests).
pub fn rate_quota(q: &Quotas) -> Quota {
    // Validated by the tenant store: requests_per_s is finite and > 0, burst >= 1.
    let period =
        Duration::from_secs_f64(1.0 / q.requests_per_s.max(1e-6)).max(Duration::from_nanos(1));
    let burst = NonZeroU32::new(q.burst.max(1)).expect("max(1) is non-zero");
    Quota::with_period(period)
        .expect("the period is at least one nanosecond")
        .allow_burst(burst)
}

impl Limiter for LocalLimiter {
    fn quotas(&self) -> &Quotas {
        &self.quotas
    }

    fn admit(&self) -> futures_util::future::BoxFuture<'_, Result<InFlight, Refusal>> {
        Box::pin(std::future::ready(LocalLimiter::admit(self)))
    }

    fn admit_seats(
        &self,
        seats: u32,
    ) -> futures_util::future::BoxFuture<'_, Result<InFlight, Refusal>> {
        Box::pin(std::future::ready(LocalLimiter::admit_seats(self, seats)))
    }

    fn charge_tokens(&self, tokens: u64) {
        LocalLimiter::charge_tokens(self, tokens);
    }

    fn in_flight(&self) -> u32 {
        LocalLimiter::in_flight(self)
    }

    fn tokens_available(&self) -> Option<f64> {
        Some(LocalLimiter::tokens_available(self))
    }

    fn refund_tokens(&self, tokens: u64) {
        self.bucket().refund(tokens, Instant::now());
    }

    fn with_quotas(&self, quotas: Quotas) -> Arc<dyn Limiter> {
        Arc::new(self.carried(quotas))
    }
}

/// Local concurrency seats; free themselves on drop.
#[derive(Debug)]
struct LocalSlot {
    counter: Arc<AtomicU32>,
    seats: u32,
}

impl Drop for LocalSlot {
    fn drop(&mut self) {
        self.counter.fetch_sub(self.seats, Ordering::AcqRel);
    }
}

/// A token bucket that may go into debt. Time is a parameter, so tests need no sleeping.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenBucket {
    capacity: f64,
    per_s: f64,
    balance: f64,
    at: Instant,
}

impl TokenBucket {
    pub fn new(tokens_per_min: u64, now: Instant) -> TokenBucket {
        let capacity = tokens_per_min as f64;
        TokenBucket {
            capacity,
            per_s: capacity / 60.0,
            balance: capacity,
            at: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.balance = (self.balance + dt * self.per_s).min(self.capacity);
        self.at = now;
    }

    /// `None` when a request may start now; otherwise how long until the debt is repaid.
    pub fn debt_wait(&mut self, now: Instant) -> Option<Duration> {
        self.refill(now);
        (self.balance < 0.0).then(|| Duration::from_secs_f64(-self.balance / self.per_s))
    }

    /// The balance as of `now` (refilled to then).
    pub fn balance(&mut self, now: Instant) -> f64 {
        self.refill(now);
        self.balance
    }

    pub fn charge(&mut self, tokens: u64, now: Instant) {
        self.refill(now);
        self.balance -= tokens as f64;
    }

    /// Gives back `tokens` charged before (up to a full bucket).
    pub fn refund(&mut self, tokens: u64, now: Instant) {
        self.refill(now);
        self.balance = (self.balance + tokens as f64).min(self.capacity);
    }

    /// Puts this bucket under a new quota of `tokens_per_min`, its balance as of `now` kept
    /// (a debt stays a debt; a credit is capped at the new capacity).
    pub fn resize(&mut self, tokens_per_min: u64, now: Instant) {
        self.refill(now);
        let balance = self.balance;
        *self = TokenBucket::new(tokens_per_min, now);
        self.balance = balance.min(self.capacity);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quotas(rps: f64, burst: u32, concurrent: u32) -> Quotas {
        Quotas {
            requests_per_s: rps,
            burst,
            max_concurrent: concurrent,
            ..Quotas::default()
        }
    }

    #[test]
    fn seats_for_a_fan_out_are_taken_all_or_none_and_freed_together() {
        let l = LocalLimiter::new(quotas(100.0, 100, 8));
        let first = l.admit().unwrap();
        let seven = l.admit_seats(7).unwrap();
        assert_eq!(l.in_flight(), 8);
        assert_eq!(l.admit().unwrap_err(), Refusal::Concurrency { limit: 8 });
        drop(seven);
        assert_eq!(l.in_flight(), 1);
        // Eight more would make nine: refused whole, nothing taken.
        assert_eq!(
            l.admit_seats(8).unwrap_err(),
            Refusal::Seats { limit: 8, asked: 9 }
        );
        assert_eq!(l.in_flight(), 1);
        drop(first);
        assert_eq!(l.in_flight(), 0);
    }

    #[test]
    fn an_edit_keeps_the_debt_the_seats_and_the_rate_state() {
        let q = Quotas {
            tokens_per_min: 600,
            ..quotas(1.0, 2, 2)
        };
        let l = LocalLimiter::new(q);
        let held = l.admit().unwrap();
        let _second = l.admit().unwrap();
        l.charge_tokens(1_000);
        // A higher quota: the 400-token debt is still owed, the two seats still held, the
        // burst still spent (same rate and burst).
        let edited = l.carried(Quotas {
            tokens_per_min: 6_000,
            max_concurrent: 3,
            ..q
        });
        assert_eq!(edited.in_flight(), 2);
        assert!(matches!(edited.admit(), Err(Refusal::Rate { .. })));
        let debt_wait = edited.bucket().debt_wait(Instant::now()).expect("in debt");
        assert!(debt_wait > Duration::from_secs(3), "{debt_wait:?}");
        drop(held);
        assert_eq!((l.in_flight(), edited.in_flight()), (1, 1));
        // A credit is capped at a lower quota's capacity.
        let fresh = LocalLimiter::new(q);
        let lower = fresh.carried(Quotas {
            tokens_per_min: 60,
            ..q
        });
        lower.charge_tokens(61);
        assert!(lower.bucket().debt_wait(Instant::now()).is_some());
    }

    /// A request admitted before an edit refunds into the bucket the tenant has after it:
    /// its reservation is not kept as a charge, whatever limiter object it still holds.
    #[test]
    fn refunds_of_requests_admitted_before_an_edit_reach_the_edited_bucket() {
        let q = Quotas {
            tokens_per_min: 6_000,
            ..quotas(100.0, 100, 8)
        };
        let before = LocalLimiter::new(q);
        // A reservation of 6,000 tokens taken at admission: the bucket is empty.
        before.charge_tokens(6_000);
        let after = before.carried(Quotas {
            tokens_per_min: 12_000,
            ..q
        });
        assert!(after.tokens_available() < 100.0);
        // The request ends having used nothing: its old limiter gives the reservation back.
        Limiter::refund_tokens(&before, 6_000);
        assert!(
            after.tokens_available() >= 6_000.0,
            "{}",
            after.tokens_available()
        );
        // And a charge through the old one is owed by the tenant after the edit too.
        before.charge_tokens(20_000);
        assert!(after.bucket().debt_wait(Instant::now()).is_some());
    }

    #[test]
    fn burst_then_refusal_with_a_wait() {
        let l = LocalLimiter::new(quotas(1.0, 3, 100));
        let held: Vec<_> = (0..3).map(|_| l.admit().unwrap()).collect();
        match l.admit() {
            Err(Refusal::Rate { wait, .. }) => {
                assert!(wait > Duration::from_millis(500) && wait <= Duration::from_secs(1))
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(l.in_flight(), 3);
        drop(held);
        assert_eq!(l.in_flight(), 0);
    }

    #[test]
    fn concurrency_slots_are_returned_on_drop() {
        let l = LocalLimiter::new(quotas(1e6, 1000, 2));
        let a = l.admit().unwrap();
        let _b = l.admit().unwrap();
        assert_eq!(l.admit().unwrap_err(), Refusal::Concurrency { limit: 2 });
        drop(a);
        assert!(l.admit().is_ok());
    }

    #[test]
    fn token_bucket_allows_debt_and_refuses_until_repaid() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(600, t0); // 10 tokens/s
        assert_eq!(b.debt_wait(t0), None);
        b.charge(650, t0);
        let wait = b.debt_wait(t0).unwrap();
        assert!((wait.as_secs_f64() - 5.0).abs() < 1e-6, "{wait:?}");
        assert_eq!(b.debt_wait(t0 + Duration::from_secs(6)), None);
        // Refill stops at the capacity.
        b.refill(t0 + Duration::from_secs(3600));
        assert_eq!(b.balance, 600.0);
    }

    #[test]
    fn refusal_messages_name_the_limit() {
        let (msg, after) = Refusal::Tokens {
            limit: 1000,
            wait: Duration::from_millis(1500),
        }
        .message();
        assert!(msg.contains("1000 tokens/min"), "{msg}");
        assert_eq!(after, 2);
    }
}
