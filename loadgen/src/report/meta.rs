//! What the report's renderers (`markdown`, `plots`) take from the writer: how the results
//! were produced, and the TTFT samples of each run.

/// How the results were produced, printed at the top of `summary.md`.
#[derive(Clone, Debug, Default)]
pub struct ReportMeta {
    /// The command line.
    pub command: String,
    /// Further facts worth reading next to the numbers (profile, seed, workload).
    pub context: Vec<(String, String)>,
}

/// TTFTs of one run, kept for the CDF plot.
pub(crate) struct TtftSample {
    pub policy: String,
    pub rps: f64,
    /// Sorted; unserved requests at `end - arrival`.
    pub ttft_s: Vec<f64>,
}
