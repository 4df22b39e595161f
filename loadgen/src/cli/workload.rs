//! The workload of a sweep from the flags shared by `sim` and `http`: the tenants (a file or
//! the single default tenant), the conversation and system-prompt overrides, and every
//! load's requests.

use super::parse::usage;
use super::replay::prepare_replay;
use super::sweep::{Load, Sweep, WorkloadFlags};
use crate::error::Error;
use crate::workload::replay::ReplaySpec;
use crate::workload::{self, load_workload, ArrivalSpec, TenantSpec};

/// [`prepare`] for any command's workload flags. `context`: the target's context in tokens
/// (the default cap on a replayed trace's prompts), asked only for a replay.
pub fn prepare_workload(
    args: WorkloadFlags<'_>,
    context: impl FnOnce(&[TenantSpec]) -> Option<u32>,
) -> Result<Sweep, Error> {
    if let Some(p) = first_duplicate(args.policies.iter()) {
        return Err(usage(format!("--policies lists '{p}' twice")));
    }
    if args.policies.is_empty() {
        return Err(usage("--policies is empty".into()));
    }
    if let Some(r) = first_duplicate(args.rps.iter().map(|r| r.to_bits())) {
        return Err(usage(format!("--rps lists {} twice", f64::from_bits(r))));
    }
    let file = args.tenants.map(load_workload).transpose()?;
    if file.is_some() || args.replay.trace.is_some() {
        args.default_tenant.check_unused(file.is_some())?;
    }
    let replay_spec = match (&args.replay.trace, &file) {
        (Some(path), _) => Some(ReplaySpec::new(path)),
        (None, Some(f)) => f.replay.clone(),
        (None, None) => None,
    };
    if let Some(spec) = replay_spec {
        let tenants = file.map(|f| f.tenants);
        let context = context(tenants.as_deref().unwrap_or_default());
        return prepare_replay(&args, spec, tenants, context);
    }
    args.replay.check_unused()?;
    let base = match file {
        Some(f) => f.tenants,
        None => {
            if args.rps.is_empty() {
                return Err(usage(
                    "--rps is required without --tenants (e.g. --rps 5,10,15,20)".into(),
                ));
            }
            let d = args.default_tenant;
            vec![d.tenant(d.dataset(), ArrivalSpec::Poisson { rps: 1.0 })]
        }
    };
    let mut base = base;
    for t in &mut base {
        args.conversation.apply(t)?;
    }
    workload::validate_tenants(&base)?;
    let base_rps = total_rps(&base)?;
    let targets = if args.rps.is_empty() {
        vec![base_rps]
    } else {
        args.rps.to_vec()
    };
    let loads = targets
        .into_iter()
        .map(|rps| {
            let factor = rps / base_rps;
            let tenants: Vec<TenantSpec> = base
                .iter()
                .map(|t| TenantSpec {
                    arrivals: t.arrivals.scaled(factor),
                    ..t.clone()
                })
                .collect();
            let requests = workload::generate(&tenants, args.duration, args.seed)?;
            Ok(Load {
                rps,
                tenants,
                requests,
                duration_s: args.duration,
                replay: None,
            })
        })
        .collect::<Result<Vec<_>, Error>>()?;
    Ok(Sweep {
        policies: args.policies.to_vec(),
        loads,
        duration_s: args.duration,
    })
}

fn first_duplicate<T: PartialEq + Copy>(items: impl Iterator<Item = T>) -> Option<T> {
    let items: Vec<T> = items.collect();
    items
        .iter()
        .enumerate()
        .find(|(i, x)| items[..*i].contains(x))
        .map(|(_, x)| *x)
}

fn total_rps(tenants: &[TenantSpec]) -> Result<f64, Error> {
    tenants.iter().try_fold(0.0, |sum, t| {
        Ok(sum + t.arrivals.mean_rps().map_err(|e| e.in_tenant(&t.name))?)
    })
}
