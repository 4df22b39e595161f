//! Prometheus metrics, named after vLLM's with the `superinfer_` prefix (DESIGN.md): per-tenant
//! latency histograms, request and token counters and SLO-attainment gauges, plus engine
//! gauges read from `EngineHandle::stats()` at each scrape.
//!
//! Each server owns its recorder (no process-global state), so several servers in one test
//! process keep separate metrics. Per-tenant handles are registered once per tenant and kept
//! in [`TenantMetrics`], so the request path does no label lookups.

use metrics::{Counter, Gauge, Histogram, Recorder};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use superinfer_engine::{EngineStats, StepMetrics};

pub mod vllm;

pub const TTFT: &str = "superinfer_time_to_first_token_seconds";
pub const ITL: &str = "superinfer_inter_token_latency_seconds";
pub const E2E: &str = "superinfer_e2e_request_latency_seconds";
pub const REQUESTS: &str = "superinfer_requests_total";
pub const REJECTED: &str = "superinfer_requests_rejected_total";
pub const ADMITTED: &str = "superinfer_admitted_total";
pub const PROMPT_TOKENS: &str = "superinfer_prompt_tokens_total";
pub const GENERATION_TOKENS: &str = "superinfer_generation_tokens_total";
pub const TTFT_ATTAINMENT: &str = "superinfer_ttft_slo_attainment_ratio";
pub const TBT_ATTAINMENT: &str = "superinfer_tbt_slo_attainment_ratio";
pub const SHED: &str = "superinfer_requests_shed_total";
pub const STREAMS_ABORTED: &str = "superinfer_streams_aborted_total";
pub const LEDGER_LATE: &str = "superinfer_ledger_late_answers_total";
pub const PREFIX_QUERY_TOKENS: &str = "superinfer_prefix_cache_query_tokens_total";
pub const PREFIX_HIT_TOKENS: &str = "superinfer_prefix_cache_hit_tokens_total";
pub const PREFIX_BLOCKS: &str = "superinfer_prefix_cache_blocks";
pub const SLO_CHECKS: &str = "superinfer_slo_checks_total";
pub const SLO_MET: &str = "superinfer_slo_met_total";
pub const TTFT_UNSERVED: &str = "superinfer_ttft_unserved_total";
pub const GPU_SECONDS: &str = "superinfer_request_gpu_seconds";
pub const HOST_SECONDS: &str = "superinfer_request_host_seconds";
/// What a request's host CPU went to: parsing, templating, tokenizing and compiling its
/// grammar in the text pool; its grammar's token masks in the engine.
pub const HOST_WORK: [&str; 2] = ["text", "grammar_mask"];

/// Why an admitted request ended without a first token ([`TTFT_UNSERVED`]'s `reason`): its
/// client went away, the engine shed it at submission (queue full, would miss its SLO), it was
/// shed past its queue deadline, the engine stopped, the engine or its step failed, or the
/// request itself failed (e.g. its grammar).
pub const UNSERVED_REASONS: [&str; 6] = [
    "aborted", "shed", "deadline", "stopped", "failed", "invalid",
];
pub const QUOTA_STORE_UP: &str = "superinfer_quota_store_up";
pub const QUOTA_STORE_ERRORS: &str = "superinfer_quota_store_errors_total";
pub const QUOTA_STORE_FALLBACK: &str = "superinfer_quota_store_fallback_total";

/// The reasons of [`SHED`].
pub const SHED_REASONS: &[&str] = &[
    "queue_full",
    "inbox_full",
    "slo",
    "deadline",
    "text_pool",
    "connections",
    "draining",
];

/// At most one WARN summary of shed requests per this period.
pub const SHED_LOG_PERIOD: Duration = Duration::from_secs(10);

/// The engine's per-step histograms ([`Metrics::step_metrics`]).
pub const STEP_SECONDS: &str = "superinfer_step_seconds";
pub const STEP_BATCH_SIZE: &str = "superinfer_step_batch_size";
pub const STEP_KV_READ_BYTES: &str = "superinfer_step_kv_read_bytes";

const STEP_BUCKETS: &[f64] = &[
    0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0,
];
const BATCH_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0,
];
/// 1 MiB to 64 GiB, by powers of 4.
const KV_READ_BUCKETS: &[f64] = &[
    1048576.0,
    4194304.0,
    16777216.0,
    67108864.0,
    268435456.0,
    1073741824.0,
    4294967296.0,
    17179869184.0,
    68719476736.0,
];

const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
];

/// The server's metrics registry.
#[derive(Clone)]
pub struct Metrics {
    recorder: Arc<PrometheusRecorder>,
    handle: PrometheusHandle,
    shed_log: Arc<Mutex<ShedWindow>>,
}

/// Requests shed since the last WARN summary.
#[derive(Debug)]
struct ShedWindow {
    since: Instant,
    counts: BTreeMap<&'static str, u64>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut builder = PrometheusBuilder::new();
        for name in [TTFT, ITL, E2E, GPU_SECONDS, HOST_SECONDS] {
            builder = builder
                .set_buckets_for_metric(Matcher::Full(name.into()), LATENCY_BUCKETS)
                .expect("the bucket list is a non-empty constant");
        }
        for (name, buckets) in [
            (STEP_SECONDS, STEP_BUCKETS),
            (STEP_BATCH_SIZE, BATCH_BUCKETS),
            (STEP_KV_READ_BYTES, KV_READ_BUCKETS),
        ] {
            builder = builder
                .set_buckets_for_metric(Matcher::Full(name.into()), buckets)
                .expect("the bucket list is a non-empty constant");
        }
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        let m = Metrics {
            recorder: Arc::new(recorder),
            handle,
            shed_log: Arc::new(Mutex::new(ShedWindow {
                since: Instant::now(),
                counts: BTreeMap::new(),
            })),
        };
        m.describe();
        // Every shed reason exists at 0 from the start, so `rate()` sees the first shed.
        m.with(|| {
            for reason in SHED_REASONS {
                metrics::counter!(SHED, "reason" => *reason).increment(0);
            }
            metrics::counter!(LEDGER_LATE).increment(0);
        });
        m
    }

    /// The engine thread's per-step histograms, registered with this server's recorder.
    pub fn step_metrics(&self) -> StepMetrics {
        self.with(|| StepMetrics {
            step_seconds: metrics::histogram!(STEP_SECONDS),
            batch_size: metrics::histogram!(STEP_BATCH_SIZE),
            kv_read_bytes: metrics::histogram!(STEP_KV_READ_BYTES),
        })
    }

    /// Runs `f` with this server's recorder as the `metrics` macros' target.
    pub fn with<T>(&self, f: impl FnOnce() -> T) -> T {
        metrics::with_local_recorder(&*self.recorder, f)
    }

    fn describe(&self) {
        let r: &dyn Recorder = &*self.recorder;
        let help: &[(&str, &str)] = &[
            (
                TTFT,
                "Time to first token, from arrival at the gateway, per tenant.",
            ),
            (ITL, "Time between consecutive output tokens, per tenant."),
            (E2E, "Time from arrival to the last token, per tenant."),
            (
                GPU_SECONDS,
                "GPU time of each sequence the engine ran, per tenant: its share of every step \
                 it was in, by the step's cost model (compute and KV read). The sum over a \
                 window is the tenant's GPU time, the split weighted fairness follows.",
            ),
            (
                HOST_SECONDS,
                "Host CPU time of each request, per tenant and work: `text` (parsing, chat \
                 template, tokenizing and grammar compiling in the text pool) and \
                 `grammar_mask` (its token masks in the engine, also charged to the tenant's \
                 fairness counter). Billed or not, the sum is the CPU the tenant took.",
            ),
            (
                STEP_SECONDS,
                "Seconds of each engine iteration that ran a batch (plan, copies, model step, \
                 events).",
            ),
            (
                STEP_BATCH_SIZE,
                "Requests in each engine step's batch (decodes and prompt chunks).",
            ),
            (
                STEP_KV_READ_BYTES,
                "Bytes of KV each engine step's attention read (every entry's keys and values \
                 up to its end, all layers).",
            ),
            (
                REQUESTS,
                "Sequences finished (each choice of a request), per tenant and finish reason.",
            ),
            (
                ADMITTED,
                "What was submitted to the engine past admission, per tenant and unit: \
                 requests (one per HTTP request) and sequences (each choice of each prompt; \
                 the unit of the TTFT SLO checks). The usage ledger holds what the engine \
                 accepted of it.",
            ),
            (
                REJECTED,
                "Requests refused before reaching the engine, per tenant and reason.",
            ),
            (
                PROMPT_TOKENS,
                "Prompt tokens of admitted requests, per tenant.",
            ),
            (GENERATION_TOKENS, "Output tokens generated, per tenant."),
            (
                TTFT_ATTAINMENT,
                "Share of a tenant's requests whose first token met its TTFT SLO.",
            ),
            (
                SHED,
                "Requests shed on purpose under overload, by reason (queue_full, inbox_full, \
                 slo, deadline, text_pool, connections, draining).",
            ),
            (
                LEDGER_LATE,
                "Answers whose last bytes went out before their usage record was on disk \
                 (the ledger write took longer than its commit timeout); billed at the next write.",
            ),
            (
                STREAMS_ABORTED,
                "Streams aborted by the gateway, by reason (slow_reader: the client stopped \
                 reading for --stream-stall-timeout-s).",
            ),
            (
                PREFIX_QUERY_TOKENS,
                "Prompt tokens of admitted requests looked up in the prefix cache, per tenant.",
            ),
            (
                PREFIX_HIT_TOKENS,
                "Prompt tokens found in the prefix cache, per tenant and tier (hbm: reused in \
                 place; dram: copied in).",
            ),
            (
                PREFIX_BLOCKS,
                "KV blocks kept as prefix-cache entries, per tier (hbm, dram).",
            ),
            (
                TBT_ATTAINMENT,
                "Share of a tenant's token gaps within its TBT SLO.",
            ),
            (
                SLO_CHECKS,
                "SLO checks per tenant: admitted requests (slo=ttft; one that never got a first \
                 token is a miss) and token gaps (slo=tbt).",
            ),
            (
                TTFT_UNSERVED,
                "Admitted requests that ended without a first token, per tenant and reason \
                 (aborted, shed, deadline, stopped, failed, invalid); each is a TTFT miss.",
            ),
            (
                SLO_MET,
                "SLO checks that met the SLO, per tenant (slo=ttft, tbt); over the checks: \
                 attainment in any window, for burn-rate alerts.",
            ),
            (
                QUOTA_STORE_UP,
                "1 while the fleet's quota store (--quota-store) answers, 0 after a failed call.",
            ),
            (
                QUOTA_STORE_ERRORS,
                "Failed quota store calls, by kind (timeout, connection, server, lease_lost).",
            ),
            (
                QUOTA_STORE_FALLBACK,
                "Requests decided by the local limiter because the quota store did not answer \
                 (--quota-store-failure open).",
            ),
            (
                "superinfer_num_requests_running",
                "Requests in the running batch.",
            ),
            (
                "superinfer_num_requests_waiting",
                "Requests waiting for admission.",
            ),
            (
                "superinfer_num_requests_rotary",
                "Requests whose KV is in (or moving to or from) the DRAM tier.",
            ),
            (
                "superinfer_kv_usage_ratio",
                "Used share of a KV tier (hbm, dram).",
            ),
            ("superinfer_rotations_total", "Requests rotated out of HBM."),
            (
                "superinfer_engine_failures_total",
                "Panics that failed the engine thread (the process then exits for a restart).",
            ),
            (
                "superinfer_recomputes_total",
                "Requests whose KV was dropped to be prefilled again.",
            ),
            (
                "superinfer_shed_total",
                "Requests refused at submit because they would miss their TTFT SLO (--shed-late).",
            ),
            (
                "superinfer_transfer_bytes_total",
                "Bytes copied between the tiers (h2d, d2h).",
            ),
            (
                "superinfer_b_xfer_blocks",
                "Rotation budget B_xfer of the latest plan: blocks per iteration per direction.",
            ),
            (
                "superinfer_link_blocks_per_second",
                "Copy rate the automatic B_xfer uses: blocks/s per direction, both busy (0: fixed).",
            ),
            (
                "superinfer_step_cost_scale",
                "Measured over predicted step time as the step time budget learned it (1: as modelled).",
            ),
        ];
        for (name, text) in help.iter().chain(vllm::HELP) {
            r.describe_gauge((*name).into(), None, (*text).into());
        }
    }

    /// Handles for one tenant's series, labelled `tenant=<name>`.
    pub fn tenant(&self, name: &str) -> TenantMetrics {
        let t = name.to_string();
        self.with(|| {
            let finished = |reason: &'static str| {
                metrics::counter!(REQUESTS, "tenant" => t.clone(), "finish_reason" => reason)
            };
            TenantMetrics {
                name: t.clone(),
                ttft: metrics::histogram!(TTFT, "tenant" => t.clone()),
                itl: metrics::histogram!(ITL, "tenant" => t.clone()),
                e2e: metrics::histogram!(E2E, "tenant" => t.clone()),
                gpu_seconds: metrics::histogram!(GPU_SECONDS, "tenant" => t.clone()),
                host_seconds: HOST_WORK.map(|work| {
                    metrics::histogram!(HOST_SECONDS, "tenant" => t.clone(), "work" => work)
                }),
                admitted: [
                    metrics::counter!(ADMITTED, "tenant" => t.clone(), "unit" => "requests"),
                    metrics::counter!(ADMITTED, "tenant" => t.clone(), "unit" => "sequences"),
                ],
                prompt_tokens: metrics::counter!(PROMPT_TOKENS, "tenant" => t.clone()),
                generation_tokens: metrics::counter!(GENERATION_TOKENS, "tenant" => t.clone()),
                finished: [
                    finished("stop"),
                    finished("length"),
                    finished("abort"),
                    finished("error"),
                ],
                prefix_query_tokens: metrics::counter!(PREFIX_QUERY_TOKENS, "tenant" => t.clone()),
                prefix_hit_tokens: [
                    metrics::counter!(PREFIX_HIT_TOKENS, "tenant" => t.clone(), "tier" => "hbm"),
                    metrics::counter!(PREFIX_HIT_TOKENS, "tenant" => t.clone(), "tier" => "dram"),
                ],
                slo_checks: [
                    metrics::counter!(SLO_CHECKS, "tenant" => t.clone(), "slo" => "ttft"),
                    metrics::counter!(SLO_CHECKS, "tenant" => t.clone(), "slo" => "tbt"),
                ],
                slo_met: [
                    metrics::counter!(SLO_MET, "tenant" => t.clone(), "slo" => "ttft"),
                    metrics::counter!(SLO_MET, "tenant" => t.clone(), "slo" => "tbt"),
                ],
                ttft_unserved: UNSERVED_REASONS.map(|reason| {
                    metrics::counter!(TTFT_UNSERVED, "tenant" => t.clone(), "reason" => reason)
                }),
                ttft_attainment: metrics::gauge!(TTFT_ATTAINMENT, "tenant" => t.clone()),
                tbt_attainment: metrics::gauge!(TBT_ATTAINMENT, "tenant" => t.clone()),
            }
        })
    }

    /// Counts a refusal (auth, quota, validation, admission) of a known tenant.
    pub fn rejected(&self, tenant: &str, reason: &'static str) {
        let t = tenant.to_string();
        self.with(|| metrics::counter!(REJECTED, "tenant" => t, "reason" => reason).increment(1));
    }

    /// Counts a request shed on purpose (overload: a full queue, pool or connection limit,
    /// draining) by `reason`. Shedding is expected under load, so it is not an error: it is
    /// summarized at WARN at most once per [`SHED_LOG_PERIOD`] (with the first shed after the
    /// period), never one line per request.
    pub fn shed(&self, reason: &'static str) {
        self.shed_at(reason, Instant::now());
    }

    /// [`Metrics::shed`] at time `now` (tests pass their own clock).
    pub fn shed_at(&self, reason: &'static str, now: Instant) {
        self.with(|| metrics::counter!(SHED, "reason" => reason).increment(1));
        let mut w = self.shed_log.lock().unwrap_or_else(PoisonError::into_inner);
        *w.counts.entry(reason).or_insert(0) += 1;
        let elapsed = now.saturating_duration_since(w.since);
        if elapsed >= SHED_LOG_PERIOD {
            let total: u64 = w.counts.values().sum();
            let by_reason: Vec<String> =
                w.counts.iter().map(|(r, n)| format!("{r}: {n}")).collect();
            tracing::warn!(
                "shed {total} requests in the last {:.0} s ({}); see {SHED}",
                elapsed.as_secs_f64(),
                by_reason.join(", ")
            );
            w.counts.clear();
            w.since = now;
        }
    }

    /// Records the engine thread's failures (panics) so far.
    pub fn engine_failures(&self, failures: u64) {
        self.with(|| metrics::counter!("superinfer_engine_failures_total").absolute(failures));
    }

    /// Counts an answer that left before its usage record was on disk.
    pub fn ledger_late(&self) {
        self.with(|| metrics::counter!(LEDGER_LATE).increment(1));
    }

    /// Counts a stream the gateway aborted (`slow_reader`: its client stopped reading).
    pub fn stream_aborted(&self, reason: &'static str) {
        self.with(|| metrics::counter!(STREAMS_ABORTED, "reason" => reason).increment(1));
    }

    /// The Prometheus text, with the engine gauges as of `engine` (and their vLLM-named
    /// copies for the endpoint picker, labelled with the served `model`).
    pub fn render(&self, engine: &EngineStats, model: &str) -> String {
        self.with(|| {
            let ratio = |used: u32, cap: u32| {
                if cap == 0 {
                    0.0
                } else {
                    f64::from(used) / f64::from(cap)
                }
            };
            metrics::gauge!("superinfer_num_requests_running").set(engine.running as f64);
            metrics::gauge!("superinfer_num_requests_waiting").set(engine.waiting as f64);
            metrics::gauge!("superinfer_num_requests_rotary")
                .set((engine.rotary + engine.evicting + engine.restoring) as f64);
            metrics::gauge!("superinfer_kv_usage_ratio", "tier" => "hbm")
                .set(ratio(engine.hbm_used, engine.hbm_capacity));
            metrics::gauge!("superinfer_kv_usage_ratio", "tier" => "dram")
                .set(ratio(engine.dram_used, engine.dram_capacity));
            metrics::counter!("superinfer_rotations_total").absolute(engine.rotations_out);
            metrics::counter!("superinfer_recomputes_total").absolute(engine.recomputes);
            metrics::counter!("superinfer_shed_total").absolute(engine.shed);
            metrics::counter!("superinfer_transfer_bytes_total", "direction" => "h2d")
                .absolute(engine.bytes_h2d);
            metrics::counter!("superinfer_transfer_bytes_total", "direction" => "d2h")
                .absolute(engine.bytes_d2h);
            metrics::gauge!(PREFIX_BLOCKS, "tier" => "hbm")
                .set(f64::from(engine.prefix_hbm_blocks));
            metrics::gauge!(PREFIX_BLOCKS, "tier" => "dram")
                .set(f64::from(engine.prefix_dram_blocks));
            metrics::gauge!("superinfer_b_xfer_blocks").set(f64::from(engine.b_xfer));
            metrics::gauge!("superinfer_link_blocks_per_second").set(engine.link_blocks_per_s);
            metrics::gauge!("superinfer_step_cost_scale").set(engine.step_cost_scale);
            vllm::record(engine, model);
        });
        self.handle.run_upkeep();
        self.handle.render()
    }
}

/// One tenant's metric handles.
#[derive(Clone)]
pub struct TenantMetrics {
    pub name: String,
    pub ttft: Histogram,
    pub itl: Histogram,
    pub e2e: Histogram,
    /// GPU time of each sequence the engine ran (its share of its steps).
    pub gpu_seconds: Histogram,
    /// Host CPU time of each request, by [`HOST_WORK`].
    pub host_seconds: [Histogram; 2],
    /// What was submitted to the engine: requests, sequences.
    pub admitted: [Counter; 2],
    /// Prompt tokens of accepted requests, each prompt once (as `usage.prompt_tokens`).
    pub prompt_tokens: Counter,
    pub generation_tokens: Counter,
    /// By finish reason: stop, length, abort, error.
    pub finished: [Counter; 4],
    /// Prompt tokens of admitted requests (looked up in the prefix cache).
    pub prefix_query_tokens: Counter,
    /// Prompt tokens found in the prefix cache: in HBM, in DRAM.
    pub prefix_hit_tokens: [Counter; 2],
    /// SLO checks and those met: TTFT (one per admitted request: its first token, or none),
    /// TBT (one per token gap).
    pub slo_checks: [Counter; 2],
    pub slo_met: [Counter; 2],
    /// Admitted requests that ended without a first token, by [`UNSERVED_REASONS`].
    pub ttft_unserved: [Counter; 6],
    pub ttft_attainment: Gauge,
    pub tbt_attainment: Gauge,
}

impl std::fmt::Debug for TenantMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantMetrics")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Collects what the subscriber writes.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_flood_of_shed_requests_is_one_warn_line_per_period_and_counted() {
        let out = Captured::default();
        let w = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || w.clone())
            .with_ansi(false)
            .finish();
        let m = Metrics::new();
        let t0 = Instant::now();
        tracing::subscriber::with_default(subscriber, || {
            for i in 0..70_000u32 {
                // 70,000 sheds over 35 s of (fake) time.
                let at = t0 + Duration::from_micros(u64::from(i) * 500);
                m.shed_at(if i % 2 == 0 { "queue_full" } else { "slo" }, at);
            }
        });
        let log = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = log.lines().collect();
        assert_eq!(lines.len(), 3, "{log}");
        assert!(
            lines
                .iter()
                .all(|l| l.contains("WARN") && !l.contains("ERROR")),
            "{log}"
        );
        assert!(
            lines[1]
                .contains("shed 20000 requests in the last 10 s (queue_full: 10000, slo: 10000)"),
            "{log}"
        );
        let text = m.render(&EngineStats::default(), "m");
        assert!(
            text.contains(&format!("{SHED}{{reason=\"queue_full\"}} 35000")),
            "{text}"
        );
    }
}
