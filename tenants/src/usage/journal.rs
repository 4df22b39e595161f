//! The ledger's log: each batch of the usage ledger appended and synced after it is applied
//! and before it is flushed, with its CRC-32, in `<store>.backup/ledger.log` (the store's
//! verified copy, `store/backup.rs`), so it holds every durable record. A torn last batch
//! (a kill mid-append) is one that never became durable and is skipped when read.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::Path;

use super::counts::{UsageCounts, VALUE_BYTES};
use crate::bytes::{take, take_u32};
use crate::error::Result;
use crate::model::TenantId;

pub(crate) const LEDGER: &str = "ledger.log";

/// Bytes of one ledger row in the log: tenant (4), hour (8), counts (48).
const ROW_BYTES: usize = 4 + 8 + VALUE_BYTES;

/// Appends one ledger batch to the log and syncs it.
pub(crate) fn append_ledger(
    dir: &Path,
    batch: &HashMap<(TenantId, u64), UsageCounts>,
) -> io::Result<()> {
    append_ledger_to(&dir.join(LEDGER), batch)
}

/// Appends one batch to the log file `file` and syncs it.
fn append_ledger_to(file: &Path, batch: &HashMap<(TenantId, u64), UsageCounts>) -> io::Result<()> {
    let dir = file.parent().unwrap_or(Path::new("."));
    let mut body = Vec::with_capacity(batch.len() * ROW_BYTES);
    for (&(tenant, hour), c) in batch {
        body.extend_from_slice(&tenant.0.to_be_bytes());
        body.extend_from_slice(&hour.to_be_bytes());
        body.extend_from_slice(&c.encode());
    }
    let mut rec = Vec::with_capacity(body.len() + 8);
    rec.extend_from_slice(&(body.len() as u32).to_be_bytes());
    rec.extend_from_slice(&crc32fast::hash(&body).to_be_bytes());
    rec.extend_from_slice(&body);
    fs::create_dir_all(dir)?;
    let mut f = OpenOptions::new().create(true).append(true).open(file)?;
    f.write_all(&rec)?;
    f.sync_data()
}

/// Bytes of the ledger log now (0 without one).
pub(crate) fn ledger_bytes(dir: &Path) -> u64 {
    fs::metadata(dir.join(LEDGER)).map_or(0, |m| m.len())
}

/// Replaces the ledger log with one batch of `rows` (the whole ledger), atomically.
pub(crate) fn rewrite_ledger(
    dir: &Path,
    rows: &HashMap<(TenantId, u64), UsageCounts>,
) -> io::Result<()> {
    let tmp = dir.join(format!("{LEDGER}.tmp"));
    let _ = fs::remove_file(&tmp);
    append_ledger_to(&tmp, rows)?;
    fs::rename(&tmp, dir.join(LEDGER))?;
    File::open(dir)?.sync_all()
}

/// The sum of every whole batch of the ledger log (none if there is no log).
pub(crate) fn read_ledger(dir: &Path) -> Result<HashMap<(TenantId, u64), UsageCounts>> {
    let mut out: HashMap<(TenantId, u64), UsageCounts> = HashMap::new();
    let mut file = Vec::new();
    match File::open(dir.join(LEDGER)) {
        Ok(mut f) => f.read_to_end(&mut file)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e.into()),
    };
    let mut at = 0;
    while let (Some(len), Some(crc)) = (take_u32(&file, &mut at), take_u32(&file, &mut at)) {
        let Some(body) = take(&file, &mut at, len) else {
            break; // a torn last batch: never durable
        };
        if crc32fast::hash(body) as usize != crc || len % ROW_BYTES != 0 {
            break;
        }
        for row in body.chunks_exact(ROW_BYTES) {
            let tenant = TenantId(u32::from_be_bytes(row[..4].try_into().expect("4 bytes")));
            let hour = u64::from_be_bytes(row[4..12].try_into().expect("8 bytes"));
            let c = UsageCounts::decode(&row[12..])?;
            out.entry((tenant, hour)).or_default().add(&c);
        }
    }
    Ok(out)
}
