//! Field checks shared by creation and patching. Each error names the field as the admin API
//! spells it and says what a valid value looks like.

use super::terms::{Quotas, Slo};
use crate::error::{Result, TenantError};

/// Longest tenant name, in characters.
pub const MAX_NAME_CHARS: usize = 64;
/// Longest shared prefix-cache namespace name, in characters.
pub const MAX_CACHE_NAMESPACE_CHARS: usize = 64;
/// Largest TTFT SLO accepted: one hour (larger values are almost surely a unit mistake).
pub const MAX_TTFT_MS: u32 = 3_600_000;
/// Longest queue deadline accepted: ten times the longest TTFT SLO.
pub const MAX_QUEUE_DEADLINE_MS: u32 = 10 * MAX_TTFT_MS;
/// Largest TBT SLO accepted: one minute.
pub const MAX_TBT_MS: u32 = 60_000;
/// Smallest weight accepted. Weights are relative; the range bounds the ratio of two weights
/// to 1e4. Weighted LVF adds `cost / weight` to a per-tenant f64 counter that grows from zero
/// at each start, so a counter that grew at the smallest weight must still take a one-token
/// charge at the largest weight: with this range that holds until about 1e12 tokens were
/// served at the smallest weight, where 1e-30 beside 1e30 rounds the charge away at once.
pub const MIN_WEIGHT: f64 = 0.01;
/// Largest weight accepted (see [`MIN_WEIGHT`]).
pub const MAX_WEIGHT: f64 = 100.0;
/// Largest request rate accepted, requests per second.
const MAX_REQUESTS_PER_S: f64 = 1e6;

/// 1–`max` characters of `A-Z a-z 0-9 _ . -`, the first a letter or a digit: safe in logs,
/// metric labels, URLs and file names, and never `.`, `..`, a hidden file or a CLI flag.
fn plain(field: &'static str, value: &str, max: usize) -> Result<()> {
    let chars = value.chars().count();
    if chars > max {
        return Err(TenantError::invalid(
            field,
            format!("is {chars} characters long; at most {max} are allowed"),
        ));
    }
    if let Some(c) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
    {
        return Err(TenantError::invalid(
            field,
            format!("contains {c:?}; use only letters A-Z a-z, digits, '_', '.' and '-'"),
        ));
    }
    if !value.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err(TenantError::invalid(
            field,
            format!("`{value}` does not start with a letter or a digit"),
        ));
    }
    Ok(())
}

pub(crate) fn name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(TenantError::invalid("name", "must not be empty"));
    }
    plain("name", name, MAX_NAME_CHARS)?;
    if name.bytes().all(|b| b.is_ascii_digit()) {
        // Paths and CLI arguments take an id or a name; all digits is always an id.
        return Err(TenantError::invalid(
            "name",
            format!("`{name}` is all digits, which reads as a tenant id; add a letter"),
        ));
    }
    Ok(())
}

/// A shared prefix-cache namespace: the same rule as tenant names but for all digits.
pub(crate) fn cache_namespace(ns: Option<&str>) -> Result<()> {
    let Some(ns) = ns else { return Ok(()) };
    const FIELD: &str = "cache_namespace";
    if ns.is_empty() {
        return Err(TenantError::invalid(
            FIELD,
            "must not be empty; use null for the tenant's own namespace",
        ));
    }
    plain(FIELD, ns, MAX_CACHE_NAMESPACE_CHARS)
}

pub(crate) fn slo(slo: &Slo) -> Result<()> {
    in_range("slo.ttft_ms", slo.ttft_ms, MAX_TTFT_MS)?;
    in_range("slo.tbt_ms", slo.tbt_ms, MAX_TBT_MS)?;
    if let Some(ms) = slo.queue_deadline_ms {
        in_range("slo.queue_deadline_ms", ms, MAX_QUEUE_DEADLINE_MS)?;
        if ms < slo.ttft_ms {
            return Err(TenantError::invalid(
                "slo.queue_deadline_ms",
                format!(
                    "is {ms}; it must be at least slo.ttft_ms ({}): a request shed before its \
                     TTFT target could still have met it",
                    slo.ttft_ms
                ),
            ));
        }
    }
    Ok(())
}

pub(crate) fn weight(weight: f64) -> Result<()> {
    // NaN is in no range, so it is refused here too.
    if !(MIN_WEIGHT..=MAX_WEIGHT).contains(&weight) {
        return Err(TenantError::invalid(
            "weight",
            format!(
                "is {weight:?}; it must be a number in [{MIN_WEIGHT}, {MAX_WEIGHT}] (weights \
                 are relative: 1 is the default)"
            ),
        ));
    }
    Ok(())
}

pub(crate) fn quotas(q: &Quotas) -> Result<()> {
    positive_finite(
        "quotas.requests_per_s",
        q.requests_per_s,
        MAX_REQUESTS_PER_S,
    )?;
    at_least_one("quotas.burst", q.burst)?;
    at_least_one("quotas.tokens_per_min", q.tokens_per_min)?;
    at_least_one("quotas.max_concurrent", q.max_concurrent)?;
    at_least_one("quotas.max_prompt_tokens", q.max_prompt_tokens)?;
    at_least_one("quotas.max_output_tokens", q.max_output_tokens)
}

/// For unsigned integers: zero is the only value below 1.
fn at_least_one<T>(field: &'static str, value: T) -> Result<()>
where
    T: Copy + PartialOrd + Default + std::fmt::Display,
{
    if value <= T::default() {
        return Err(TenantError::invalid(
            field,
            format!("is {value}; it must be at least 1"),
        ));
    }
    Ok(())
}

fn in_range<T>(field: &'static str, value: T, max: T) -> Result<()>
where
    T: Copy + PartialOrd + Default + std::fmt::Display,
{
    at_least_one(field, value)?;
    if value > max {
        return Err(TenantError::invalid(
            field,
            format!("is {value}; it must be at most {max}"),
        ));
    }
    Ok(())
}

fn positive_finite(field: &'static str, value: f64, max: f64) -> Result<()> {
    if !value.is_finite() || value <= 0.0 {
        return Err(TenantError::invalid(
            field,
            format!("is {value}; it must be a finite number greater than 0"),
        ));
    }
    if value > max {
        return Err(TenantError::invalid(
            field,
            format!("is {value}; it must be at most {max}"),
        ));
    }
    Ok(())
}
