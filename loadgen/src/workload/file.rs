//! Workload files: TOML with one `[[tenant]]` table per tenant and, for a replay, a
//! `[replay]` table naming the trace (`docs/WORKLOADS.md`).

use super::replay::ReplaySpec;
use super::tenants::{validate_tenants, TenantSpec};
use crate::error::Error;
use serde::Deserialize;
use std::path::Path;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantsFile {
    #[serde(default)]
    tenant: Vec<TenantSpec>,
    #[serde(default)]
    replay: Option<ReplaySpec>,
}

/// A workload file: its tenants and, for a replay, the trace.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkloadFile {
    pub tenants: Vec<TenantSpec>,
    pub replay: Option<ReplaySpec>,
}

/// What a replay workload's tenant may say; the rest comes from the trace.
/// Keys a tenant of a replay workload takes besides [`REPLAY_TENANT_KEYS`] when it sends load
/// of its own (both `arrivals` and `dataset`).
const OWN_LOAD_KEYS: [&str; 5] = [
    "arrivals",
    "dataset",
    "max_prompt_tokens",
    "max_output_tokens",
    "system_prompt_tokens",
];

const REPLAY_TENANT_KEYS: [&str; 6] = [
    "name",
    "weight",
    "ttft_slo_s",
    "tbt_slo_s",
    "api_key",
    "api_key_env",
];

/// Parses and validates a workload file's TOML text; `origin` names the source in errors.
pub fn parse_workload(text: &str, origin: &Path) -> Result<WorkloadFile, Error> {
    let toml_error = |e| Error::Toml {
        path: origin.to_path_buf(),
        source: Box::new(e),
    };
    let file: TenantsFile = toml::from_str(text).map_err(toml_error)?;
    let named = |v: &toml::Value| {
        v.get("name")
            .and_then(|n| n.as_str())
            .unwrap_or("")
            .to_string()
    };
    if file.replay.is_some() {
        let raw: toml::Table = toml::from_str(text).map_err(toml_error)?;
        let tables = raw
            .get("tenant")
            .and_then(|t| t.as_array())
            .cloned()
            .unwrap_or_default();
        for t in &tables {
            let keys: Vec<&String> = t.as_table().into_iter().flat_map(|t| t.keys()).collect();
            let has = |k: &str| keys.iter().any(|x| x.as_str() == k);
            // A tenant with both `arrivals` and `dataset` sends load of its own beside the
            // trace (a chat tenant beside a replayed one); the others get the trace's rows.
            let own = has("arrivals") && has("dataset");
            let allowed =
                |k: &str| REPLAY_TENANT_KEYS.contains(&k) || (own && OWN_LOAD_KEYS.contains(&k));
            if let Some(k) = keys.iter().find(|k| !allowed(k.as_str())) {
                return Err(Error::Usage(format!(
                    "tenant '{}': {k} cannot be set in a replay workload (the trace's rows give \
                     arrivals and lengths); a tenant there takes {}, or `arrivals` and \
                     `dataset` together for load of its own beside the trace (no \
                     conversations)",
                    named(t),
                    REPLAY_TENANT_KEYS.join(", ")
                )));
            }
        }
    } else if let Some(t) = file
        .tenant
        .iter()
        .find(|t| t.arrivals.is_replay() || t.dataset.is_replay())
    {
        let field = if t.arrivals.is_replay() {
            "arrivals"
        } else {
            "dataset"
        };
        return Err(Error::TenantField {
            tenant: t.name.clone(),
            field,
            problem: "is missing (needed unless the file replays a trace with [replay])".into(),
        });
    }
    validate_tenants(&file.tenant)?;
    Ok(WorkloadFile {
        tenants: file.tenant,
        replay: file.replay,
    })
}

/// Parses and validates a tenants file without a `[replay]` table.
pub fn parse_tenants(text: &str, origin: &Path) -> Result<Vec<TenantSpec>, Error> {
    let w = parse_workload(text, origin)?;
    if w.replay.is_some() {
        return Err(Error::Usage(format!(
            "{}: this file replays a trace ([replay]); it is a workload, not a tenants list",
            origin.display()
        )));
    }
    Ok(w.tenants)
}

/// Reads a workload file. Relative trace paths inside it are resolved against its folder.
pub fn load_workload(path: &Path) -> Result<WorkloadFile, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let mut w = parse_workload(&text, path)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    for t in &mut w.tenants {
        t.arrivals.resolve_paths(dir);
        t.dataset.resolve_paths(dir);
    }
    if let Some(r) = &mut w.replay {
        if r.path.is_relative() {
            r.path = dir.join(&r.path);
        }
    }
    Ok(w)
}

/// Reads a tenants file (no `[replay]`). Relative trace paths are resolved against its folder.
pub fn load_tenants(path: &Path) -> Result<Vec<TenantSpec>, Error> {
    let w = load_workload(path)?;
    if w.replay.is_some() {
        return Err(Error::Usage(format!(
            "{}: this file replays a trace ([replay]); it is a workload, not a tenants list",
            path.display()
        )));
    }
    Ok(w.tenants)
}
