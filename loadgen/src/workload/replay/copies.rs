//! Tenants that replay a copy of the trace of their own at a multiple of the run's rate
//! (`ReplaySpec::copies`): the same traffic as the tenants sharing the rows, K times as dense.

use super::row::{over_cap, request};
use crate::error::Error;
use crate::workload::conversation::text_seed;
use crate::workload::request::RequestSpec;
use crate::workload::trace::TraceFile;
use crate::workload::TenantSpec;
use std::collections::BTreeMap;

/// The copy tenants' indices and rate multiples, in the spec's order; each must be a tenant
/// without load of its own.
pub(super) fn copy_tenants(
    copies: &BTreeMap<String, f64>,
    tenants: &[TenantSpec],
) -> Result<Vec<(usize, f64)>, Error> {
    copies
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

/// Appends `tenant`'s copy: the rows (`order`: by time) from the window's start (`start_s`) over
/// `k × window_s` of trace time, the trace starting again from its first row one resolution
/// step after its last, each at `(trace time from the start) × scale / k`. Rows without output
/// or prompt, or over `cap`, are skipped as in the shared replay. Content is the copy's own
/// (seeded by the row, the lap and the tenant), so a copy shares no prompt with the rows it
/// repeats.
pub(super) fn push_copy(
    (file, times, order): (&TraceFile, &[f64], &[usize]),
    (start_s, block_tokens): (f64, u32),
    (tenant, k): (usize, f64),
    (window_s, scale): (f64, f64),
    cap: Option<u32>,
    out: &mut Vec<RequestSpec>,
) {
    let (Some(&first), Some(&last)) = (order.first(), order.last()) else {
        return;
    };
    // Trace time `t` of lap `lap` lies at `t + lap × period` on the copy's timeline.
    let period = times[last] - times[first] + file.resolution_s.max(1e-3);
    let span = k * window_s;
    for lap in 0u64.. {
        let shift = lap as f64 * period - start_s;
        for &i in order {
            let v = times[i] + shift;
            if v < 0.0 {
                continue;
            }
            if v >= span {
                return;
            }
            let row = &file.rows[i];
            if row.output_tokens == 0 || row.prompt_tokens == 0 || over_cap(row, cap) {
                continue;
            }
            let seed = text_seed(&format!("trace row {} lap {lap} copy {tenant}", row.line));
            out.push(request(
                row,
                block_tokens,
                (tenant, v * scale / k),
                seed,
                out.len(),
            ));
        }
    }
}
