//! The flags of a trace replay (`--trace`, or a workload file with `[replay]`) and the sweep
//! they make: one load per `--rate-scale`, every row of the window one request.

use super::parse::usage;
use super::sweep::{Load, Sweep, WorkloadFlags};
use crate::error::Error;
use crate::workload::replay::{self, ReplaySpec};
use crate::workload::{ArrivalSpec, TenantSpec};
use std::path::Path;
use std::sync::Arc;

/// The sweep of a replay: `spec` from the workload file (or `--trace`), the flags over it.
/// `context`: the target's context in tokens, the default prompt cap.
pub(super) fn prepare_replay(
    args: &WorkloadFlags<'_>,
    spec: ReplaySpec,
    file_tenants: Option<Vec<TenantSpec>>,
    context: Option<u32>,
) -> Result<Sweep, Error> {
    if !args.rps.is_empty() {
        return Err(usage(
            "--rps does not apply to a trace replay: its rows set the rate; use --rate-scale"
                .into(),
        ));
    }
    if args.duration_given {
        return Err(usage(
            "--duration does not apply to a trace replay: its rows set the length; use \
             --trace-duration-s for a window of the trace"
                .into(),
        ));
    }
    if let Some(flag) = args.conversation.given() {
        return Err(usage(format!(
            "{flag} does not apply to a trace replay: its rows are the requests"
        )));
    }
    let mut spec = spec;
    args.replay.apply(&mut spec);
    let tenants = file_tenants.unwrap_or_else(|| {
        vec![args
            .default_tenant
            .tenant(crate::workload::LengthSpec::Replay, ArrivalSpec::replay())]
    });
    crate::workload::validate_tenants(&tenants)?;
    let file = spec.read(Path::new(""))?;
    let scales = if args.replay.rate_scale.is_empty() {
        vec![1.0]
    } else {
        args.replay.rate_scale.clone()
    };
    let own: Vec<TenantSpec> = tenants
        .iter()
        .filter(|t| !t.arrivals.is_replay())
        .cloned()
        .collect();
    if let Some(t) = own.iter().find(|t| t.conversation.is_some()) {
        return Err(usage(format!(
            "tenant '{}': a tenant beside a replayed trace sends single requests (no \
             conversation)",
            t.name
        )));
    }
    let loads = scales
        .into_iter()
        .map(|scale| {
            let mut r = replay::build(&spec, &file, &tenants, scale, context)?;
            let run_s = r.info.run_s;
            if !own.is_empty() {
                beside_the_trace(&mut r.requests, &tenants, &own, run_s, args.seed)?;
            }
            let mut per_tenant = vec![0u64; tenants.len()];
            for q in &r.requests {
                per_tenant[q.tenant] += 1;
            }
            let tenants = tenants
                .iter()
                .zip(&per_tenant)
                .map(|(t, &n)| match t.arrivals.is_replay() {
                    true => TenantSpec {
                        arrivals: ArrivalSpec::Replay {
                            rps: n as f64 / run_s,
                        },
                        ..t.clone()
                    },
                    false => t.clone(),
                })
                .collect();
            Ok(Load {
                rps: r.requests.len() as f64 / run_s,
                tenants,
                requests: r.requests,
                duration_s: run_s,
                replay: Some(Arc::new(r.info)),
            })
        })
        .collect::<Result<Vec<_>, Error>>()?;
    Ok(Sweep {
        policies: args.policies.to_vec(),
        duration_s: loads.iter().map(|l| l.duration_s).fold(0.0, f64::max),
        loads,
    })
}

/// The requests of the tenants with load of their own (`own`, in `tenants`' order) over the
/// replay's `run_s` seconds, merged into the trace's `requests` by arrival, ids renumbered.
fn beside_the_trace(
    requests: &mut Vec<crate::workload::RequestSpec>,
    tenants: &[TenantSpec],
    own: &[TenantSpec],
    run_s: f64,
    seed: u64,
) -> Result<(), Error> {
    let mut extra = crate::workload::generate(own, run_s, seed)?;
    for q in &mut extra {
        let name = &own[q.tenant].name;
        q.tenant = tenants
            .iter()
            .position(|t| &t.name == name)
            .expect("own tenants are from the list");
    }
    requests.append(&mut extra);
    requests.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
    for (id, q) in requests.iter_mut().enumerate() {
        q.id = id as u64;
    }
    Ok(())
}
