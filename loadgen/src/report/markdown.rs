//! `summary.md`: one table of all runs, then a per-tenant table per run.

use super::meta::ReportMeta;
use super::{RunSummary, Summary};
use std::fmt::Write;

/// Renders the summary as Markdown.
pub fn render(summary: &Summary, meta: &ReportMeta) -> String {
    let mut s = String::new();
    s.push_str("# SuperInfer load generator: sweep summary\n\n");
    if !meta.command.is_empty() {
        let _ = writeln!(s, "Command: `{}`\n", meta.command);
    }
    for (k, v) in &meta.context {
        let _ = writeln!(s, "- {k}: {v}");
    }
    if !meta.context.is_empty() {
        s.push('\n');
    }
    s.push_str(
        "Attainment: TTFT = share of requests with a first token within the tenant's TTFT SLO \
         (unserved = miss); TBT = share of inter-token gaps within the TBT SLO. Definitions in \
         docs/WORKLOADS.md.\n\n",
    );
    s.push_str("## Runs\n\n");
    s.push_str(
        "| policy | RPS | TTFT att. [95% CI] | TBT att. [95% CI] | TTFT p50/p90/p99 (s) \
         | TBT p50/p90/p99 (ms) | TPOT p50/p99 (ms) | tokens/s | goodput (req/s) | Jain | Jain att. \
         | max wait (s) | max stall (s) | finished/submitted | unserved | preemptions |\n",
    );
    s.push_str(
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in &summary.runs {
        run_row(&mut s, r);
    }
    cache_table(&mut s, summary);
    replay_section(&mut s, summary);
    for r in &summary.runs {
        tenant_table(&mut s, r);
    }
    s
}

/// A replayed trace: the file, what was left out, offered / refused / completed and the
/// ideal against the achieved prefix-hit rate, per run.
fn replay_section(s: &mut String, summary: &Summary) {
    for r in &summary.runs {
        let Some(rp) = &r.replay else { continue };
        let _ = writeln!(
            s,
            "
## {} at {:.2} RPS: the trace
",
            r.policy, r.rps
        );
        s.push_str(&rp.markdown());
        let refused: Vec<String> = r
            .refused
            .iter()
            .map(|(k, v)| format!("{v} × {k}"))
            .collect();
        let _ = writeln!(
            s,
            "- requests: {} offered, {} refused before a first token ({}), {} completed",
            r.submitted,
            r.refused.values().sum::<u64>(),
            if refused.is_empty() {
                "none".into()
            } else {
                refused.join(", ")
            },
            r.finished,
        );
    }
}

/// An optional count or rate as text: `?` when not known.
fn known<T>(x: Option<T>, f: impl Fn(T) -> String) -> String {
    x.map_or("?".into(), f)
}

/// The prefix cache of every run: hit rate, prompt and cached tokens by tier, prefill tokens
/// computed (where the target sees them).
fn cache_table(s: &mut String, summary: &Summary) {
    s.push_str(
        "\n## Prefix cache\n\nHit rate = cached prompt tokens / prompt tokens of the requests \
         whose cached count is known (? = the server did not say); cached tokens are prefill \
         tokens saved.\n\n",
    );
    s.push_str(
        "| policy | RPS | hit rate | prompt tokens | known / requests | cached (saved) \
         | HBM | DRAM | prefill computed |\n",
    );
    s.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for r in &summary.runs {
        let c = &r.cache;
        let _ = writeln!(
            s,
            "| {} | {:.2} | {} | {} | {}/{} | {} | {} | {} | {} |",
            r.policy,
            r.rps,
            known(c.hit_rate, pct),
            c.prompt_tokens,
            c.known_requests,
            r.submitted,
            c.cached_tokens,
            known(c.cached_hbm_tokens, |x| x.to_string()),
            known(c.cached_dram_tokens, |x| x.to_string()),
            known(r.prefill_tokens_computed, |x| x.to_string()),
        );
    }
}

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

fn run_row(s: &mut String, r: &RunSummary) {
    let _ = writeln!(
        s,
        "| {} | {:.2} | {} [{}, {}] | {} [{}, {}] | {:.2}/{:.2}/{:.2} | {:.0}/{:.0}/{:.0} \
         | {:.0}/{:.0} | {:.0} | {:.2} | {:.3} | {:.3} | {:.2} | {:.2} | {}/{} | {} | {} |",
        r.policy,
        r.rps,
        pct(r.ttft_attainment),
        pct(r.ttft_attainment_ci95.lo),
        pct(r.ttft_attainment_ci95.hi),
        pct(r.tbt_attainment),
        pct(r.tbt_attainment_ci95.lo),
        pct(r.tbt_attainment_ci95.hi),
        r.p50_ttft_s,
        r.p90_ttft_s,
        r.p99_ttft_s,
        1e3 * r.p50_tbt_s,
        1e3 * r.p90_tbt_s,
        1e3 * r.p99_tbt_s,
        1e3 * r.p50_tpot_s,
        1e3 * r.p99_tpot_s,
        r.throughput_tokens_per_s,
        r.goodput_rps,
        r.jain,
        r.jain_attainment,
        r.max_wait_s,
        r.max_stall_s,
        r.finished,
        r.submitted,
        r.unserved,
        r.preemptions,
    );
}

fn tenant_table(s: &mut String, r: &RunSummary) {
    let _ = writeln!(s, "\n## {} at {:.2} RPS: tenants\n", r.policy, r.rps);
    s.push_str(
        "| tenant | weight | weight share | served tokens | share | GPU time share | TTFT att. \
         | TBT att. | p99 TTFT (s) | finished/submitted | refused | prompt tokens | cached \
         | hit rate |\n",
    );
    s.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for t in &r.tenants {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.2} | {}/{} | {} | {} | {} | {} |",
            t.name,
            t.weight,
            pct(t.weight_share),
            t.served_tokens,
            pct(t.share),
            known(t.gpu_share, pct),
            pct(t.ttft_attainment),
            pct(t.tbt_attainment),
            t.p99_ttft_s,
            t.finished,
            t.submitted,
            t.refused,
            t.cache.prompt_tokens,
            t.cache.cached_tokens,
            known(t.cache.hit_rate, pct),
        );
    }
}
