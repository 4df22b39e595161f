//! Per-request outcomes and the statistics built from them: percentiles, Jain's index,
//! bootstrap confidence intervals. Definitions are in `docs/WORKLOADS.md`.

use crate::record::RequestRecord;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// What one request experienced, judged against its tenant's SLOs.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    pub tenant: usize,
    /// Time to first token; `None` if never served.
    pub ttft_s: Option<f64>,
    /// `ttft_s`, or for an unserved request how long it waited: until the target refused or
    /// shed it (its `finish_s`), else until the end of the run (a lower bound).
    pub ttft_censored_s: f64,
    pub ttft_met: bool,
    /// Inter-token gaps (see [`judge`] for the open gap at the end of the run).
    pub gaps_s: Vec<f64>,
    pub gaps_met: u32,
    /// Longest pause between tokens, the open one at the end of the run included.
    pub max_stall_s: f64,
    /// Longest time spent waiting for service: for a first token, or between two tokens.
    pub max_wait_s: f64,
    /// Prompt tokens (once served) plus generated tokens.
    pub served_tokens: u64,
    pub generated_tokens: u64,
    pub finished: bool,
    pub preemptions: u32,
}

impl Outcome {
    pub fn gaps_total(&self) -> u32 {
        self.gaps_s.len() as u32
    }

    /// Met the TTFT SLO and every gap met the TBT SLO.
    pub fn good(&self) -> bool {
        self.ttft_met && self.gaps_met == self.gaps_total()
    }
}

/// Judges one record. A request that started but neither finished nor produced a token
/// since `last` by `end_s` has an *open* gap `end_s - last`: it counts toward the stall and
/// wait maxima, and, once it already exceeds the TBT SLO, as one missed gap (like an
/// unserved request counts as a TTFT miss).
pub fn judge(r: &RequestRecord, ttft_slo_s: f64, tbt_slo_s: f64, end_s: f64) -> Outcome {
    let ttft_s = r.first_token_s.map(|t| t - r.arrival_s);
    // Unserved: the client waited until the target refused or shed it, else to the end.
    let ttft_censored_s = ttft_s
        .unwrap_or(r.finish_s.unwrap_or(end_s) - r.arrival_s)
        .max(0.0);
    let mut gaps_s: Vec<f64> = r.gaps().collect();
    let mut max_stall_s = gaps_s.iter().copied().fold(0.0, f64::max);
    let last = r.token_times_s.last().copied().or(r.first_token_s);
    let unfinished = r.finish_s.is_none() && r.generated_tokens < r.output_tokens;
    if let (Some(last), true) = (last, unfinished) {
        let open = (end_s - last).max(0.0);
        max_stall_s = max_stall_s.max(open);
        if open > tbt_slo_s {
            gaps_s.push(open);
        }
    }
    let gaps_met = gaps_s.iter().filter(|&&g| g <= tbt_slo_s).count() as u32;
    let served_prompt = if r.first_token_s.is_some() {
        u64::from(r.prompt_tokens)
    } else {
        0
    };
    Outcome {
        tenant: r.tenant,
        ttft_s,
        ttft_censored_s,
        ttft_met: ttft_s.is_some_and(|t| t <= ttft_slo_s),
        gaps_met,
        max_wait_s: ttft_censored_s.max(max_stall_s),
        max_stall_s,
        gaps_s,
        served_tokens: served_prompt + u64::from(r.generated_tokens),
        generated_tokens: u64::from(r.generated_tokens),
        finished: r.finish_s.is_some(),
        preemptions: r.preemptions,
    }
}

/// Share of requests that met the TTFT SLO; 1 when there are none.
pub fn ttft_attainment<'a>(outcomes: impl IntoIterator<Item = &'a Outcome>) -> f64 {
    let (met, n) = outcomes
        .into_iter()
        .fold((0u64, 0u64), |(m, n), o| (m + u64::from(o.ttft_met), n + 1));
    ratio(met, n)
}

/// Share of gaps, pooled over requests, within the TBT SLO; 1 when there are none.
pub fn tbt_attainment<'a>(outcomes: impl IntoIterator<Item = &'a Outcome>) -> f64 {
    let (met, n) = outcomes.into_iter().fold((0u64, 0u64), |(m, n), o| {
        (m + u64::from(o.gaps_met), n + u64::from(o.gaps_total()))
    });
    ratio(met, n)
}

fn ratio(num: u64, den: u64) -> f64 {
    if den == 0 {
        1.0
    } else {
        num as f64 / den as f64
    }
}

/// Percentile `q` in `[0, 1]` of sorted data, linear between closest ranks; 0 when empty.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    match sorted.len() {
        0 => 0.0,
        n => {
            let pos = q.clamp(0.0, 1.0) * (n - 1) as f64;
            let lo = pos.floor() as usize;
            let hi = pos.ceil() as usize;
            sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
        }
    }
}

/// Jain's fairness index `(sum x)^2 / (n * sum x^2)`: 1 when all equal, `1/n` when one takes
/// all. 1 for no values or all zeros.
pub fn jain(xs: &[f64]) -> f64 {
    let sum: f64 = xs.iter().sum();
    let sum_sq: f64 = xs.iter().map(|x| x * x).sum();
    if xs.is_empty() || sum_sq == 0.0 {
        1.0
    } else {
        sum * sum / (xs.len() as f64 * sum_sq)
    }
}

/// A 95% confidence interval.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Ci95 {
    pub lo: f64,
    pub hi: f64,
}

/// Percentile-bootstrap 95% intervals of TTFT and TBT attainment, resampling requests with
/// replacement (`resamples` times, from a fixed `seed`).
pub fn bootstrap_attainment(outcomes: &[Outcome], resamples: usize, seed: u64) -> (Ci95, Ci95) {
    if outcomes.is_empty() || resamples == 0 {
        let point = Ci95 { lo: 1.0, hi: 1.0 };
        return (point, point);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let n = outcomes.len();
    let mut ttft = Vec::with_capacity(resamples);
    let mut tbt = Vec::with_capacity(resamples);
    for _ in 0..resamples {
        let (mut met, mut gaps_met, mut gaps) = (0u64, 0u64, 0u64);
        for _ in 0..n {
            let o = &outcomes[rng.random_range(0..n)];
            met += u64::from(o.ttft_met);
            gaps_met += u64::from(o.gaps_met);
            gaps += u64::from(o.gaps_total());
        }
        ttft.push(ratio(met, n as u64));
        tbt.push(ratio(gaps_met, gaps));
    }
    (interval(&mut ttft), interval(&mut tbt))
}

fn interval(samples: &mut [f64]) -> Ci95 {
    samples.sort_by(f64::total_cmp);
    Ci95 {
        lo: percentile(samples, 0.025),
        hi: percentile(samples, 0.975),
    }
}

#[cfg(test)]
mod tests;
