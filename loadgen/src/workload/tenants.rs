//! Tenants: who sends requests, how fast, how long, and what they were promised.
//!
//! A tenants file is TOML with one `[[tenant]]` table per tenant; the schema is in
//! `docs/WORKLOADS.md`.

use super::arrivals::ArrivalSpec;
use super::conversation::ConversationSpec;
use super::lengths::{self, LengthLimits, LengthSpec};
use crate::error::Error;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::fmt;

/// One tenant of a workload.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantSpec {
    pub name: String,
    /// Relative share of service the tenant is entitled to (> 0). Default 1.
    #[serde(default = "default_weight")]
    pub weight: f64,
    /// Time-to-first-token SLO in seconds (> 0). Default 5 (the paper's).
    #[serde(default = "default_ttft")]
    pub ttft_slo_s: f64,
    /// Time-between-tokens SLO in seconds (> 0). Default 0.1 (the paper's).
    #[serde(default = "default_tbt")]
    pub tbt_slo_s: f64,
    /// Prompt and output lengths: a name or a table. Absent in a replay workload (the rows
    /// give them).
    #[serde(
        deserialize_with = "lengths::deserialize_dataset",
        default = "replay_dataset",
        skip_serializing_if = "LengthSpec::is_replay"
    )]
    pub dataset: LengthSpec,
    /// Absent in a replay workload (the rows give them).
    #[serde(
        default = "ArrivalSpec::replay",
        skip_serializing_if = "ArrivalSpec::is_replay"
    )]
    pub arrivals: ArrivalSpec,
    /// Key the HTTP target sends for this tenant. Prefer `api_key_env`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    /// Name of an environment variable that holds the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// Prompts are clipped to `1..=max_prompt_tokens`. Default 4096.
    #[serde(default = "default_max_prompt")]
    pub max_prompt_tokens: u32,
    /// Outputs are clipped to `1..=max_output_tokens`. Default 2048.
    #[serde(default = "default_max_output")]
    pub max_output_tokens: u32,
    /// Every prompt of the tenant starts with the same system prompt of this many tokens.
    /// Default 0 (none).
    #[serde(default)]
    pub system_prompt_tokens: u32,
    /// Tenants with the same key send the same system prompt content; default: the name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt_key: Option<String>,
    /// Multi-turn conversations; `None`: every request is a single turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<ConversationSpec>,
}

fn replay_dataset() -> LengthSpec {
    LengthSpec::Replay
}

fn default_weight() -> f64 {
    1.0
}
fn default_ttft() -> f64 {
    5.0
}
fn default_tbt() -> f64 {
    0.1
}
fn default_max_prompt() -> u32 {
    LengthLimits::default().max_prompt_tokens
}
fn default_max_output() -> u32 {
    LengthLimits::default().max_output_tokens
}

/// The key itself never appears in logs or panics.
impl fmt::Debug for TenantSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TenantSpec")
            .field("name", &self.name)
            .field("weight", &self.weight)
            .field("ttft_slo_s", &self.ttft_slo_s)
            .field("tbt_slo_s", &self.tbt_slo_s)
            .field("dataset", &self.dataset)
            .field("arrivals", &self.arrivals)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("api_key_env", &self.api_key_env)
            .field("max_prompt_tokens", &self.max_prompt_tokens)
            .field("max_output_tokens", &self.max_output_tokens)
            .field("system_prompt_tokens", &self.system_prompt_tokens)
            .field("system_prompt_key", &self.system_prompt_key)
            .field("conversation", &self.conversation)
            .finish()
    }
}

impl TenantSpec {
    /// A tenant with the paper's SLOs, weight 1 and the default clipping.
    pub fn new(name: impl Into<String>, dataset: LengthSpec, arrivals: ArrivalSpec) -> TenantSpec {
        TenantSpec {
            name: name.into(),
            weight: default_weight(),
            ttft_slo_s: default_ttft(),
            tbt_slo_s: default_tbt(),
            dataset,
            arrivals,
            api_key: None,
            api_key_env: None,
            max_prompt_tokens: default_max_prompt(),
            max_output_tokens: default_max_output(),
            system_prompt_tokens: 0,
            system_prompt_key: None,
            conversation: None,
        }
    }

    /// Seed of the tenant's system prompt content.
    pub fn system_seed(&self) -> u64 {
        super::conversation::text_seed(self.system_prompt_key.as_deref().unwrap_or(&self.name))
    }

    pub fn limits(&self) -> LengthLimits {
        LengthLimits {
            max_prompt_tokens: self.max_prompt_tokens,
            max_output_tokens: self.max_output_tokens,
        }
    }

    /// Checks this tenant alone: positive weight and SLOs, a valid arrival process, at most
    /// one key source. (The dataset is checked when its sampler is built.)
    pub fn validate(&self) -> Result<(), Error> {
        let field = |field, problem: String| Error::TenantField {
            tenant: self.name.clone(),
            field,
            problem,
        };
        if self.name.trim().is_empty() {
            return Err(field("name", "must not be empty".into()));
        }
        for (name, v) in [
            ("weight", self.weight),
            ("ttft_slo_s", self.ttft_slo_s),
            ("tbt_slo_s", self.tbt_slo_s),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(field(name, format!("must be positive and finite, got {v}")));
            }
        }
        for (name, v) in [
            ("max_prompt_tokens", self.max_prompt_tokens),
            ("max_output_tokens", self.max_output_tokens),
        ] {
            if v == 0 {
                return Err(field(name, "must be at least 1".into()));
            }
        }
        if self.system_prompt_tokens >= self.max_prompt_tokens {
            return Err(field(
                "system_prompt_tokens",
                format!(
                    "must be below max_prompt_tokens ({}), got {}",
                    self.max_prompt_tokens, self.system_prompt_tokens
                ),
            ));
        }
        if let Some(c) = &self.conversation {
            c.validate().map_err(|e| e.in_tenant(&self.name))?;
        }
        if self.api_key.is_some() && self.api_key_env.is_some() {
            return Err(field(
                "api_key",
                "and api_key_env are exclusive: set one".into(),
            ));
        }
        self.arrivals
            .validate()
            .map_err(|e| e.in_tenant(&self.name))
    }
}

/// Checks a whole workload: at least one tenant, unique names, each tenant valid.
pub fn validate_tenants(tenants: &[TenantSpec]) -> Result<(), Error> {
    if tenants.is_empty() {
        return Err(Error::NoTenants);
    }
    let mut seen = HashSet::new();
    for t in tenants {
        t.validate()?;
        if !seen.insert(t.name.as_str()) {
            return Err(Error::DuplicateTenant(t.name.clone()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
