//! Refused requests (4xx, and 5xx answers that say when to retry) in the log at INFO, without
//! letting a client that floods refusals flood the log: the first refusal after a quiet spell
//! is one line at once; those within the next [`WINDOW`] are counted, and the counts (by
//! status, with the latest message) are one line when the first refusal after the window
//! comes (so the refusals of a window after which none follows are not written). `/metrics`
//! counts the refusals of a known tenant by reason (`superinfer_requests_rejected_total`);
//! malformed requests and bad keys only here.

use std::collections::BTreeMap;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

/// At most one line of counts per window.
pub const WINDOW: Duration = Duration::from_secs(10);

/// What to write for one refusal.
#[derive(Debug, PartialEq)]
pub(super) enum Line {
    /// Nothing now: counted in the window.
    Counted,
    /// This refusal, alone (the window before it had no others).
    One,
    /// The refusals counted in the window before this one (`(status, count)`, the latest
    /// message), then this refusal.
    Counts(Vec<(u16, u64)>, String),
}

/// The window's state.
#[derive(Default)]
pub(super) struct Refusals {
    since: Option<Instant>,
    counts: BTreeMap<u16, u64>,
    latest: String,
}

impl Refusals {
    /// One refusal at `now`: what to write.
    pub(super) fn note(&mut self, now: Instant, status: u16, message: &str) -> Line {
        match self.since {
            Some(t) if now.duration_since(t) < WINDOW => {
                *self.counts.entry(status).or_default() += 1;
                message.clone_into(&mut self.latest);
                Line::Counted
            }
            _ => {
                self.since = Some(now);
                let counts: Vec<(u16, u64)> =
                    std::mem::take(&mut self.counts).into_iter().collect();
                if counts.is_empty() {
                    Line::One
                } else {
                    Line::Counts(counts, std::mem::take(&mut self.latest))
                }
            }
        }
    }
}

static REFUSALS: LazyLock<Mutex<Refusals>> = LazyLock::new(Mutex::default);

/// Logs a refusal answered with `status` (see the module's rule).
pub(super) fn log(status: u16, message: &str) {
    let line =
        REFUSALS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .note(Instant::now(), status, message);
    if let Line::Counts(counts, latest) = &line {
        let total: u64 = counts.iter().map(|(_, n)| n).sum();
        let by_status = counts
            .iter()
            .map(|(s, n)| format!("{s}: {n}"))
            .collect::<Vec<_>>()
            .join(", ");
        tracing::info!(
            total,
            by_status,
            latest,
            "requests refused in the {} s after the last one logged",
            WINDOW.as_secs()
        );
    }
    if line != Line::Counted {
        tracing::info!(status, error = message, "request refused");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_of_refusals_is_one_line_then_one_line_of_counts_per_window() {
        let mut r = Refusals::default();
        let t0 = Instant::now();
        let at = |s: f64| t0 + Duration::from_secs_f64(s);
        assert_eq!(r.note(at(0.0), 429, "over quota"), Line::One);
        for k in 1..=100 {
            let status = if k % 10 == 0 { 400 } else { 429 };
            assert_eq!(
                r.note(at(k as f64 * 0.05), status, &format!("m{k}")),
                Line::Counted
            );
        }
        // The first after the window: the counts of the window, then itself.
        assert_eq!(
            r.note(at(10.5), 503, "queue full"),
            Line::Counts(vec![(400, 10), (429, 90)], "m100".into())
        );
        // A quiet spell: the next one alone again.
        assert_eq!(r.note(at(30.0), 401, "no key"), Line::One);
    }
}
