//! Declarative tenants files: the whole set of tenants in one TOML file, applied by
//! `TenantStore::apply` (`superinfer tenants apply -f FILE`, and `superinfer serve
//! --tenants-file FILE` at start and on SIGHUP).
//!
//! ```toml
//! [[tenant]]
//! name = "acme"
//! api_key_sha256 = "9f86d081…"   # hex SHA-256 of the key, as the store keeps it
//! weight = 2
//! ttft_ms = 2000
//!
//! [[tenant]]
//! name = "beta"
//! api_key_env = "BETA_KEY"       # the key itself, read from the environment at apply time
//! ```
//!
//! Every other key is named after the `superinfer tenants create` flag it sets; a key left
//! out takes that flag's default, also when the tenant already exists (the file states each
//! tenant whole). A plain-text key (`api_key`, or a value that is a key) is refused, as are
//! duplicate names, two tenants with one key, and unknown keys. The file is parsed and
//! validated as a whole before anything is written: one bad entry applies nothing.

use serde::de::IgnoredAny;
use serde::Deserialize;
use std::collections::HashMap;
use std::path::Path;

use crate::error::{Result, TenantError};
use crate::key::{is_well_formed, KeyHash, KEY_PREFIX};
use crate::model::{NewTenant, QuotasPatch, SloPatch, TenantId, TenantPatch, ValidNewTenant};

#[cfg(test)]
mod tests;

/// A parsed, validated tenants file: each tenant's settings and its key's hash.
#[derive(Clone, Debug)]
pub struct TenantsFile {
    pub(crate) tenants: Vec<FileTenant>,
}

#[derive(Clone, Debug)]
pub(crate) struct FileTenant {
    pub new: ValidNewTenant,
    pub key: KeyHash,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Document {
    tenant: Vec<Entry>,
}

/// One `[[tenant]]` table: the `tenants create` flags in snake_case, and the key.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    api_key_sha256: Option<String>,
    api_key_env: Option<String>,
    /// Only to refuse it by name: a key in plain text does not belong in a file.
    api_key: Option<IgnoredAny>,
    ttft_ms: Option<u32>,
    tbt_ms: Option<u32>,
    queue_deadline_ms: Option<u32>,
    weight: Option<f64>,
    requests_per_s: Option<f64>,
    burst: Option<u32>,
    tokens_per_min: Option<u64>,
    max_concurrent: Option<u32>,
    max_prompt_tokens: Option<u32>,
    max_output_tokens: Option<u32>,
    enabled: Option<bool>,
    cache_namespace: Option<String>,
}

impl TenantsFile {
    /// Reads and validates the file at `path`; `api_key_env` names are read from this
    /// process's environment.
    pub fn load(path: &Path) -> Result<TenantsFile> {
        let label = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| TenantError::File(format!("{label}: cannot read it: {e}")))?;
        TenantsFile::parse(&label, &text, |var| std::env::var(var).ok())
    }

    /// Parses and validates TOML `text`; `label` names the file in errors, `env` looks up
    /// the variables that `api_key_env` names.
    pub fn parse(
        label: &str,
        text: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<TenantsFile> {
        let err = |reason: String| TenantError::File(format!("{label}: {reason}"));
        let doc: Document = toml::from_str(text).map_err(|e| err(e.to_string()))?;
        let mut names: HashMap<String, usize> = HashMap::new();
        let mut keys: HashMap<KeyHash, String> = HashMap::new();
        let mut tenants = Vec::with_capacity(doc.tenant.len());
        for (i, entry) in doc.tenant.into_iter().enumerate() {
            let at = format!("tenant `{}` (entry {})", entry.name, i + 1);
            if let Some(first) = names.insert(entry.name.clone(), i + 1) {
                return Err(err(format!(
                    "tenant `{}` is named twice (entries {first} and {}); names must be unique",
                    entry.name,
                    i + 1
                )));
            }
            let key = entry.key(&env).map_err(|r| err(format!("{at}: {r}")))?;
            if let Some(other) = keys.insert(key, entry.name.clone()) {
                return Err(err(format!(
                    "{at}: has the same API key as tenant `{other}`; each tenant needs its own"
                )));
            }
            let new = entry.settings().map_err(|e| match e {
                // The file's keys are the flags' names, without the JSON nesting.
                TenantError::Invalid { field, reason } => {
                    let key = field.rsplit('.').next().unwrap_or(field);
                    err(format!("{at}: invalid `{key}`: {reason}"))
                }
                e => err(format!("{at}: {e}")),
            })?;
            tenants.push(FileTenant { new, key });
        }
        Ok(TenantsFile { tenants })
    }

    /// The names the file gives, in file order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tenants.iter().map(|t| t.new.get().name.as_str())
    }

    pub fn len(&self) -> usize {
        self.tenants.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tenants.is_empty()
    }
}

impl Entry {
    /// The hash of the tenant's key: given as hex, or of the key read from the environment.
    fn key(&self, env: &impl Fn(&str) -> Option<String>) -> std::result::Result<KeyHash, String> {
        const PLAIN: &str = "a plain-text API key does not belong in a file; give \
                             `api_key_sha256` (hex SHA-256 of the key) or `api_key_env` \
                             (a variable that holds the key)";
        if self.api_key.is_some() {
            return Err(format!("`api_key`: {PLAIN}"));
        }
        match (&self.api_key_sha256, &self.api_key_env) {
            (Some(_), Some(_)) => {
                Err("give one of `api_key_sha256` and `api_key_env`, not both".into())
            }
            (None, None) => Err("needs `api_key_sha256` or `api_key_env`".into()),
            (Some(hex), None) => {
                if hex.starts_with(KEY_PREFIX) {
                    return Err(format!(
                        "`api_key_sha256` holds a key, not its hash: {PLAIN}"
                    ));
                }
                KeyHash::from_hex(hex).ok_or_else(|| {
                    format!(
                        "`api_key_sha256` must be 64 hex digits (the SHA-256 of the key), got {} characters",
                        hex.chars().count()
                    )
                })
            }
            (None, Some(var)) => {
                if var.starts_with(KEY_PREFIX) {
                    return Err(format!(
                        "`api_key_env` holds a key, not a variable name: {PLAIN}"
                    ));
                }
                let key = env(var).ok_or_else(|| {
                    format!("`api_key_env`: the environment variable `{var}` is not set")
                })?;
                if !is_well_formed(key.trim()) {
                    return Err(format!(
                        "`api_key_env`: `{var}` does not hold a superinfer key \
                         (`{KEY_PREFIX}` + 64 lowercase hex digits)"
                    ));
                }
                Ok(KeyHash::of(key.trim()))
            }
        }
    }

    /// The tenant's settings: `tenants create`'s defaults with the entry's keys applied, and
    /// validated as `create` validates them.
    fn settings(&self) -> Result<ValidNewTenant> {
        let base = NewTenant::named(self.name.clone())
            .validate()?
            .into_tenant(TenantId(0), 0);
        let quotas = QuotasPatch {
            requests_per_s: self.requests_per_s,
            burst: self.burst,
            tokens_per_min: self.tokens_per_min,
            max_concurrent: self.max_concurrent,
            max_prompt_tokens: self.max_prompt_tokens,
            max_output_tokens: self.max_output_tokens,
        };
        let patch = TenantPatch {
            name: None,
            slo: Some(SloPatch {
                ttft_ms: self.ttft_ms,
                tbt_ms: self.tbt_ms,
                queue_deadline_ms: self.queue_deadline_ms,
            }),
            weight: self.weight,
            quotas: Some(quotas),
            enabled: self.enabled,
            cache_namespace: self.cache_namespace.clone().map(Some),
        };
        let t = patch.apply(&base)?;
        NewTenant {
            name: t.name,
            slo: t.slo,
            weight: t.weight,
            quotas: t.quotas,
            enabled: t.enabled,
            cache_namespace: t.cache_namespace,
        }
        .validate()
    }
}
