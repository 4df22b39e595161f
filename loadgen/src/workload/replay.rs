//! Replay of a production trace: every row of the window is one request, in order, at its own
//! (scaled) time, with its own prompt and output lengths; rows that share Mooncake `hash_ids`
//! share exactly those prompt blocks.
//!
//! A replay workload file is a tenants file with a `[replay]` table ([`ReplaySpec`]); its
//! `[[tenant]]` tables give names, weights, SLOs and keys but no `arrivals` or `dataset`
//! (both come from the trace). `docs/WORKLOADS.md` has the options.

use super::request::RequestSpec;
use super::tenants::TenantSpec;
use super::trace::{self, TraceFile, TraceFormat, TraceRow};
use crate::error::Error;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// How rows are given to tenants.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Assign {
    /// Row k goes to tenant k mod N.
    #[default]
    RoundRobin,
    /// A row goes to tenant hash(value of this column) mod N, so rows with equal values (one
    /// user, one conversation) stay together. For `hash_ids` the first id is hashed: rows that
    /// start with the same block (one conversation) go to one tenant.
    Hash(String),
    /// Every row goes to the tenant of this name.
    One(String),
}

impl FromStr for Assign {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s == "round-robin" {
            return Ok(Assign::RoundRobin);
        }
        match s.split_once(':') {
            Some(("hash", c)) if !c.is_empty() => Ok(Assign::Hash(c.into())),
            Some(("one", t)) if !t.is_empty() => Ok(Assign::One(t.into())),
            _ => Err(format!(
                "assign '{s}': expected round-robin, hash:COLUMN or one:TENANT"
            )),
        }
    }
}

impl TryFrom<String> for Assign {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<Assign> for String {
    fn from(a: Assign) -> String {
        a.to_string()
    }
}

impl fmt::Display for Assign {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Assign::RoundRobin => f.write_str("round-robin"),
            Assign::Hash(c) => write!(f, "hash:{c}"),
            Assign::One(t) => write!(f, "one:{t}"),
        }
    }
}

/// The `[replay]` table of a workload file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplaySpec {
    /// The trace file; relative to the workload file's folder.
    pub path: PathBuf,
    /// `None`: detected from the file's first line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<TraceFormat>,
    /// Trace times are multiplied by this (0.5 replays twice as fast).
    #[serde(default = "one")]
    pub time_scale: f64,
    /// The window replayed, in trace seconds after the first row: rows with `start_s <= t <
    /// start_s + duration_s`.
    #[serde(default)]
    pub start_s: f64,
    /// `None`: to the end of the trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_s: Option<f64>,
    /// Rows with longer prompts are counted and reported, not sent; `None`: the target's
    /// context (the served model's `max_model_len`; the twin's HBM KV tier).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_prompt_tokens: Option<u32>,
    #[serde(default)]
    pub assign: Assign,
    /// Tokens per hash id (the publishers' block size).
    #[serde(default = "default_block_tokens")]
    pub block_tokens: u32,
    /// Rows that share a timestamp are spread evenly over one step of the timestamps'
    /// resolution (Mooncake: 1 ms; its conversation trace: 3 s) instead of arriving at once.
    #[serde(default = "yes")]
    pub spread_ties: bool,
    /// Tenants that take no share of the rows but replay a copy of the trace of their own,
    /// at this multiple of the run's rate: the rows of a window this many times as long
    /// (wrapping to the trace's first row at its end), compressed into the run's window. A
    /// flood of the same traffic beside tenants that share the rows at 1x
    /// (`loadgen/workloads/replay/azure-conv-flood.toml`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub copies: BTreeMap<String, f64>,
}

fn one() -> f64 {
    1.0
}
fn yes() -> bool {
    true
}
fn default_block_tokens() -> u32 {
    512
}

impl ReplaySpec {
    pub fn new(path: impl Into<PathBuf>) -> ReplaySpec {
        ReplaySpec {
            path: path.into(),
            format: None,
            time_scale: 1.0,
            start_s: 0.0,
            duration_s: None,
            max_prompt_tokens: None,
            assign: Assign::default(),
            block_tokens: default_block_tokens(),
            spread_ties: true,
            copies: BTreeMap::new(),
        }
    }

    pub fn validate(&self) -> Result<(), Error> {
        let bad = |problem: String| Error::Usage(format!("replay: {problem}"));
        if !(self.time_scale.is_finite() && self.time_scale > 0.0) {
            return Err(bad(format!(
                "time_scale must be positive, got {}",
                self.time_scale
            )));
        }
        if !(self.start_s.is_finite() && self.start_s >= 0.0) {
            return Err(bad(format!("start_s must be >= 0, got {}", self.start_s)));
        }
        if let Some(d) = self.duration_s.filter(|d| !(d.is_finite() && *d > 0.0)) {
            return Err(bad(format!("duration_s must be positive, got {d}")));
        }
        if let Some((t, k)) = self
            .copies
            .iter()
            .find(|(_, k)| !(k.is_finite() && **k > 0.0))
        {
            return Err(bad(format!(
                "copies: tenant '{t}' needs a positive rate multiple, got {k}"
            )));
        }
        if self.block_tokens == 0 || self.max_prompt_tokens == Some(0) {
            return Err(bad(
                "block_tokens and max_prompt_tokens must be at least 1".into()
            ));
        }
        Ok(())
    }

    /// The column tenants are assigned by, if any.
    fn key_column(&self) -> Option<&str> {
        match &self.assign {
            Assign::Hash(c) => Some(c),
            _ => None,
        }
    }

    /// Reads the trace (relative paths: against `dir`).
    pub fn read(&self, dir: &Path) -> Result<TraceFile, Error> {
        self.validate()?;
        trace::read(&dir.join(&self.path), self.format, self.key_column())
    }
}

/// What a replay left out, and what it is: for the report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReplayInfo {
    pub path: String,
    pub format: TraceFormat,
    pub sha256: String,
    pub rows_in_file: u64,
    /// Rows inside the window (before the cap).
    pub rows_in_window: u64,
    /// Rows of the window whose prompt is above the cap: counted, not sent.
    pub over_cap: u64,
    pub max_prompt_tokens: Option<u32>,
    /// The longest prompt among the rows over the cap.
    pub longest_over_cap: u32,
    /// Rows with no output (failed in the trace) or no prompt: not sent.
    pub empty: u64,
    /// Rows that shared their timestamp with another and were spread over `resolution_s`.
    pub spread: u64,
    pub resolution_s: f64,
    pub time_scale: f64,
    pub rate_scale: f64,
    /// Trace seconds of the window, and of the run (after scaling).
    pub window_s: f64,
    pub run_s: f64,
    pub assign: String,
    pub block_tokens: u32,
}

/// One load of a replay: the requests and what was left out.
#[derive(Clone, Debug)]
pub struct Replay {
    pub requests: Vec<RequestSpec>,
    pub info: ReplayInfo,
}

/// Builds the requests of one replay at `rate_scale` (2: twice the trace's rate, same shape).
/// `cap`: the prompt cap when the spec has none.
pub fn build(
    spec: &ReplaySpec,
    file: &TraceFile,
    tenants: &[TenantSpec],
    rate_scale: f64,
    cap: Option<u32>,
) -> Result<Replay, Error> {
    spec.validate()?;
    if !(rate_scale.is_finite() && rate_scale > 0.0) {
        return Err(Error::Usage(format!(
            "rate scale must be positive, got {rate_scale}"
        )));
    }
    let cap = spec.max_prompt_tokens.or(cap);
    // The tenants the rows go to: those without load of their own.
    let takers: Vec<usize> = (0..tenants.len())
        .filter(|&i| tenants[i].arrivals.is_replay() && !spec.copies.contains_key(&tenants[i].name))
        .collect();
    let copies = copies::copy_tenants(&spec.copies, tenants)?;
    if takers.is_empty() {
        return Err(Error::Usage(
            "replay: every tenant sends load of its own (arrivals and dataset); at least one \
             must take the trace's rows"
                .into(),
        ));
    }
    let one = match &spec.assign {
        Assign::One(name) => Some(
            takers
                .iter()
                .copied()
                .find(|&i| &tenants[i].name == name)
                .ok_or_else(|| {
                    Error::Usage(format!(
                        "replay: assign names tenant '{name}', which is not defined or sends \
                         load of its own"
                    ))
                })?,
        ),
        _ => None,
    };
    let end = spec.duration_s.map_or(f64::INFINITY, |d| spec.start_s + d);
    let times = spread_times(&file.rows, spec.spread_ties, file.resolution_s);
    let mut order: Vec<usize> = (0..file.rows.len()).collect();
    order.sort_by(|&a, &b| times[a].total_cmp(&times[b]));
    let scale = spec.time_scale / rate_scale;
    let mut info = ReplayInfo {
        path: file.path.display().to_string(),
        format: file.format,
        sha256: file.sha256.clone(),
        rows_in_file: file.rows.len() as u64,
        rows_in_window: 0,
        over_cap: 0,
        max_prompt_tokens: cap,
        longest_over_cap: 0,
        empty: 0,
        spread: times
            .iter()
            .zip(&file.rows)
            .filter(|(t, r)| **t != r.time_s)
            .count() as u64,
        resolution_s: file.resolution_s,
        time_scale: spec.time_scale,
        rate_scale,
        window_s: 0.0,
        run_s: 0.0,
        assign: spec.assign.to_string(),
        block_tokens: spec.block_tokens,
    };
    let mut requests = Vec::new();
    let mut last = spec.start_s;
    for (k, &i) in order
        .iter()
        .filter(|&&i| (spec.start_s..end).contains(&times[i]))
        .enumerate()
    {
        let row = &file.rows[i];
        info.rows_in_window += 1;
        last = last.max(times[i]);
        if row.output_tokens == 0 || row.prompt_tokens == 0 {
            info.empty += 1;
            continue;
        }
        if row::over_cap(row, cap) {
            info.over_cap += 1;
            info.longest_over_cap = info.longest_over_cap.max(row.prompt_tokens);
            continue;
        }
        let n = takers.len();
        let tenant = one.unwrap_or_else(|| match &row.key {
            Some(key) => takers[(super::conversation::text_seed(key) % n as u64) as usize],
            None => takers[k % n],
        });
        let seed = super::conversation::text_seed(&format!("trace row {}", row.line));
        requests.push(row::request(
            row,
            spec.block_tokens,
            (tenant, (times[i] - spec.start_s) * scale),
            seed,
            requests.len(),
        ));
    }
    if info.rows_in_window == 0 {
        return Err(Error::Usage(format!(
            "replay: no row of {} is inside the window ({} s, {})",
            file.path.display(),
            spec.start_s,
            spec.duration_s
                .map_or("to the end".into(), |d| format!("{d} s")),
        )));
    }
    // The window: as asked, or to just past the last row (one resolution step, at least 1 ms).
    info.window_s = spec
        .duration_s
        .unwrap_or(last - spec.start_s + file.resolution_s.max(1e-3));
    info.run_s = info.window_s * scale;
    for (tenant, k) in copies {
        copies::push_copy(
            (file, &times, &order),
            (spec.start_s, spec.block_tokens),
            (tenant, k),
            (info.window_s, scale),
            cap,
            &mut requests,
        );
    }
    if !spec.copies.is_empty() {
        requests.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s).then(a.id.cmp(&b.id)));
        for (i, r) in requests.iter_mut().enumerate() {
            r.id = i as u64;
        }
    }
    Ok(Replay { requests, info })
}

/// Row times with ties spread: the k rows stamped `t` arrive at `t + j·resolution/k`.
fn spread_times(rows: &[TraceRow], spread: bool, resolution_s: f64) -> Vec<f64> {
    let mut times: Vec<f64> = rows.iter().map(|r| r.time_s).collect();
    if !spread || resolution_s <= 0.0 {
        return times;
    }
    let mut groups: std::collections::HashMap<u64, Vec<usize>> = Default::default();
    for (i, r) in rows.iter().enumerate() {
        groups.entry(r.time_s.to_bits()).or_default().push(i);
    }
    for members in groups.values().filter(|m| m.len() > 1) {
        let k = members.len() as f64;
        for (j, &i) in members.iter().enumerate() {
            times[i] += resolution_s * j as f64 / k;
        }
    }
    times
}

mod copies;
mod row;
#[cfg(test)]
mod tests;
