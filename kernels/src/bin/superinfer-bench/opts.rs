//! The options of `superinfer-bench duplex`.

use std::path::PathBuf;

/// Options of `duplex`.
#[derive(Clone, Debug)]
pub struct Opts {
    /// GiB moved each way per row.
    pub gib: u64,
    /// Timed repetitions per row (after one warm-up), median reported.
    pub reps: usize,
    /// Timed repetitions of the slow naive rows (no warm-up).
    pub naive_reps: usize,
    pub seed: u64,
    /// Largest pinned allocation, GiB.
    pub chunk_gib: u64,
    /// Folder for the Markdown table and the raw timings.
    pub out: Option<PathBuf>,
    pub checks: bool,
    /// Also the naive row with one copy per layer (K and V adjacent, 64 KiB).
    pub naive_layer: bool,
    /// Also the naive row as a synchronous swap loop (one rep).
    pub naive_sync: bool,
}

impl Default for Opts {
    fn default() -> Self {
        Self {
            gib: 8,
            reps: 5,
            naive_reps: 2,
            seed: 20261129,
            chunk_gib: 8,
            out: None,
            checks: true,
            naive_layer: true,
            naive_sync: true,
        }
    }
}
