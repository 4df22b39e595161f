//! Arrival processes: when requests arrive, in seconds from the start of the run.
//!
//! Every process starts empty at `t = 0` and returns sorted times in `[0, duration_s)`.
//! Definitions and parameter meanings are in `docs/WORKLOADS.md`.

use crate::error::Error;
use rand::Rng;
use rand_distr::{Distribution, Exp, Gamma};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// One tenant's arrival process.
///
/// Hawkes: conditional intensity
/// `lambda(t) = baseline_rps + sum_{t_i < t} excitation * decay_per_s * exp(-decay_per_s * (t - t_i))`.
/// Each arrival's kernel integrates to `excitation`, so `excitation` is the branching ratio `n`
/// (expected direct offspring per arrival); it must be `< 1`, and the stationary mean rate is
/// `baseline_rps / (1 - n)`. Simulated exactly by Ogata thinning.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum ArrivalSpec {
    /// Exponential inter-arrival times at `rps`.
    Poisson { rps: f64 },
    /// Gamma inter-arrival times with mean `1/rps` and coefficient of variation `cv`
    /// (`cv = 1`: Poisson; `cv > 1`: bursty; `cv < 1`: more regular).
    Gamma { rps: f64, cv: f64 },
    /// Self-exciting process with an exponential kernel (see the type's docs).
    Hawkes {
        baseline_rps: f64,
        excitation: f64,
        decay_per_s: f64,
    },
    /// Alternating bursts: Poisson at `rps_on` for `on_s` seconds, then silence for `off_s`,
    /// starting with an on period at `t = 0`.
    #[serde(alias = "on_off")]
    OnOff { rps_on: f64, on_s: f64, off_s: f64 },
    /// Replay of a JSONL file whose lines hold `{"arrival_s": <seconds>}` (other fields are
    /// ignored). Times are divided by `time_scale` (2.0 replays twice as fast).
    Trace {
        path: PathBuf,
        #[serde(default = "one")]
        time_scale: f64,
    },
    /// The arrivals of a replayed trace's rows (a replay workload's tenants; not written in a
    /// tenants file): `rps` is the tenant's mean rate in the replay.
    #[serde(skip)]
    Replay { rps: f64 },
}

fn one() -> f64 {
    1.0
}

impl ArrivalSpec {
    /// A replay tenant's arrivals, before the replay sets its rate.
    pub(crate) fn replay() -> ArrivalSpec {
        ArrivalSpec::Replay { rps: 0.0 }
    }

    pub fn is_replay(&self) -> bool {
        matches!(self, ArrivalSpec::Replay { .. })
    }

    /// The process's name as written in `kind`.
    pub fn kind(&self) -> &'static str {
        match self {
            ArrivalSpec::Poisson { .. } => "poisson",
            ArrivalSpec::Gamma { .. } => "gamma",
            ArrivalSpec::Hawkes { .. } => "hawkes",
            ArrivalSpec::OnOff { .. } => "onoff",
            ArrivalSpec::Trace { .. } => "trace",
            ArrivalSpec::Replay { .. } => "replay",
        }
    }

    /// Checks every parameter's range. Hawkes needs `excitation < 1` for a finite mean rate.
    pub fn validate(&self) -> Result<(), Error> {
        let kind = self.kind();
        match *self {
            ArrivalSpec::Poisson { rps } => positive(kind, "rps", rps),
            ArrivalSpec::Gamma { rps, cv } => {
                positive(kind, "rps", rps)?;
                positive(kind, "cv", cv)
            }
            ArrivalSpec::Hawkes {
                baseline_rps,
                excitation,
                decay_per_s,
            } => {
                positive(kind, "baseline_rps", baseline_rps)?;
                positive(kind, "decay_per_s", decay_per_s)?;
                if !(excitation.is_finite() && (0.0..1.0).contains(&excitation)) {
                    return Err(Error::Arrivals {
                        kind,
                        problem: format!(
                            "excitation is the branching ratio and must be in [0, 1) for a \
                             stable process (mean rate = baseline_rps / (1 - excitation)), \
                             got {excitation}"
                        ),
                    });
                }
                Ok(())
            }
            ArrivalSpec::OnOff {
                rps_on,
                on_s,
                off_s,
            } => {
                positive(kind, "rps_on", rps_on)?;
                positive(kind, "on_s", on_s)?;
                if !(off_s.is_finite() && off_s >= 0.0) {
                    return Err(Error::Arrivals {
                        kind,
                        problem: format!("off_s must be >= 0 and finite, got {off_s}"),
                    });
                }
                Ok(())
            }
            ArrivalSpec::Trace { time_scale, .. } => positive(kind, "time_scale", time_scale),
            ArrivalSpec::Replay { .. } => Ok(()),
        }
    }

    /// Long-run mean arrival rate in requests per second. For a trace: entries over the span
    /// from 0 to the last arrival (after `time_scale`); reads the file.
    pub fn mean_rps(&self) -> Result<f64, Error> {
        self.validate()?;
        Ok(match self {
            ArrivalSpec::Poisson { rps } | ArrivalSpec::Gamma { rps, .. } => *rps,
            ArrivalSpec::Hawkes {
                baseline_rps,
                excitation,
                ..
            } => baseline_rps / (1.0 - excitation),
            ArrivalSpec::OnOff {
                rps_on,
                on_s,
                off_s,
            } => rps_on * on_s / (on_s + off_s),
            ArrivalSpec::Trace { path, time_scale } => {
                let times = read_trace(path)?;
                let last = times.last().copied().unwrap_or(0.0) / time_scale;
                if last <= 0.0 {
                    return Err(Error::EmptyTrace { path: path.clone() });
                }
                times.len() as f64 / last
            }
            ArrivalSpec::Replay { rps } => *rps,
        })
    }

    /// The same process with its mean rate multiplied by `factor` (> 0); burstiness (cv,
    /// branching ratio, on/off durations) is unchanged. A trace is replayed faster instead.
    pub fn scaled(&self, factor: f64) -> ArrivalSpec {
        match self.clone() {
            ArrivalSpec::Poisson { rps } => ArrivalSpec::Poisson { rps: rps * factor },
            ArrivalSpec::Gamma { rps, cv } => ArrivalSpec::Gamma {
                rps: rps * factor,
                cv,
            },
            ArrivalSpec::Hawkes {
                baseline_rps,
                excitation,
                decay_per_s,
            } => ArrivalSpec::Hawkes {
                baseline_rps: baseline_rps * factor,
                excitation,
                decay_per_s,
            },
            ArrivalSpec::OnOff {
                rps_on,
                on_s,
                off_s,
            } => ArrivalSpec::OnOff {
                rps_on: rps_on * factor,
                on_s,
                off_s,
            },
            ArrivalSpec::Trace { path, time_scale } => ArrivalSpec::Trace {
                path,
                time_scale: time_scale * factor,
            },
            ArrivalSpec::Replay { rps } => ArrivalSpec::Replay { rps: rps * factor },
        }
    }

    /// A relative trace path is taken relative to `dir` (the tenants file's folder).
    pub(crate) fn resolve_paths(&mut self, dir: &Path) {
        if let ArrivalSpec::Trace { path, .. } = self {
            if path.is_relative() {
                *path = dir.join(&*path);
            }
        }
    }

    /// Arrival times in `[0, duration_s)`, sorted. Deterministic for a given `rng` state.
    pub fn generate<R: Rng + ?Sized>(
        &self,
        duration_s: f64,
        rng: &mut R,
    ) -> Result<Vec<f64>, Error> {
        self.validate()?;
        if !(duration_s.is_finite() && duration_s > 0.0) {
            return Err(Error::Duration(duration_s));
        }
        Ok(match *self {
            ArrivalSpec::Poisson { rps } => renewal(duration_s, rng, &exp(rps)),
            ArrivalSpec::Gamma { rps, cv } => {
                let shape = 1.0 / (cv * cv);
                let gamma =
                    Gamma::new(shape, 1.0 / (rps * shape)).map_err(|e| Error::Arrivals {
                        kind: "gamma",
                        problem: e.to_string(),
                    })?;
                renewal(duration_s, rng, &gamma)
            }
            ArrivalSpec::Hawkes {
                baseline_rps,
                excitation,
                decay_per_s,
            } => hawkes(baseline_rps, excitation, decay_per_s, duration_s, rng),
            ArrivalSpec::OnOff {
                rps_on,
                on_s,
                off_s,
            } => on_off(rps_on, on_s, off_s, duration_s, rng),
            ArrivalSpec::Trace {
                ref path,
                time_scale,
            } => read_trace(path)?
                .into_iter()
                .map(|t| t / time_scale)
                .take_while(|&t| t < duration_s)
                .collect(),
            ArrivalSpec::Replay { .. } => {
                return Err(Error::Arrivals {
                    kind: "replay",
                    problem: "a replayed trace's arrivals are its rows, not drawn".into(),
                })
            }
        })
    }
}

fn positive(kind: &'static str, name: &str, v: f64) -> Result<(), Error> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(Error::Arrivals {
            kind,
            problem: format!("{name} must be positive and finite, got {v}"),
        })
    }
}

fn exp(rate: f64) -> Exp<f64> {
    Exp::new(rate).expect("rate was validated positive and finite")
}

/// A renewal process: i.i.d. gaps from `gap`, the first one measured from `t = 0`.
fn renewal<R: Rng + ?Sized, D: Distribution<f64>>(
    duration_s: f64,
    rng: &mut R,
    gap: &D,
) -> Vec<f64> {
    let mut times = Vec::new();
    let mut t = gap.sample(rng);
    while t < duration_s {
        times.push(t);
        t += gap.sample(rng);
    }
    times
}

/// Ogata thinning. Between arrivals the intensity only decays, so its value right after the
/// last event (or candidate) bounds it until the next one.
fn hawkes<R: Rng + ?Sized>(mu: f64, n: f64, beta: f64, duration_s: f64, rng: &mut R) -> Vec<f64> {
    let mut times = Vec::new();
    let mut t = 0.0;
    // The self-excited part of the intensity at time `t` (the last candidate).
    let mut excited = 0.0_f64;
    loop {
        let bound = mu + excited;
        let wait = exp(bound).sample(rng);
        t += wait;
        if t >= duration_s {
            return times;
        }
        excited *= (-beta * wait).exp();
        if rng.random::<f64>() * bound <= mu + excited {
            times.push(t);
            excited += n * beta;
        }
    }
}

fn on_off<R: Rng + ?Sized>(
    rps_on: f64,
    on_s: f64,
    off_s: f64,
    duration_s: f64,
    rng: &mut R,
) -> Vec<f64> {
    let period = on_s + off_s;
    let gap = exp(rps_on);
    // A Poisson process restricted to the on windows: run it on "on-time" and map each
    // on-time instant to wall time by inserting the off windows.
    let mut times = Vec::new();
    let mut on_time = gap.sample(rng);
    loop {
        let cycle = (on_time / on_s).floor();
        let t = cycle * period + (on_time - cycle * on_s);
        if t >= duration_s {
            return times;
        }
        times.push(t);
        on_time += gap.sample(rng);
    }
}

#[derive(Deserialize)]
struct TraceArrival {
    arrival_s: f64,
}

/// Reads a JSONL arrival trace; blank lines are skipped, times must be finite and >= 0.
/// Returned sorted.
pub(crate) fn read_trace(path: &Path) -> Result<Vec<f64>, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let mut times = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let entry: TraceArrival = serde_json::from_str(line).map_err(|e| Error::TraceLine {
            path: path.to_path_buf(),
            line: i + 1,
            problem: e.to_string(),
        })?;
        if !(entry.arrival_s.is_finite() && entry.arrival_s >= 0.0) {
            return Err(Error::TraceLine {
                path: path.to_path_buf(),
                line: i + 1,
                problem: format!("arrival_s must be >= 0 and finite, got {}", entry.arrival_s),
            });
        }
        times.push(entry.arrival_s);
    }
    if times.is_empty() {
        return Err(Error::EmptyTrace {
            path: path.to_path_buf(),
        });
    }
    times.sort_by(f64::total_cmp);
    Ok(times)
}

#[cfg(test)]
mod tests;
