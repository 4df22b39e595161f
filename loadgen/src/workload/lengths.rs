//! Prompt and output lengths in tokens.
//!
//! `sharegpt` and `lmsys` are clipped lognormal fits to published statistics; the numbers and
//! their sources are in `docs/WORKLOADS.md`.

use crate::error::Error;
use rand::Rng;
use rand_distr::{Distribution, LogNormal};
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// A lognormal in tokens, given by its (unclipped) mean and the sigma of its logarithm.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenLognormal {
    pub mean: f64,
    pub sigma: f64,
}

impl TokenLognormal {
    /// The median, `exp(mu)` with `mu = ln(mean) - sigma^2 / 2`.
    pub fn median(&self) -> f64 {
        (self.mean.ln() - self.sigma * self.sigma / 2.0).exp()
    }

    fn distribution(&self, kind: &'static str, which: &str) -> Result<LogNormal<f64>, Error> {
        if !(self.mean.is_finite()
            && self.mean >= 1.0
            && self.sigma.is_finite()
            && self.sigma >= 0.0)
        {
            return Err(Error::Lengths {
                kind,
                problem: format!(
                    "{which} needs mean >= 1 and sigma >= 0, got mean {} sigma {}",
                    self.mean, self.sigma
                ),
            });
        }
        LogNormal::new(self.median().ln(), self.sigma).map_err(|e| Error::Lengths {
            kind,
            problem: format!("{which}: {e}"),
        })
    }
}

/// ShareGPT_V3 first turns as sampled by vLLM's serving benchmark (docs/WORKLOADS.md).
pub const SHAREGPT_PROMPT: TokenLognormal = TokenLognormal {
    mean: 271.0,
    sigma: 1.0,
};
pub const SHAREGPT_OUTPUT: TokenLognormal = TokenLognormal {
    mean: 281.0,
    sigma: 0.9,
};
/// LMSYS-Chat-1M turns (docs/WORKLOADS.md).
pub const LMSYS_PROMPT: TokenLognormal = TokenLognormal {
    mean: 69.5,
    sigma: 1.0,
};
pub const LMSYS_OUTPUT: TokenLognormal = TokenLognormal {
    mean: 214.5,
    sigma: 0.84,
};

/// Where a tenant's prompt and output lengths come from. In TOML either a name
/// (`dataset = "sharegpt"`) or a table (`dataset = { kind = "fixed", prompt = 512, output = 128 }`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum LengthSpec {
    /// ShareGPT-like: clipped lognormals fitted to ShareGPT_V3.
    Sharegpt,
    /// LMSYS-like: clipped lognormals fitted to LMSYS-Chat-1M.
    Lmsys,
    /// Every request has the same lengths.
    Fixed { prompt: u32, output: u32 },
    /// Any clipped lognormal pair.
    Lognormal {
        prompt: TokenLognormal,
        output: TokenLognormal,
    },
    /// Samples (with replacement) from a JSONL file of
    /// `{"prompt_tokens": <n>, "output_tokens": <n>}` lines.
    Trace { path: PathBuf },
    /// The lengths of a replayed trace's rows (a replay workload's tenants; not written in a
    /// tenants file).
    #[serde(skip)]
    Replay,
}

/// Clipping bounds: prompts to `1..=max_prompt_tokens`, outputs to `1..=max_output_tokens`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LengthLimits {
    pub max_prompt_tokens: u32,
    pub max_output_tokens: u32,
}

impl Default for LengthLimits {
    fn default() -> Self {
        LengthLimits {
            max_prompt_tokens: 4096,
            max_output_tokens: 2048,
        }
    }
}

impl LengthSpec {
    pub fn is_replay(&self) -> bool {
        matches!(self, LengthSpec::Replay)
    }

    pub fn kind(&self) -> &'static str {
        match self {
            LengthSpec::Sharegpt => "sharegpt",
            LengthSpec::Lmsys => "lmsys",
            LengthSpec::Fixed { .. } => "fixed",
            LengthSpec::Lognormal { .. } => "lognormal",
            LengthSpec::Trace { .. } => "trace",
            LengthSpec::Replay => "replay",
        }
    }

    /// Builds a sampler; reads a trace file once. Fails on out-of-range parameters.
    pub fn sampler(&self, limits: LengthLimits) -> Result<LengthSampler, Error> {
        let kind = self.kind();
        if limits.max_prompt_tokens == 0 || limits.max_output_tokens == 0 {
            return Err(Error::Lengths {
                kind,
                problem: "max_prompt_tokens and max_output_tokens must be at least 1".into(),
            });
        }
        let source = match self {
            LengthSpec::Sharegpt => lognormal_pair(kind, SHAREGPT_PROMPT, SHAREGPT_OUTPUT)?,
            LengthSpec::Lmsys => lognormal_pair(kind, LMSYS_PROMPT, LMSYS_OUTPUT)?,
            LengthSpec::Lognormal { prompt, output } => lognormal_pair(kind, *prompt, *output)?,
            LengthSpec::Fixed { prompt, output } => {
                if *prompt == 0 || *output == 0 {
                    return Err(Error::Lengths {
                        kind,
                        problem: format!(
                            "prompt and output must be at least 1 token, got {prompt} and {output}"
                        ),
                    });
                }
                Source::Fixed(*prompt, *output)
            }
            LengthSpec::Trace { path } => Source::Trace(read_length_trace(path)?),
            LengthSpec::Replay => {
                return Err(Error::Lengths {
                    kind,
                    problem: "a replayed trace's lengths are its rows', not drawn".into(),
                })
            }
        };
        Ok(LengthSampler { source, limits })
    }

    /// A relative trace path is taken relative to `dir` (the tenants file's folder).
    pub(crate) fn resolve_paths(&mut self, dir: &Path) {
        if let LengthSpec::Trace { path } = self {
            if path.is_relative() {
                *path = dir.join(&*path);
            }
        }
    }
}

fn lognormal_pair(
    kind: &'static str,
    p: TokenLognormal,
    o: TokenLognormal,
) -> Result<Source, Error> {
    Ok(Source::Lognormal(
        p.distribution(kind, "prompt")?,
        o.distribution(kind, "output")?,
    ))
}

/// Command-line spelling: `sharegpt`, `lmsys`, `fixed:PROMPT:OUTPUT`, `trace:PATH`.
impl FromStr for LengthSpec {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        let unknown = || Error::UnknownDataset(s.to_string());
        let lower = s.trim().to_ascii_lowercase();
        match lower.as_str() {
            "sharegpt" => return Ok(LengthSpec::Sharegpt),
            "lmsys" => return Ok(LengthSpec::Lmsys),
            _ => {}
        }
        if let Some(rest) = s.trim().strip_prefix("trace:") {
            if rest.is_empty() {
                return Err(unknown());
            }
            return Ok(LengthSpec::Trace { path: rest.into() });
        }
        if let Some(rest) = lower.strip_prefix("fixed:") {
            let (p, o) = rest.split_once(':').ok_or_else(unknown)?;
            let prompt = p.parse().map_err(|_| unknown())?;
            let output = o.parse().map_err(|_| unknown())?;
            return Ok(LengthSpec::Fixed { prompt, output });
        }
        Err(unknown())
    }
}

/// The TOML form: a dataset name, or a table with a `kind`.
pub(crate) fn deserialize_dataset<'de, D: Deserializer<'de>>(d: D) -> Result<LengthSpec, D::Error> {
    struct DatasetVisitor;

    impl<'de> Visitor<'de> for DatasetVisitor {
        type Value = LengthSpec;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a dataset name (\"sharegpt\", \"lmsys\") or a table with a `kind`")
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<LengthSpec, E> {
            v.parse().map_err(E::custom)
        }

        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<LengthSpec, A::Error> {
            LengthSpec::deserialize(de::value::MapAccessDeserializer::new(map))
        }
    }

    d.deserialize_any(DatasetVisitor)
}

enum Source {
    Lognormal(LogNormal<f64>, LogNormal<f64>),
    Fixed(u32, u32),
    Trace(Vec<(u32, u32)>),
}

/// Draws `(prompt_tokens, output_tokens)` pairs, clipped to the limits.
pub struct LengthSampler {
    source: Source,
    limits: LengthLimits,
}

impl LengthSampler {
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> (u32, u32) {
        let (p, o) = match &self.source {
            Source::Lognormal(p, o) => (round_tokens(p.sample(rng)), round_tokens(o.sample(rng))),
            Source::Fixed(p, o) => (*p, *o),
            Source::Trace(entries) => entries[rng.random_range(0..entries.len())],
        };
        (
            p.clamp(1, self.limits.max_prompt_tokens),
            o.clamp(1, self.limits.max_output_tokens),
        )
    }
}

fn round_tokens(x: f64) -> u32 {
    // `as` saturates, so huge draws land on u32::MAX and are clipped by the caller.
    x.round() as u32
}

#[derive(Deserialize)]
struct TraceLengths {
    prompt_tokens: u32,
    output_tokens: u32,
}

fn read_length_trace(path: &Path) -> Result<Vec<(u32, u32)>, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let mut entries = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let e: TraceLengths = serde_json::from_str(line).map_err(|e| Error::TraceLine {
            path: path.to_path_buf(),
            line: i + 1,
            problem: e.to_string(),
        })?;
        entries.push((e.prompt_tokens, e.output_tokens));
    }
    if entries.is_empty() {
        return Err(Error::EmptyTrace {
            path: path.to_path_buf(),
        });
    }
    Ok(entries)
}

#[cfg(test)]
mod tests;
