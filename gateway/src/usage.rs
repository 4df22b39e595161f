//! The usage ledger from the gateway's side: what each admitted request cost, as the client
//! was told in its `usage`, added to the tenant store's ledger once per request
//! ([`UsageTicket`]); its writer, which puts each record on disk before the answer's last
//! byte (group commit, [`commit`]); and the export
//! (`GET /admin/v1/usage`, `superinfer tenants usage`) as JSON or CSV.
//!
//! Counting rules (docs/OPERATIONS.md, "Usage ledger"): one request per HTTP request the
//! engine accepted, whatever its `n` or number of prompts; its tokens are what the client
//! received: the `usage` the answer carries (sent in the body or the usage chunk, or that a
//! stream without `include_usage` would have carried; a prompt counted once however many
//! choices it has), the tokens a stream delivered before an error ended it, nothing for an
//! answer that is an error; a request whose client went away counts with the tokens
//! generated until then. Its tokens-per-minute reservation is settled to the same number
//! ([`UsageTicket`]).

use axum::extract::{Query, State};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};
use superinfer_tenants::{
    parse_time, to_csv, TenantId, TenantRef, TenantStore, UsageCounts, UsageLedger, UsageQuery,
    UsageReport,
};

mod commit;

pub use commit::{gate, spawn_flusher, LedgerCommit, LedgerSync, Receipt, FLUSH_EVERY};

use crate::error::{GatewayError, Result};
use crate::quota::Limiter;
use crate::state::Shared;

/// One request's account: the tokens reserved against its tenant's tokens per minute at
/// admission, settled when it ends, and its share of the ledger. Held by each of its
/// choices' generations; settled when its last choice ends (or, if fewer choices were
/// admitted than planned, when the ticket is dropped).
///
/// One rule for both: the request is billed what its client received, and the quota is
/// charged exactly that. A stream that ends in an error was still received up to the error
/// (its tokens are billed); an answer that is an HTTP error, streamed or not, was not (nothing
/// is, though some of its choices were accepted: one of several refused). A
/// request the engine never accepted (refused at submission, or at its queue) is not in the
/// ledger and its whole reservation is refunded.
pub struct UsageTicket {
    ledger: UsageLedger,
    tenant: TenantId,
    limits: Arc<dyn Limiter>,
    reserved: u64,
    streamed: bool,
    /// The ledger record's sequence number once billed ([`gate`] waits for it).
    receipt: Arc<Receipt>,
    state: Mutex<Ticket>,
}

struct Ticket {
    choices_left: usize,
    /// Sequences the engine accepted so far.
    accepted: u32,
    sum: UsageCounts,
    error: bool,
    /// Answered with an HTTP error: nothing of it reached the client ([`UsageTicket::fail`]).
    unsent: bool,
    recorded: bool,
}

/// How one choice ended, for its request's account ([`UsageTicket::end`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct ChoiceEnd {
    pub prompt_tokens: u32,
    pub cached_tokens: u32,
    pub completion_tokens: u32,
    /// The client gets (or got) an error for it.
    pub error: bool,
    /// The engine refused it at its queue without serving it: never accepted.
    pub refused: bool,
}

impl UsageTicket {
    /// A request of `choices` sequences for which `reserved` tokens were charged to `limits`
    /// (`admission::reserve`); `streamed`: its client reads a stream.
    pub fn new(
        ledger: UsageLedger,
        tenant: TenantId,
        choices: usize,
        (limits, reserved): (Arc<dyn Limiter>, u64),
        streamed: bool,
    ) -> UsageTicket {
        UsageTicket {
            ledger,
            tenant,
            limits,
            reserved,
            streamed,
            receipt: Arc::default(),
            state: Mutex::new(Ticket {
                choices_left: choices,
                accepted: 0,
                sum: UsageCounts::default(),
                error: false,
                unsent: false,
                recorded: false,
            }),
        }
    }

    /// Where the request's ledger record will be named once it is billed.
    pub fn receipt(&self) -> Arc<Receipt> {
        self.receipt.clone()
    }

    /// One sequence was submitted to the engine.
    pub fn accepted(&self) {
        self.lock().accepted += 1;
    }

    /// One choice ended.
    pub fn end(&self, e: ChoiceEnd) {
        let mut t = self.lock();
        t.choices_left = t.choices_left.saturating_sub(1);
        if e.refused {
            t.accepted = t.accepted.saturating_sub(1);
        }
        t.error |= e.error;
        t.sum.prompt_tokens += u64::from(e.prompt_tokens);
        t.sum.cached_tokens += u64::from(e.cached_tokens);
        t.sum.completion_tokens += u64::from(e.completion_tokens);
        if t.choices_left == 0 && !t.recorded {
            self.settle(&mut t);
        }
    }

    /// The request is answered with an HTTP error although some of it was admitted: its
    /// client receives no token, streamed or not, so none is billed.
    pub fn fail(&self) {
        let mut t = self.lock();
        t.error = true;
        t.unsent = true;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ticket> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Bills the request (when the engine accepted any of it) and settles its reservation.
    fn settle(&self, t: &mut Ticket) {
        t.recorded = true;
        let received = !t.unsent && (self.streamed || !t.error);
        let counts = UsageCounts {
            requests: 1,
            sequences: u64::from(t.accepted),
            errors: u64::from(t.error),
            ..if received {
                t.sum
            } else {
                UsageCounts::default()
            }
        };
        let billed = if t.accepted == 0 {
            0
        } else {
            let seq = self.ledger.record(self.tenant, now_ms(), counts);
            self.receipt.set(seq);
            counts.prompt_tokens + counts.completion_tokens
        };
        match billed.cmp(&self.reserved) {
            std::cmp::Ordering::Less => self.limits.refund_tokens(self.reserved - billed),
            std::cmp::Ordering::Greater => self.limits.charge_tokens(billed - self.reserved),
            std::cmp::Ordering::Equal => {}
        }
    }
}

impl Drop for UsageTicket {
    fn drop(&mut self) {
        let mut t = std::mem::replace(
            self.state.get_mut().unwrap_or_else(PoisonError::into_inner),
            Ticket {
                choices_left: 0,
                accepted: 0,
                sum: UsageCounts::default(),
                error: false,
                unsent: false,
                recorded: true,
            },
        );
        if !t.recorded {
            self.settle(&mut t);
        }
    }
}

/// Output formats of the export.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Json,
    Csv,
}

/// The export's parameters, as the admin API's query and the CLI's flags give them.
#[derive(Clone, Debug, Default)]
pub struct UsageParams {
    /// An id (all digits) or a name.
    pub tenant: Option<String>,
    /// Unix seconds or `YYYY-MM-DD[THH[:MM[:SS]]][Z]`, UTC; hours overlapping `[from, to)`.
    pub from: Option<String>,
    pub to: Option<String>,
}

impl UsageParams {
    /// The ledger query: the tenant resolved in `store` (a deleted tenant by its id), the
    /// times as hour bounds.
    pub fn query(&self, store: &TenantStore) -> Result<UsageQuery> {
        let tenant = match self.tenant.as_deref().map(TenantRef::parse) {
            None => None,
            Some(TenantRef::Id(id)) => Some(id),
            Some(r) => Some(
                store
                    .resolve(&r)?
                    .ok_or_else(|| GatewayError::TenantNotFound(r.to_string()))?
                    .id,
            ),
        };
        let from = self
            .from
            .as_deref()
            .map(|s| parse_time("from", s))
            .transpose()?;
        let to = self
            .to
            .as_deref()
            .map(|s| parse_time("to", s))
            .transpose()?;
        if let (Some(f), Some(t)) = (from, to) {
            if f >= t {
                return Err(GatewayError::bad_request(format!(
                    "`from` ({f}) must be before `to` ({t})"
                )));
            }
        }
        Ok(UsageQuery {
            tenant,
            from_hour: from.map(|f| f / 3600),
            to_hour: to.map(|t| t.div_ceil(3600)),
        })
    }
}

/// `GET /admin/v1/usage?tenant=&from=&to=&format=json|csv`.
pub async fn export(
    State(state): State<Shared>,
    Query(pairs): Query<Vec<(String, String)>>,
) -> Result<Response> {
    let mut params = UsageParams::default();
    let mut format = Format::Json;
    let mut seen = std::collections::HashSet::new();
    for (name, value) in pairs {
        if !seen.insert(name.clone()) {
            return Err(GatewayError::bad_request(format!(
                "query parameter `{name}` is given twice"
            )));
        }
        match name.as_str() {
            "tenant" => params.tenant = Some(value),
            "from" => params.from = Some(value),
            "to" => params.to = Some(value),
            "format" => {
                format = match value.as_str() {
                    "json" => Format::Json,
                    "csv" => Format::Csv,
                    _ => {
                        return Err(GatewayError::bad_request(format!(
                            "`format` must be json or csv, got `{value}`"
                        )))
                    }
                }
            }
            _ => {
                return Err(GatewayError::bad_request(format!(
                "unknown query parameter `{name}`; the parameters are tenant, from, to and format"
            )))
            }
        }
    }
    let store = state.registry.store().clone();
    let report = tokio::task::spawn_blocking(move || -> Result<UsageReport> {
        let q = params.query(&store)?;
        Ok(store.usage_report(&q)?)
    })
    .await
    .map_err(|e| GatewayError::Internal(format!("usage task: {e}")))??;
    Ok(render(&report, format))
}

fn render(report: &UsageReport, format: Format) -> Response {
    match format {
        Format::Json => Json(report_json(report)).into_response(),
        Format::Csv => {
            let mut resp = to_csv(report).into_response();
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/csv; charset=utf-8"),
            );
            resp
        }
    }
}

/// `{"object": "usage.list", "ledgers": [ids], "data": [rows], "totals": {…}}`.
pub fn report_json(report: &UsageReport) -> serde_json::Value {
    serde_json::json!({"object": "usage.list", "ledgers": report.ledgers, "data": report.data,
        "totals": report.totals})
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
