//! One trace row as a request: what the shared replay and its copies build alike.

use crate::workload::request::{RequestSpec, TraceBlocks};
use crate::workload::trace::TraceRow;

/// Whether a row's prompt is over the cap (counted and reported, not sent).
pub(super) fn over_cap(row: &TraceRow, cap: Option<u32>) -> bool {
    cap.is_some_and(|c| row.prompt_tokens > c)
}

/// The request of `row` for `tenant` at `arrival_s`, with content from `seed` and `id`;
/// `block_tokens` per hash id.
pub(super) fn request(
    row: &TraceRow,
    block_tokens: u32,
    (tenant, arrival_s): (usize, f64),
    seed: u64,
    id: usize,
) -> RequestSpec {
    RequestSpec {
        id: id as u64,
        tenant,
        arrival_s,
        prompt_tokens: row.prompt_tokens,
        output_tokens: row.output_tokens,
        system_tokens: 0,
        message_tokens: row.prompt_tokens,
        content_seed: seed,
        turn: None,
        blocks: row.hash_ids.as_ref().map(|ids| TraceBlocks {
            hash_ids: ids.as_slice().into(),
            block_tokens,
        }),
    }
}
