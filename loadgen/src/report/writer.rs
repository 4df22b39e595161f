//! The output directory of a sweep. Request lines are streamed to `requests.jsonl` as runs
//! complete, so a long sweep never holds every token time in memory; the summaries, the
//! table and the plots are written by [`ReportWriter::finish`].

use super::meta::{ReportMeta, TtftSample};
use super::stats::Outcome;
use super::{analyze, markdown, plots, ReportConfig, RunInput, RunSummary, Summary};
use crate::error::Error;
use crate::record::RequestRecord;
use serde::Serialize;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

pub const SUMMARY_JSON: &str = "summary.json";
pub const SUMMARY_MD: &str = "summary.md";
pub const REQUESTS_JSONL: &str = "requests.jsonl";
pub const ATTAINMENT_SVG: &str = "attainment_vs_rps.svg";
pub const TTFT_CDF_SVG: &str = "ttft_cdf.svg";

/// One line of `requests.jsonl`: the record, the run it belongs to, and its verdicts.
#[derive(Serialize)]
struct RequestLine<'a> {
    policy: &'a str,
    rps: f64,
    #[serde(flatten)]
    record: RequestRecord,
    ttft_s: Option<f64>,
    ttft_met: bool,
    tbt_gaps: u32,
    tbt_gaps_met: u32,
}

/// Writes a sweep's results into one directory.
pub struct ReportWriter {
    dir: PathBuf,
    cfg: ReportConfig,
    requests: BufWriter<File>,
    runs: Vec<RunSummary>,
    ttfts: Vec<TtftSample>,
    /// The TTFT SLO shared by every tenant of every run, if there is one.
    ttft_slo_s: Option<Option<f64>>,
}

impl ReportWriter {
    /// Creates `dir` if needed and starts `requests.jsonl` (replacing an old one).
    pub fn create(dir: &Path, cfg: ReportConfig) -> Result<ReportWriter, Error> {
        std::fs::create_dir_all(dir).map_err(|source| Error::Write {
            path: dir.to_path_buf(),
            source,
        })?;
        let path = dir.join(REQUESTS_JSONL);
        let file = File::create(&path).map_err(|source| Error::Write { path, source })?;
        Ok(ReportWriter {
            dir: dir.to_path_buf(),
            cfg,
            requests: BufWriter::new(file),
            runs: Vec::new(),
            ttfts: Vec::new(),
            ttft_slo_s: None,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Summarizes a run and appends its requests to `requests.jsonl`.
    pub fn add_run(&mut self, input: &RunInput<'_>) -> Result<&RunSummary, Error> {
        let (summary, outcomes) = analyze(input, &self.cfg)?;
        self.write_requests(input, &outcomes)?;
        let mut ttft_s: Vec<f64> = outcomes.iter().map(|o| o.ttft_censored_s).collect();
        ttft_s.sort_by(f64::total_cmp);
        self.ttfts.push(TtftSample {
            policy: summary.policy.clone(),
            rps: summary.rps,
            ttft_s,
        });
        for t in input.tenants {
            self.ttft_slo_s = match self.ttft_slo_s {
                None => Some(Some(t.ttft_slo_s)),
                Some(Some(s)) if s == t.ttft_slo_s => Some(Some(s)),
                Some(_) => Some(None),
            };
        }
        self.runs.push(summary);
        Ok(self.runs.last().expect("a run was just pushed"))
    }

    fn write_requests(&mut self, input: &RunInput<'_>, outcomes: &[Outcome]) -> Result<(), Error> {
        let path = self.dir.join(REQUESTS_JSONL);
        for (record, o) in input.records.iter().zip(outcomes) {
            let line = RequestLine {
                policy: input.policy,
                rps: input.rps,
                record: to_microseconds(record),
                ttft_s: o.ttft_s,
                ttft_met: o.ttft_met,
                tbt_gaps: o.gaps_total(),
                tbt_gaps_met: o.gaps_met,
            };
            serde_json::to_writer(&mut self.requests, &line)?;
            self.requests
                .write_all(b"\n")
                .map_err(|source| Error::Write {
                    path: path.clone(),
                    source,
                })?;
        }
        Ok(())
    }

    /// The runs summarized so far.
    pub fn runs(&self) -> &[RunSummary] {
        &self.runs
    }

    /// Writes `summary.json`, `summary.md` and the plots; returns the summary.
    pub fn finish(mut self, meta: &ReportMeta) -> Result<Summary, Error> {
        let path = self.dir.join(REQUESTS_JSONL);
        self.requests
            .flush()
            .map_err(|source| Error::Write { path, source })?;
        let summary = Summary { runs: self.runs };
        let json = serde_json::to_string_pretty(&summary)?;
        write_file(&self.dir.join(SUMMARY_JSON), json.as_bytes())?;
        let md = markdown::render(&summary, meta);
        write_file(&self.dir.join(SUMMARY_MD), md.as_bytes())?;
        plots::attainment_vs_rps(&self.dir.join(ATTAINMENT_SVG), &summary.runs)?;
        plots::ttft_cdf(
            &self.dir.join(TTFT_CDF_SVG),
            &self.ttfts,
            self.ttft_slo_s.flatten(),
        )?;
        Ok(summary)
    }
}

/// Times rounded to the microsecond: the shortest decimal of a raw `f64` takes 17 digits,
/// and a sweep has millions of token times.
fn to_microseconds(r: &RequestRecord) -> RequestRecord {
    let us = |t: f64| (t * 1e6).round() / 1e6;
    RequestRecord {
        id: r.id,
        tenant: r.tenant,
        arrival_s: us(r.arrival_s),
        first_token_s: r.first_token_s.map(us),
        token_times_s: r.token_times_s.iter().map(|&t| us(t)).collect(),
        finish_s: r.finish_s.map(us),
        prompt_tokens: r.prompt_tokens,
        output_tokens: r.output_tokens,
        generated_tokens: r.generated_tokens,
        preemptions: r.preemptions,
        cached_tokens: r.cached_tokens,
        cached_dram_tokens: r.cached_dram_tokens,
        conversation: r.conversation,
        turn: r.turn,
        refused: r.refused,
        gpu_s: r.gpu_s,
        queued_s: r.queued_s.map(us),
    }
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    std::fs::write(path, bytes).map_err(|source| Error::Write {
        path: path.to_path_buf(),
        source,
    })
}
