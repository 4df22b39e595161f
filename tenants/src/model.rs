//! The data model: tenants, their SLOs, weights and quotas, and the inputs that create or change
//! them. Inputs are parsed once into validated values (`NewTenant::validate` →
//! [`ValidNewTenant`], `TenantPatch::apply`); the store accepts nothing else.

mod terms;
mod validate;

#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};
use std::fmt;

use crate::error::Result;

pub use crate::id::TenantId;
pub use terms::{Quotas, Slo};
pub use validate::{
    MAX_CACHE_NAMESPACE_CHARS, MAX_NAME_CHARS, MAX_TBT_MS, MAX_TTFT_MS, MAX_WEIGHT, MIN_WEIGHT,
};

/// How an admin path or a CLI argument names a tenant: all digits is an id, anything else a
/// name. Names cannot be all digits, so the two never meet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TenantRef {
    Id(TenantId),
    /// All digits, but too large for an id: no tenant has it.
    NoSuchId(String),
    Name(String),
}

impl TenantRef {
    pub fn parse(s: &str) -> TenantRef {
        if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
            match s.parse::<u32>() {
                Ok(id) => TenantRef::Id(TenantId(id)),
                Err(_) => TenantRef::NoSuchId(s.to_string()),
            }
        } else {
            TenantRef::Name(s.to_string())
        }
    }
}

impl fmt::Display for TenantRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TenantRef::Id(id) => write!(f, "with id {id}"),
            TenantRef::NoSuchId(s) => write!(f, "with id {s}"),
            TenantRef::Name(n) => write!(f, "named `{n}`"),
        }
    }
}

/// One tenant as stored. The API key is not here: only its hash is kept, beside the record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tenant {
    pub id: TenantId,
    pub name: String,
    pub slo: Slo,
    /// Share of service relative to other tenants (weighted LVF); > 0.
    pub weight: f64,
    pub quotas: Quotas,
    /// A disabled tenant keeps its key and settings but is refused service (HTTP 403).
    pub enabled: bool,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    /// A prefix-cache namespace shared on purpose: tenants with the same name reuse each
    /// other's cached prompt blocks. `None`: the tenant's own namespace (schema version 2;
    /// absent in older records).
    #[serde(default)]
    pub cache_namespace: Option<String>,
}

impl Tenant {
    /// Checks every field as creation does (used on records read back from disk).
    pub fn validate(&self) -> Result<()> {
        validate::name(&self.name)?;
        validate::slo(&self.slo)?;
        validate::weight(self.weight)?;
        validate::quotas(&self.quotas)?;
        validate::cache_namespace(self.cache_namespace.as_deref())
    }
}

/// The input that creates a tenant (the admin API's `POST` body). Every field but `name` has a
/// default, so `{"name": "acme"}` is a complete request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewTenant {
    pub name: String,
    #[serde(default)]
    pub slo: Slo,
    #[serde(default = "default_weight")]
    pub weight: f64,
    #[serde(default)]
    pub quotas: Quotas,
    #[serde(default = "default_enabled")]
    pub enabled: bool,
    /// See [`Tenant::cache_namespace`].
    #[serde(default)]
    pub cache_namespace: Option<String>,
}

fn default_weight() -> f64 {
    1.0
}

fn default_enabled() -> bool {
    true
}

impl NewTenant {
    /// A tenant with this name and every other field at its default.
    pub fn named(name: impl Into<String>) -> Self {
        NewTenant {
            name: name.into(),
            slo: Slo::default(),
            weight: default_weight(),
            quotas: Quotas::default(),
            enabled: default_enabled(),
            cache_namespace: None,
        }
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(self) -> Result<ValidNewTenant> {
        validate::name(&self.name)?;
        validate::slo(&self.slo)?;
        validate::weight(self.weight)?;
        validate::quotas(&self.quotas)?;
        validate::cache_namespace(self.cache_namespace.as_deref())?;
        Ok(ValidNewTenant(self))
    }
}

/// A [`NewTenant`] whose fields passed validation; only [`NewTenant::validate`] makes one.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidNewTenant(NewTenant);

impl ValidNewTenant {
    pub fn get(&self) -> &NewTenant {
        &self.0
    }

    pub(crate) fn into_tenant(self, id: TenantId, created_at_ms: u64) -> Tenant {
        let NewTenant {
            name,
            slo,
            weight,
            quotas,
            enabled,
            cache_namespace,
        } = self.0;
        Tenant {
            id,
            name,
            slo,
            weight,
            quotas,
            enabled,
            created_at_ms,
            cache_namespace,
        }
    }
}

/// A partial update (the admin API's `PATCH` body): fields left out keep their values.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantPatch {
    pub name: Option<String>,
    pub slo: Option<SloPatch>,
    pub weight: Option<f64>,
    pub quotas: Option<QuotasPatch>,
    pub enabled: Option<bool>,
    /// Left out: unchanged; `null`: back to the tenant's own namespace; a name: that shared
    /// namespace.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub cache_namespace: Option<Option<String>>,
}

/// A field that is present, `null` included (`Some(None)`); absent fields stay `None` through
/// `#[serde(default)]`.
fn present<'de, D, T>(d: D) -> std::result::Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// The fields of [`Slo`], each optional.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SloPatch {
    pub ttft_ms: Option<u32>,
    pub tbt_ms: Option<u32>,
    /// The tenant's own queue deadline; 0 sets it back to the node's.
    pub queue_deadline_ms: Option<u32>,
}

/// The fields of [`Quotas`], each optional.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QuotasPatch {
    pub requests_per_s: Option<f64>,
    pub burst: Option<u32>,
    pub tokens_per_min: Option<u64>,
    pub max_concurrent: Option<u32>,
    pub max_prompt_tokens: Option<u32>,
    pub max_output_tokens: Option<u32>,
}

impl TenantPatch {
    /// True when the patch changes nothing.
    pub fn is_empty(&self) -> bool {
        *self == TenantPatch::default()
    }

    /// The tenant with this patch applied, validated as a whole. `id` and `created_at_ms`
    /// never change.
    pub fn apply(&self, tenant: &Tenant) -> Result<Tenant> {
        let mut out = tenant.clone();
        if let Some(name) = &self.name {
            validate::name(name)?;
            out.name = name.clone();
        }
        if let Some(p) = self.slo {
            out.slo.ttft_ms = p.ttft_ms.unwrap_or(out.slo.ttft_ms);
            out.slo.tbt_ms = p.tbt_ms.unwrap_or(out.slo.tbt_ms);
            if let Some(ms) = p.queue_deadline_ms {
                out.slo.queue_deadline_ms = (ms > 0).then_some(ms);
            }
        }
        if let Some(weight) = self.weight {
            out.weight = weight;
        }
        if let Some(p) = self.quotas {
            p.apply_to(&mut out.quotas);
        }
        if let Some(enabled) = self.enabled {
            out.enabled = enabled;
        }
        if let Some(ns) = &self.cache_namespace {
            out.cache_namespace = ns.clone();
        }
        validate::slo(&out.slo)?;
        validate::weight(out.weight)?;
        validate::quotas(&out.quotas)?;
        validate::cache_namespace(out.cache_namespace.as_deref())?;
        Ok(out)
    }
}

impl QuotasPatch {
    fn apply_to(&self, q: &mut Quotas) {
        q.requests_per_s = self.requests_per_s.unwrap_or(q.requests_per_s);
        q.burst = self.burst.unwrap_or(q.burst);
        q.tokens_per_min = self.tokens_per_min.unwrap_or(q.tokens_per_min);
        q.max_concurrent = self.max_concurrent.unwrap_or(q.max_concurrent);
        q.max_prompt_tokens = self.max_prompt_tokens.unwrap_or(q.max_prompt_tokens);
        q.max_output_tokens = self.max_output_tokens.unwrap_or(q.max_output_tokens);
    }
}
