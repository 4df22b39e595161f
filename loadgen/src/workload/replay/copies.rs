//! Tenants that replay a copy of the trace of their own at a multiple of the run's rate
//! (`ReplaySpec::copies`): the same traffic as the tenants sharing the rows, K times as dense.

use super::{ReplaySpec, RequestSpec, TraceBlocks, TraceFile};
use crate::error::Error;
use crate::workload::conversation::text_seed;
use crate::workload::TenantSpec;

/// The copy tenants' indices and rate multiples, in the spec's order; each must be a tenant
/// without load of its own.
pub(super) fn copy_tenants(
    spec: &ReplaySpec,
    tenants: &[TenantSpec],
) -> Result<Vec<(usize, f64)>, Error> {
    spec.copies
        .iter()
        .map(|(name, &k)| {
            tenants
                .iter()
                .position(|t| &t.name == name && t.arrivals.is_replay())
                .map(|i| (i, k))
                .ok_or_else(|| {
                    Error::Usage(format!(
                        "replay: copies names tenant '{name}', which is not defined or sends \
                         load of its own"
                    ))
                })
        })
        .collect()
}

/// Appends `tenant`'s copy: the rows from the window's start over `k × window_s` of trace
/// time (after the trace's last row, again from its first, one resolution step later), each
/// at `(trace time from the start) × scale / k`. Rows without output or prompt, or over
/// `cap`, are skipped as in the shared replay. Content is the copy's own (seeded by the row,
/// the lap and the tenant), so a copy shares no prompt with the rows it repeats.
pub(super) fn push_copy(
    spec: &ReplaySpec,
    file: &TraceFile,
    times: &[f64],
    (tenant, k): (usize, f64),
    (window_s, scale): (f64, f64),
    cap: Option<u32>,
    out: &mut Vec<RequestSpec>,
) {
    let mut order: Vec<usize> = (0..file.rows.len()).collect();
    order.sort_by(|&a, &b| times[a].total_cmp(&times[b]));
    let (Some(&first), Some(&last)) = (order.first(), order.last()) else {
        return;
    };
    let period = times[last] - times[first] + file.resolution_s.max(1e-3);
    let span = k * window_s;
    // Lap 0 starts at the window's start; later laps replay the whole trace.
    let mut offset = spec.start_s;
    for lap in 0u64.. {
        let from = if lap == 0 { spec.start_s } else { times[first] };
        let mut any = false;
        for &i in order.iter().filter(|&&i| times[i] >= from) {
            let v = times[i] - from + (offset - spec.start_s);
            if v >= span {
                return;
            }
            any = true;
            let row = &file.rows[i];
            if row.output_tokens == 0
                || row.prompt_tokens == 0
                || cap.is_some_and(|c| row.prompt_tokens > c)
            {
                continue;
            }
            out.push(RequestSpec {
                id: out.len() as u64,
                tenant,
                arrival_s: v * scale / k,
                prompt_tokens: row.prompt_tokens,
                output_tokens: row.output_tokens,
                system_tokens: 0,
                message_tokens: row.prompt_tokens,
                content_seed: text_seed(&format!("trace row {} lap {lap} copy {tenant}", row.line)),
                turn: None,
                blocks: row.hash_ids.as_ref().map(|ids| TraceBlocks {
                    hash_ids: ids.as_slice().into(),
                    block_tokens: spec.block_tokens,
                }),
            });
        }
        if !any && lap > 0 {
            return;
        }
        offset += if lap == 0 {
            times[last] + file.resolution_s.max(1e-3) - spec.start_s
        } else {
            period
        };
    }
}
