//! The tenant registry of SuperInfer: who may use the server, with which latency promises
//! (SLOs), which share of service (weight) and which limits (quotas), kept in sled.
//!
//! What it does:
//! - stores [`Tenant`]s (id, unique name, [`Slo`], weight, [`Quotas`], enabled flag, creation
//!   time) in a [`TenantStore`] on sled, with name and key-hash indexes;
//! - issues API keys ([`ApiKey`], `sk-si-` + 256 random bits from the OS), shows each once,
//!   keeps only its SHA-256 ([`KeyHash`]), and authenticates by hash lookup plus a
//!   constant-time comparison ([`Auth`]); one active key per tenant, rotation retires the old;
//! - acknowledges an admin write only once it is durable: each is one sled transaction over
//!   every tree it touches, then a flush;
//! - applies a declarative [`TenantsFile`] (TOML) idempotently ([`TenantStore::apply`]);
//! - keeps a usage ledger for billing ([`UsageLedger`]: per tenant and UTC hour, requests,
//!   prompt, cached and completion tokens, errors), batched in memory and flushed to sled;
//! - records a schema version and migrates older layouts on open;
//! - gives the gateway an in-memory [`Snapshot`] to authenticate against, and a change
//!   subscription ([`TenantStore::subscribe`]) to know when to rebuild it.
//!
//! What it does not do: HTTP, admin tokens, rate limiting or quota accounting (the gateway
//! enforces the quotas stored here), or anything the engine schedules (the gateway hands the
//! engine plain fields: tenant id, weight, SLO). It depends on no other workspace crate.
//!
//! The data model, key handling, durability and migrations are described in
//! `docs/TENANTS.md`.

#![forbid(unsafe_code)]

mod bytes;
mod error;
mod file;
mod id;
mod key;
mod model;
mod snapshot;
mod store;
mod usage;

pub use error::{Result, TenantError};
pub use file::TenantsFile;
pub use key::{is_well_formed as is_well_formed_key, ApiKey, KeyHash, KEY_PREFIX};
pub use model::{
    NewTenant, Quotas, QuotasPatch, Slo, SloPatch, Tenant, TenantId, TenantPatch, TenantRef,
    ValidNewTenant, MAX_CACHE_NAMESPACE_CHARS, MAX_NAME_CHARS, MAX_TBT_MS, MAX_TTFT_MS, MAX_WEIGHT,
    MIN_WEIGHT,
};
pub use sled::Subscriber;
pub use snapshot::{Auth, Snapshot};
pub use store::{ApplyReport, TenantStore, SCHEMA_VERSION};
pub use usage::{
    format_hour, parse_time, to_csv, DuplicateLedger, UsageCounts, UsageLedger, UsageQuery,
    UsageReport, UsageReportRow, UsageRow,
};
