//! `superinfer tenants list|create|get|patch|delete|rotate-key|apply|usage`: the admin API's operations on
//! the data directory directly, for when the server is stopped (sled locks the directory, so
//! while it runs, use the admin API). Output is JSON; a new key is printed once. There is no
//! command to drop a prefix cache: the cache lives only in the running server's memory (it is
//! empty whenever this CLI can open the store), so `DELETE /admin/v1/tenants/{t}/prefix-cache`
//! is the way.
//!
//! Only `create` and `apply` make a store in a directory that has none (and say so on stderr);
//! every other command refuses such a directory, so a mistyped `--data-dir` is an error.

use anyhow::Context;
use clap::{Args, Subcommand};
use std::path::{Path, PathBuf};
use superinfer_tenants::{
    NewTenant, Quotas, QuotasPatch, Slo, SloPatch, Tenant, TenantError, TenantId, TenantPatch,
    TenantRef, TenantStore, TenantsFile,
};

#[derive(Args, Debug)]
pub struct TenantsArgs {
    /// The server's data directory.
    #[arg(
        long,
        env = "SUPERINFER_DATA_DIR",
        default_value = "superinfer-data",
        global = true
    )]
    pub data_dir: PathBuf,
    #[command(subcommand)]
    pub command: TenantsCommand,
}

#[derive(Subcommand, Debug)]
pub enum TenantsCommand {
    /// Every tenant, as JSON lines.
    List,
    /// Create a tenant and print its API key (shown once).
    Create {
        name: String,
        #[command(flatten)]
        fields: Fields,
    },
    /// One tenant by id or name.
    Get { tenant: String },
    /// Change some fields of a tenant.
    Patch {
        tenant: String,
        /// New name.
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        fields: Fields,
    },
    /// Delete a tenant; its key stops working.
    Delete { tenant: String },
    /// Give a tenant a new key (printed once); the old one stops working.
    RotateKey { tenant: String },
    /// The usage ledger: per tenant and UTC hour, requests, prompt, cached and completion
    /// tokens, errors (JSON, or CSV with --format csv).
    Usage {
        /// One tenant, by id or name (a deleted tenant by its id).
        #[arg(long)]
        tenant: Option<String>,
        /// Hours overlapping [from, to): Unix seconds or a UTC time like 2026-12-01T19:00:00Z.
        #[arg(long)]
        from: Option<String>,
        #[arg(long)]
        to: Option<String>,
        #[arg(long, value_enum, default_value = "json")]
        format: crate::usage::Format,
    },
    /// Make the store hold what a tenants file (TOML) says: create, update and, with
    /// --prune, delete tenants; applying the same file again changes nothing.
    Apply {
        /// The tenants file (docs/TENANTS.md, "Tenants files").
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        /// Also delete the tenants the file does not name.
        #[arg(long)]
        prune: bool,
    },
}

/// Settable fields; each left out keeps its default (create) or value (patch).
#[derive(Args, Debug, Default)]
pub struct Fields {
    #[arg(long)]
    pub ttft_ms: Option<u32>,
    #[arg(long)]
    pub tbt_ms: Option<u32>,
    /// The tenant's own queue deadline (0: back to the node's `--queue-deadline-ttfts`).
    #[arg(long)]
    pub queue_deadline_ms: Option<u32>,
    #[arg(long)]
    pub weight: Option<f64>,
    #[arg(long)]
    pub requests_per_s: Option<f64>,
    #[arg(long)]
    pub burst: Option<u32>,
    #[arg(long)]
    pub tokens_per_min: Option<u64>,
    #[arg(long)]
    pub max_concurrent: Option<u32>,
    #[arg(long)]
    pub max_prompt_tokens: Option<u32>,
    #[arg(long)]
    pub max_output_tokens: Option<u32>,
    /// Enable (true) or disable (false) the tenant.
    #[arg(long)]
    pub enabled: Option<bool>,
    /// Share prefix-cache blocks with the tenants that have this same namespace name.
    #[arg(long, conflicts_with = "own_cache_namespace")]
    pub cache_namespace: Option<String>,
    /// Back to the tenant's own prefix-cache namespace (patch).
    #[arg(long)]
    pub own_cache_namespace: bool,
}

impl Fields {
    fn patch(&self, name: Option<String>) -> TenantPatch {
        TenantPatch {
            name,
            slo: (self.ttft_ms.is_some()
                || self.tbt_ms.is_some()
                || self.queue_deadline_ms.is_some())
            .then_some(SloPatch {
                ttft_ms: self.ttft_ms,
                tbt_ms: self.tbt_ms,
                queue_deadline_ms: self.queue_deadline_ms,
            }),
            weight: self.weight,
            quotas: Some(QuotasPatch {
                requests_per_s: self.requests_per_s,
                burst: self.burst,
                tokens_per_min: self.tokens_per_min,
                max_concurrent: self.max_concurrent,
                max_prompt_tokens: self.max_prompt_tokens,
                max_output_tokens: self.max_output_tokens,
            })
            .filter(|q| *q != QuotasPatch::default()),
            enabled: self.enabled,
            cache_namespace: match (&self.cache_namespace, self.own_cache_namespace) {
                (Some(ns), _) => Some(Some(ns.clone())),
                (None, true) => Some(None),
                (None, false) => None,
            },
        }
    }

    fn new_tenant(&self, name: String) -> anyhow::Result<NewTenant> {
        // Start from the defaults and apply the flags as a patch, validated on create.
        let base = Tenant {
            id: TenantId(0),
            name: name.clone(),
            slo: Slo::default(),
            weight: 1.0,
            quotas: Quotas::default(),
            enabled: true,
            created_at_ms: 0,
            cache_namespace: None,
        };
        let t = self.patch(None).apply(&base)?;
        Ok(NewTenant {
            name,
            slo: t.slo,
            weight: t.weight,
            quotas: t.quotas,
            enabled: t.enabled,
            cache_namespace: t.cache_namespace,
        })
    }
}

pub fn run(args: TenantsArgs) -> anyhow::Result<()> {
    // Read and check the file before opening the store: a bad file is reported as such
    // even while the server holds the directory.
    let file = match &args.command {
        TenantsCommand::Apply { file, .. } => Some(TenantsFile::load(file)?),
        _ => None,
    };
    let store = open(&args.data_dir, &args.command)?;
    match args.command {
        TenantsCommand::List => {
            for t in store.list()? {
                println!("{}", serde_json::to_string(&t)?);
            }
        }
        TenantsCommand::Create { name, fields } => {
            let (t, key) = store.create(fields.new_tenant(name)?)?;
            println!("{}", serde_json::to_string_pretty(&t)?);
            println!("api key: {}", key.expose());
        }
        TenantsCommand::Get { tenant } => {
            let t = resolve(&store, &tenant)?;
            println!("{}", serde_json::to_string_pretty(&t)?);
        }
        TenantsCommand::Patch {
            tenant,
            name,
            fields,
        } => {
            let t = resolve(&store, &tenant)?;
            let t = store.patch(t.id, fields.patch(name))?;
            println!("{}", serde_json::to_string_pretty(&t)?);
        }
        TenantsCommand::Delete { tenant } => {
            let t = resolve(&store, &tenant)?;
            store.delete(t.id)?;
            println!("deleted tenant {} ({})", t.id, t.name);
        }
        TenantsCommand::RotateKey { tenant } => {
            let t = resolve(&store, &tenant)?;
            let key = store.rotate_key(t.id)?;
            println!("api key: {}", key.expose());
        }
        TenantsCommand::Usage {
            tenant,
            from,
            to,
            format,
        } => {
            let params = crate::usage::UsageParams { tenant, from, to };
            let report = store.usage_report(&params.query(&store)?)?;
            match format {
                crate::usage::Format::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(&crate::usage::report_json(&report))?
                ),
                crate::usage::Format::Csv => print!("{}", superinfer_tenants::to_csv(&report)),
            }
        }
        TenantsCommand::Apply { prune, .. } => {
            let file = file.context("the tenants file was read above")?;
            let report = store.apply(&file, prune)?;
            for (what, names) in [
                ("created", &report.created),
                ("updated", &report.updated),
                ("unchanged", &report.unchanged),
                ("removed", &report.removed),
            ] {
                for name in names {
                    println!("{what} {name}");
                }
            }
            println!("{report}");
        }
    }
    store.flush()?;
    Ok(())
}

/// Opens the store in `data_dir`. Only the commands that add tenants (`create`, `apply`) may
/// make a new store, and they say so; every other command refuses a directory without one,
/// so a mistyped `--data-dir` is an error, not an empty list (nor a store left behind).
fn open(data_dir: &Path, command: &TenantsCommand) -> anyhow::Result<TenantStore> {
    let path = data_dir.join("tenants");
    let creates = matches!(
        command,
        TenantsCommand::Create { .. } | TenantsCommand::Apply { .. }
    );
    let fresh = !TenantStore::exists(&path);
    let opened = if creates {
        TenantStore::open(&path)
    } else {
        TenantStore::open_existing(&path)
    };
    let store = match opened {
        Err(TenantError::NoStore { .. }) => {
            let what = if data_dir.is_dir() {
                "holds no tenant store"
            } else {
                "does not exist"
            };
            anyhow::bail!(
                "the data directory {} {what}; check --data-dir (or SUPERINFER_DATA_DIR). A \
                 store is made by `superinfer serve` on its first start, or by `superinfer \
                 tenants create` or `superinfer tenants apply`",
                data_dir.display()
            );
        }
        r => r.with_context(|| format!("opening the tenant store in {}", data_dir.display()))?,
    };
    if fresh {
        eprintln!("created a new tenant store in {}", data_dir.display());
    }
    Ok(store)
}

/// All digits is an id; anything else a name (names cannot be all digits).
fn resolve(store: &TenantStore, key: &str) -> anyhow::Result<Tenant> {
    let r = TenantRef::parse(key);
    store.resolve(&r)?.with_context(|| format!("no tenant {r}"))
}
