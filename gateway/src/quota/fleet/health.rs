//! Whether the quota store answers: the `/metrics` series (`superinfer_quota_store_up`,
//! `superinfer_quota_store_errors_total{kind}`, `superinfer_quota_store_fallback_total`) and
//! the log, at most one WARN per [`LOG_PERIOD`] however many requests fail (the first failure
//! after a quiet period is logged at once), and one INFO line when the store answers again.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::metrics::{Metrics, QUOTA_STORE_ERRORS, QUOTA_STORE_FALLBACK, QUOTA_STORE_UP};

/// At most one WARN line about quota store errors per this period.
pub const LOG_PERIOD: Duration = Duration::from_secs(10);

/// The kinds of [`QUOTA_STORE_ERRORS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ErrorKind {
    /// No answer within `--quota-store-timeout-ms`.
    Timeout,
    /// No connection (refused, dropped, or being re-established).
    Connection,
    /// Redis answered with an error (a script error, out of memory, a read-only replica…).
    Server,
    /// A running request's lease had expired when its heartbeat came (its slot may be
    /// another request's now).
    LeaseLost,
}

impl ErrorKind {
    pub fn label(self) -> &'static str {
        match self {
            ErrorKind::Timeout => "timeout",
            ErrorKind::Connection => "connection",
            ErrorKind::Server => "server",
            ErrorKind::LeaseLost => "lease_lost",
        }
    }

    pub fn of(e: &redis::RedisError) -> ErrorKind {
        if e.is_timeout() {
            ErrorKind::Timeout
        } else if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
            ErrorKind::Connection
        } else {
            ErrorKind::Server
        }
    }
}

/// The quota store's health as this node sees it.
pub struct StoreHealth {
    metrics: Metrics,
    up: AtomicBool,
    log: Mutex<LogWindow>,
}

#[derive(Default)]
struct LogWindow {
    last_warn: Option<Instant>,
    errors: BTreeMap<ErrorKind, u64>,
}

impl StoreHealth {
    /// Starts as down until the first answer.
    pub fn new(metrics: Metrics) -> StoreHealth {
        metrics.with(|| {
            metrics::gauge!(QUOTA_STORE_UP).set(0.0);
            metrics::counter!(QUOTA_STORE_FALLBACK).absolute(0);
            for kind in [
                ErrorKind::Timeout,
                ErrorKind::Connection,
                ErrorKind::Server,
                ErrorKind::LeaseLost,
            ] {
                metrics::counter!(QUOTA_STORE_ERRORS, "kind" => kind.label()).absolute(0);
            }
        });
        StoreHealth {
            metrics,
            up: AtomicBool::new(false),
            log: Mutex::new(LogWindow::default()),
        }
    }

    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// The store answered.
    pub fn ok(&self) {
        if !self.up.swap(true, Ordering::AcqRel) {
            self.metrics
                .with(|| metrics::gauge!(QUOTA_STORE_UP).set(1.0));
            tracing::info!("the quota store answers");
        }
    }

    /// A call failed (`what`: the operation and the error, for the log).
    pub fn error(&self, kind: ErrorKind, what: &str) {
        self.error_at(kind, what, Instant::now());
    }

    /// [`StoreHealth::error`] at time `now` (tests pass their own clock).
    pub fn error_at(&self, kind: ErrorKind, what: &str, now: Instant) -> bool {
        self.metrics
            .with(|| metrics::counter!(QUOTA_STORE_ERRORS, "kind" => kind.label()).increment(1));
        if kind != ErrorKind::LeaseLost && self.up.swap(false, Ordering::AcqRel) {
            self.metrics
                .with(|| metrics::gauge!(QUOTA_STORE_UP).set(0.0));
        }
        let mut w = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        *w.errors.entry(kind).or_insert(0) += 1;
        let due = w
            .last_warn
            .is_none_or(|t| now.saturating_duration_since(t) >= LOG_PERIOD);
        if due {
            let counts: Vec<String> = w
                .errors
                .iter()
                .map(|(k, n)| format!("{}: {n}", k.label()))
                .collect();
            tracing::warn!(
                "quota store errors ({}; at most one line per {} s, see {QUOTA_STORE_ERRORS}); \
                 latest: {what}",
                counts.join(", "),
                LOG_PERIOD.as_secs()
            );
            w.errors.clear();
            w.last_warn = Some(now);
        }
        due
    }

    /// A request was decided by the local limiter because the store did not answer.
    pub fn fallback(&self) {
        self.metrics
            .with(|| metrics::counter!(QUOTA_STORE_FALLBACK).increment(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_of_errors_is_one_warn_line_per_period_and_all_counted() {
        let metrics = Metrics::new();
        let h = StoreHealth::new(metrics.clone());
        let t0 = Instant::now();
        h.ok();
        assert!(h.is_up());
        let logged: Vec<bool> = (0..1000)
            .map(|i| h.error_at(ErrorKind::Timeout, "admit", t0 + Duration::from_millis(i)))
            .collect();
        assert_eq!(
            logged.iter().filter(|l| **l).count(),
            1,
            "one line for the first"
        );
        assert!(logged[0]);
        assert!(h.error_at(ErrorKind::Connection, "admit", t0 + LOG_PERIOD));
        assert!(!h.is_up());
        let text = metrics.render(&Default::default(), "m");
        assert!(
            text.contains("superinfer_quota_store_errors_total{kind=\"timeout\"} 1000"),
            "{text}"
        );
        assert!(text.contains("superinfer_quota_store_up 0"), "{text}");
    }
}
