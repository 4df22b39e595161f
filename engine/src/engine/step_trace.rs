//! What each step ran and how long it took, for fitting the cost model to a real GPU: one
//! JSON line per step to the file `EngineConfig::step_trace` names (`--step-trace`). A step's
//! line is written when the next step starts, once its whole iteration time (the batch, the
//! copies it waited for and the host work around them, what a decoding client sees between
//! tokens) is known.

use super::scratch::Span;
use crate::error::EngineError;
use serde::Serialize;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

/// One step's line.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub(super) struct StepRecord {
    /// Engine time at the step's start (seconds).
    pub(super) t: f64,
    /// The runner's time for the batch.
    pub(super) elapsed_s: f64,
    /// The cost model's prediction of it (`None` without a model).
    pub(super) predicted_s: Option<f64>,
    /// Start of this step to start of the next; `None` when the engine went idle after it.
    pub(super) iteration_s: Option<f64>,
    pub(super) decodes: u32,
    /// Keys the decodes attend to, summed, and the longest context among them.
    pub(super) decode_kv: u64,
    pub(super) max_decode_kv: u32,
    pub(super) chunks: u32,
    pub(super) chunk_tokens: u32,
    /// Tokens of context before the chunks (summed), and the longest of them.
    pub(super) chunk_pos: u64,
    pub(super) max_chunk_pos: u32,
    /// `Σ len × (pos + len / 2)` over the chunks: their causal attention's (query, key)
    /// pairs.
    pub(super) chunk_pairs: f64,
    /// Each chunk's `[pos, len]` (the attention's waves depend on each one's length).
    pub(super) chunk_spans: Vec<[u32; 2]>,
}

impl StepRecord {
    /// The record of a batch of `spans`, the first `decodes` of them decodes.
    pub(super) fn of_batch(t: f64, spans: &[Span], decodes: usize) -> StepRecord {
        let mut r = StepRecord {
            t,
            ..StepRecord::default()
        };
        for s in &spans[..decodes] {
            r.decodes += 1;
            r.decode_kv += u64::from(s.end);
            r.max_decode_kv = r.max_decode_kv.max(s.end);
        }
        for s in &spans[decodes..] {
            let len = s.end - s.pos;
            r.chunks += 1;
            r.chunk_tokens += len;
            r.chunk_pos += u64::from(s.pos);
            r.max_chunk_pos = r.max_chunk_pos.max(s.pos);
            r.chunk_pairs += f64::from(len) * (f64::from(s.pos) + f64::from(len) / 2.0);
            r.chunk_spans.push([s.pos, len]);
        }
        r
    }
}

/// The trace file, when one is asked for.
#[derive(Default)]
pub(super) struct StepTrace {
    out: Option<BufWriter<File>>,
}

impl StepTrace {
    /// Creates (truncates) the file at `path`; none: a trace that writes nothing.
    pub(super) fn open(path: Option<&Path>) -> Result<StepTrace, EngineError> {
        let out = match path {
            None => None,
            Some(p) => Some(BufWriter::new(File::create(p).map_err(|e| {
                EngineError::Config(format!("step trace {}: {e}", p.display()))
            })?)),
        };
        Ok(StepTrace { out })
    }

    pub(super) fn is_on(&self) -> bool {
        self.out.is_some()
    }

    /// Writes `record`'s line. A failed write (a full disk, say) stops the trace, logged
    /// once; serving goes on.
    pub(super) fn write(&mut self, record: &StepRecord) {
        let Some(out) = self.out.as_mut() else {
            return;
        };
        let line = serde_json::to_string(record).expect("a record serializes");
        if let Err(e) = writeln!(out, "{line}").and_then(|()| out.flush()) {
            tracing::error!(error = %e, "the step trace stopped");
            self.out = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use superinfer_policies::RequestId;

    #[test]
    fn a_batch_is_summed_by_kind_and_written_one_line_per_step() {
        let span = |pos, end| Span {
            id: RequestId(1),
            pos,
            end,
            sample: true,
        };
        let spans = [span(99, 100), span(9, 10), span(0, 512), span(4096, 5120)];
        let r = StepRecord::of_batch(2.5, &spans, 2);
        assert_eq!((r.decodes, r.decode_kv, r.max_decode_kv), (2, 110, 100));
        assert_eq!((r.chunks, r.chunk_tokens, r.chunk_pos), (2, 1536, 4096));
        assert_eq!(r.max_chunk_pos, 4096);
        assert_eq!(r.chunk_spans, vec![[0, 512], [4096, 1024]]);
        assert_eq!(r.chunk_pairs, 512.0 * 256.0 + 1024.0 * (4096.0 + 512.0));

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("steps.jsonl");
        let mut trace = StepTrace::open(Some(&path)).unwrap();
        trace.write(&StepRecord {
            iteration_s: Some(0.02),
            ..r.clone()
        });
        trace.write(&r);
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["iteration_s"], 0.02);
        assert!(lines[1]["iteration_s"].is_null());
        assert_eq!(lines[1]["chunk_tokens"], 1536);
        // A folder that does not exist: a configuration error naming the path.
        let bad = dir.path().join("no/such/steps.jsonl");
        let e = StepTrace::open(Some(&bad)).err().unwrap().to_string();
        assert!(e.contains("step trace") && e.contains("no/such"), "{e}");
    }
}
