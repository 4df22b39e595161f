//! Group commit of the usage ledger: a request's record reaches the disk before its client gets
//! the last byte of its answer, so a node killed at any moment has billed every answer a
//! client received in full (and at most the few it was finishing when it died).
//!
//! The flusher writes the ledger every [`FLUSH_EVERY`], and at once when an answer waits for
//! its record ([`LedgerCommit::wait`]); answers that end while a write is under way share the
//! next one (group commit). [`gate`] holds back the bytes an answer produces after its
//! request was billed (a body, or a stream's usage chunk and `[DONE]`) until that write is
//! done; the tokens streamed before are never delayed.

use axum::body::Body;
use axum::response::Response;
use futures_util::StreamExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use superinfer_tenants::{TenantStore, UsageLedger};
use tokio::sync::{watch, Notify};

/// How often the ledger's in-memory counts are written to sled when no answer waits.
pub const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// The longest an answer waits for its record. Past it (a failing or stalled disk) the answer
/// goes out, the record stays in memory for the next write, and an error is logged: the
/// server keeps serving rather than wedge every answer on its disk.
pub const COMMIT_TIMEOUT: Duration = Duration::from_secs(2);

/// When an answer's ledger record must be on disk (`--ledger-sync`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, serde::Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LedgerSync {
    /// Before the answer's last byte: a crash loses no record of an answer a client received
    /// in full; each answer's end waits for one disk write (shared with the answers ending
    /// meanwhile).
    #[default]
    Answer,
    /// Every second: answers never wait; a crash loses up to the last second's records.
    Interval,
}

/// The ledger's writer, shared by the flusher task and the answers waiting on it.
pub struct LedgerCommit {
    sync: LedgerSync,
    metrics: crate::metrics::Metrics,
    ledger: UsageLedger,
    wake: Notify,
    /// The sequence number of the last record on disk, as the last write left it.
    durable: watch::Sender<u64>,
}

impl LedgerCommit {
    /// Whether answers wait for their records ([`LedgerSync::Answer`]).
    pub fn answers_wait(&self) -> bool {
        self.sync == LedgerSync::Answer
    }

    /// Waits until record `seq` is on disk (at most [`COMMIT_TIMEOUT`]); whether it is.
    pub async fn wait(&self, seq: u64) -> bool {
        if self.ledger.durable_seq() >= seq {
            return true;
        }
        let mut durable = self.durable.subscribe();
        self.wake.notify_one();
        let written = tokio::time::timeout(COMMIT_TIMEOUT, durable.wait_for(|d| *d >= seq))
            .await
            .is_ok_and(|r| r.is_ok());
        if !written {
            self.metrics.ledger_late();
            tracing::error!(
                seq,
                "a usage record is not on disk after {COMMIT_TIMEOUT:?}; the answer goes out without it"
            );
        }
        written
    }

    /// One write of everything recorded so far.
    async fn flush(&self) {
        let ledger = self.ledger.clone();
        match tokio::task::spawn_blocking(move || ledger.flush()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::error!(error = %e, "cannot write the usage ledger; kept in memory for the next try")
            }
            Err(e) => tracing::error!(error = %e, "the usage ledger task failed"),
        }
        self.durable.send_replace(self.ledger.durable_seq());
    }
}

/// Starts the ledger's writer: every [`FLUSH_EVERY`], and (with [`LedgerSync::Answer`])
/// whenever an answer waits for its record, until aborted.
pub fn spawn_flusher(
    store: TenantStore,
    sync: LedgerSync,
    metrics: crate::metrics::Metrics,
) -> (tokio::task::JoinHandle<()>, Arc<LedgerCommit>) {
    let commit = LedgerCommit::new(&store, sync, metrics);
    let writer = commit.clone();
    let task = tokio::spawn(async move {
        let mut every = tokio::time::interval(FLUSH_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = every.tick() => {}
                () = writer.wake.notified() => {}
            }
            writer.flush().await;
        }
    });
    (task, commit)
}

impl LedgerCommit {
    /// The writer's shared state, with no task writing yet.
    fn new(store: &TenantStore, sync: LedgerSync, metrics: crate::metrics::Metrics) -> Arc<Self> {
        Arc::new(LedgerCommit {
            sync,
            metrics,
            ledger: store.usage().clone(),
            wake: Notify::new(),
            durable: watch::channel(0).0,
        })
    }
}

/// The sequence number of a request's ledger record once it is billed (0 before).
#[derive(Debug, Default)]
pub struct Receipt(AtomicU64);

impl Receipt {
    pub(crate) fn set(&self, seq: u64) {
        self.0.store(seq, Ordering::Release);
    }

    fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}

/// `resp` with every byte produced after its request was billed held back until the record
/// is on disk (unchanged under [`LedgerSync::Interval`]). An answer built whole after its
/// request ended (not streamed) waits here and goes out as it is; a stream is wrapped, and
/// waits before its first chunk produced after the billing.
pub async fn gate(resp: Response, receipt: Arc<Receipt>, commit: Arc<LedgerCommit>) -> Response {
    if !commit.answers_wait() {
        return resp;
    }
    let seq = receipt.get();
    if seq != 0 {
        commit.wait(seq).await;
        return resp;
    }
    resp.map(|body| {
        let chunks = body.into_data_stream();
        Body::from_stream(futures_util::stream::unfold(
            (chunks, receipt, commit, false),
            |(mut chunks, receipt, commit, committed)| async move {
                let chunk = chunks.next().await?;
                let seq = receipt.get();
                let mut committed = committed;
                if !committed && seq != 0 {
                    // Whether or not the write succeeded in time, the answer goes on.
                    commit.wait(seq).await;
                    committed = true;
                }
                Some((chunk, (chunks, receipt, commit, committed)))
            },
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use superinfer_tenants::{NewTenant, UsageCounts};

    /// An answer whose record is not on disk by the commit timeout goes out and is counted.
    #[tokio::test]
    async fn an_answer_that_leaves_before_its_record_is_durable_is_counted() {
        let dir = tempfile::tempdir().unwrap();
        let store = TenantStore::open(dir.path().join("db")).unwrap();
        let (t, _) = store.create(NewTenant::named("a")).unwrap();
        let metrics = crate::metrics::Metrics::new();
        // No writer runs: the disk never answers.
        let commit = LedgerCommit::new(&store, LedgerSync::Answer, metrics.clone());
        let seq = store.usage().record(t.id, 0, UsageCounts::default());
        assert!(!commit.wait(seq).await);
        let text = metrics.render(&Default::default(), "m");
        assert!(
            text.contains("superinfer_ledger_late_answers_total 1"),
            "{text}"
        );
    }
}
