//! The usage ledger for billing: per tenant and UTC hour, requests, sequences, prompt tokens,
//! cached prompt tokens, completion tokens and errors, kept in the store's `usage` tree.
//!
//! The request path only adds to an in-memory table ([`UsageLedger::record`]: a mutex and a
//! hash-map entry, no I/O) and gets the record's sequence number; [`UsageLedger::flush`] moves
//! that table into sled in one transaction followed by a flush, after which
//! [`UsageLedger::durable_seq`] covers every record it held. Every read
//! ([`UsageLedger::rows`]) flushes first, so what a read reports includes every request
//! recorded before it. The gateway flushes every second, on shutdown, and whenever a request
//! waits for its record to be durable before its last byte (group commit: one flush serves
//! every request that ended meanwhile), so a crash loses no record whose client got an answer.

mod counts;
mod export;
pub(crate) mod journal;
mod time;

#[cfg(test)]
mod tests;

use sled::transaction::TransactionError;
use sled::{Db, Tree};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::error::{Result, TenantError};
use crate::model::TenantId;

pub(crate) use counts::be_u64s;
pub use counts::UsageCounts;
pub use export::{to_csv, DuplicateLedger, UsageReport, UsageReportRow};
pub use time::{format_hour, parse_time};

/// The sled tree of the ledger (schema version 3; values of [`counts::VALUE_BYTES`] since version 4).
pub(crate) const USAGE: &str = "usage";

/// The ledger log is rewritten from the tree (one batch) once it passes this size.
const JOURNAL_REWRITE_BYTES: u64 = 64 << 20;

/// Milliseconds in one hour bucket.
const HOUR_MS: u64 = 3_600_000;

/// One row of the ledger: a tenant's use in one UTC hour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UsageRow {
    pub tenant: TenantId,
    /// Hours since the Unix epoch (the bucket starts at `hour × 3600` s).
    pub hour: u64,
    pub counts: UsageCounts,
}

/// Which rows to read: one tenant or all, hours `from..to` (hours since the epoch; `to`
/// excluded), each bound optional.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsageQuery {
    pub tenant: Option<TenantId>,
    pub from_hour: Option<u64>,
    pub to_hour: Option<u64>,
}

/// The ledger; clones share one table and tree.
#[derive(Clone)]
pub struct UsageLedger {
    db: Db,
    tree: Tree,
    pending: Arc<Mutex<Pending>>,
    /// The sequence number of the last record on disk.
    durable: Arc<AtomicU64>,
    /// One flush at a time: each reads, adds and writes rows.
    flushing: Arc<Mutex<()>>,
    /// The store's backup directory, whose ledger log gets every batch before it is flushed
    /// (`store/backup.rs`); `None`: no log.
    journal: Option<std::path::PathBuf>,
    /// The log lacks a batch (its append failed): it is rewritten whole from the tree at the
    /// next flush.
    journal_stale: Arc<std::sync::atomic::AtomicBool>,
}

/// Records not yet on disk, and the sequence number of the last record.
#[derive(Default)]
struct Pending {
    rows: HashMap<(TenantId, u64), UsageCounts>,
    seq: u64,
}

pub(crate) fn row_key(tenant: TenantId, hour: u64) -> [u8; 12] {
    let mut k = [0u8; 12];
    k[..4].copy_from_slice(&tenant.0.to_be_bytes());
    k[4..].copy_from_slice(&hour.to_be_bytes());
    k
}

pub(crate) fn decode_key(k: &[u8]) -> Result<(TenantId, u64)> {
    let (id, hour) = (k.get(..4), k.get(4..));
    match (id, hour) {
        (Some(id), Some(hour)) if k.len() == 12 => {
            let mut i = [0u8; 4];
            i.copy_from_slice(id);
            let mut h = [0u8; 8];
            h.copy_from_slice(hour);
            Ok((TenantId(u32::from_be_bytes(i)), u64::from_be_bytes(h)))
        }
        _ => Err(TenantError::Corrupt(format!(
            "a usage key is {} bytes, not 12",
            k.len()
        ))),
    }
}

impl UsageLedger {
    pub(crate) fn open(db: &Db, journal: Option<std::path::PathBuf>) -> Result<UsageLedger> {
        Ok(UsageLedger {
            db: db.clone(),
            tree: db.open_tree(USAGE)?,
            pending: Arc::default(),
            durable: Arc::default(),
            flushing: Arc::default(),
            journal,
            journal_stale: Arc::default(),
        })
    }

    /// Brings the ledger log and the tree together at open. Without a log (a store from
    /// before it, or a fresh one) the log starts from the tree. With one, every row the log
    /// holds more of than the tree (a batch logged before a crash kept it from the disk, or
    /// a damaged segment sled's recovery dropped) is raised to the log's counts, field by
    /// field: each is a sum that only grows, so the larger is the more complete.
    pub(crate) fn open_journal(&self) -> Result<()> {
        let Some(dir) = &self.journal else {
            return Ok(());
        };
        if journal::ledger_bytes(dir) == 0 {
            journal::rewrite_ledger(dir, &self.all_rows()?)?;
            return Ok(());
        }
        let mut raised = false;
        for ((tenant, hour), logged) in journal::read_ledger(dir)? {
            let key = row_key(tenant, hour);
            let own = match self.tree.get(key)? {
                Some(v) => UsageCounts::decode(&v)?,
                None => UsageCounts::default(),
            };
            let most = own.field_max(&logged);
            if most != own {
                self.tree.insert(key, most.encode().to_vec())?;
                raised = true;
            }
        }
        if raised {
            self.db.flush()?;
        }
        Ok(())
    }

    /// Every row of the tree, as a batch.
    fn all_rows(&self) -> Result<HashMap<(TenantId, u64), UsageCounts>> {
        let mut out = HashMap::new();
        for kv in self.tree.iter() {
            let (k, v) = kv?;
            out.insert(decode_key(&k)?, UsageCounts::decode(&v)?);
        }
        Ok(out)
    }

    /// Writes `batch` (applied to the tree) to the ledger log before it is flushed; the whole
    /// tree instead when the log fell behind or grew past its bound.
    fn journal(&self, batch: &HashMap<(TenantId, u64), UsageCounts>) -> Result<()> {
        let Some(dir) = &self.journal else {
            return Ok(());
        };
        let stale = self.journal_stale.load(Ordering::Acquire)
            || journal::ledger_bytes(dir) > JOURNAL_REWRITE_BYTES;
        let written = if stale {
            journal::rewrite_ledger(dir, &self.all_rows()?)
        } else {
            journal::append_ledger(dir, batch)
        };
        self.journal_stale
            .store(written.is_err(), Ordering::Release);
        written.map_err(TenantError::from)
    }

    pub(crate) fn tree_iter(&self) -> sled::Iter {
        self.tree.iter()
    }

    /// Adds one request's use to the hour that holds `at_unix_ms` and returns the record's
    /// sequence number (from 1). No I/O: it lands on disk with the next
    /// [`flush`](UsageLedger::flush), and is durable once [`durable_seq`](Self::durable_seq)
    /// reaches that number.
    pub fn record(&self, tenant: TenantId, at_unix_ms: u64, counts: UsageCounts) -> u64 {
        let mut p = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        p.rows
            .entry((tenant, at_unix_ms / HOUR_MS))
            .or_default()
            .add(&counts);
        p.seq += 1;
        p.seq
    }

    /// The sequence number of the last record written to disk (every earlier one is too).
    pub fn durable_seq(&self) -> u64 {
        self.durable.load(Ordering::Acquire)
    }

    /// Moves what was recorded into sled (one transaction, then a flush). A transaction that
    /// fails keeps its counts in memory for the next flush; once a transaction is applied its
    /// counts are in the tree and are never added again, and if the flush to disk fails the
    /// next call flushes again before [`durable_seq`](Self::durable_seq) moves.
    pub fn flush(&self) -> Result<()> {
        self.flush_with(|| self.db.flush().map(|_| ()).map_err(TenantError::from))
    }

    /// [`flush`](Self::flush) with `sync` as the flush to disk (a test makes it fail).
    fn flush_with(&self, sync: impl Fn() -> Result<()>) -> Result<()> {
        let _one = self.flushing.lock().unwrap_or_else(PoisonError::into_inner);
        let (batch, upto) = {
            let mut p = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
            (std::mem::take(&mut p.rows), p.seq)
        };
        if !batch.is_empty() {
            let applied = self
                .tree
                .transaction(|tx| {
                    for (&(tenant, hour), c) in &batch {
                        let key = row_key(tenant, hour);
                        let mut sum = match tx.get(key)? {
                            None => UsageCounts::default(),
                            Some(v) => UsageCounts::decode(&v)
                                .map_err(sled::transaction::ConflictableTransactionError::Abort)?,
                        };
                        sum.add(c);
                        tx.insert(&key, sum.encode().to_vec())?;
                    }
                    Ok(())
                })
                .map_err(|e: TransactionError<TenantError>| match e {
                    TransactionError::Abort(e) => e,
                    TransactionError::Storage(e) => e.into(),
                });
            if let Err(e) = applied {
                let mut p = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
                for (k, c) in batch {
                    p.rows.entry(k).or_default().add(&c);
                }
                return Err(e);
            }
            // Applied: in the log before it is durable (never queued again).
            self.journal(&batch)?;
        }
        if self.durable_seq() < upto {
            sync()?;
        }
        self.durable.fetch_max(upto, Ordering::AcqRel);
        Ok(())
    }

    /// The rows `q` selects, by tenant id then hour; flushes first, so everything recorded
    /// before the call is in them.
    pub fn rows(&self, q: &UsageQuery) -> Result<Vec<UsageRow>> {
        self.flush()?;
        let iter = match q.tenant {
            Some(t) => self.tree.scan_prefix(t.0.to_be_bytes()),
            None => self.tree.iter(),
        };
        let mut rows = Vec::new();
        for kv in iter {
            let (k, v) = kv?;
            let (tenant, hour) = decode_key(&k)?;
            if q.from_hour.is_some_and(|f| hour < f) || q.to_hour.is_some_and(|t| hour >= t) {
                continue;
            }
            rows.push(UsageRow {
                tenant,
                hour,
                counts: UsageCounts::decode(&v)?,
            });
        }
        Ok(rows)
    }
}
