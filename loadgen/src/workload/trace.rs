//! Production trace files in their publishers' formats, read row by row: one request per row,
//! with its own arrival time, prompt length, output length and (Mooncake) prompt block ids.
//!
//! | format | file | columns |
//! |---|---|---|
//! | `azure` | Azure LLM inference trace 2023 / 2024 (CSV) | `TIMESTAMP,ContextTokens,GeneratedTokens`; the timestamp is a date and time (`2023-11-16 18:15:46.6805900`, 2024 adds `+00:00`) |
//! | `mooncake` | Mooncake traces (JSONL) | `timestamp` (ms), `input_length`, `output_length`, `hash_ids` (one id per 512-token block) |
//! | `burstgpt` | BurstGPT (CSV) | `Timestamp` (s), `Model`, `Request tokens`, `Response tokens`, `Total tokens`, `Log Type` |
//! | `jsonl` | this project's (JSONL) | `arrival_s`, `prompt_tokens`, `output_tokens`, optional `hash_ids` and `tenant` |
//!
//! The replay built from the rows is in [`super::replay`]; `docs/WORKLOADS.md` has the options.

use crate::error::Error;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// The formats [`read`] knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TraceFormat {
    Azure,
    Mooncake,
    Burstgpt,
    Jsonl,
}

impl TraceFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            TraceFormat::Azure => "azure",
            TraceFormat::Mooncake => "mooncake",
            TraceFormat::Burstgpt => "burstgpt",
            TraceFormat::Jsonl => "jsonl",
        }
    }

    /// The format of a file from its first line: a CSV header or a JSON object's fields.
    pub fn detect(first_line: &str) -> Option<TraceFormat> {
        let l = first_line.trim_start_matches('\u{feff}').trim();
        if l.starts_with('{') {
            let v: Value = serde_json::from_str(l).ok()?;
            return if v.get("input_length").is_some() || v.get("hash_ids").is_some() {
                Some(TraceFormat::Mooncake)
            } else if v.get("arrival_s").is_some() {
                Some(TraceFormat::Jsonl)
            } else {
                None
            };
        }
        let header: Vec<&str> = l.split(',').map(str::trim).collect();
        if header.contains(&"ContextTokens") {
            Some(TraceFormat::Azure)
        } else if header.contains(&"Request tokens") {
            Some(TraceFormat::Burstgpt)
        } else {
            None
        }
    }
}

impl fmt::Display for TraceFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TraceFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "azure" => Ok(TraceFormat::Azure),
            "mooncake" => Ok(TraceFormat::Mooncake),
            "burstgpt" => Ok(TraceFormat::Burstgpt),
            "jsonl" => Ok(TraceFormat::Jsonl),
            other => Err(format!(
                "unknown trace format '{other}': expected azure, mooncake, burstgpt or jsonl"
            )),
        }
    }
}

/// One row of a trace: one request.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceRow {
    /// 1-based line of the file.
    pub line: usize,
    /// Seconds after the file's first timestamp, before any scaling.
    pub time_s: f64,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    /// Mooncake's (and ours, optionally): the prompt's block ids in order.
    pub hash_ids: Option<Vec<u64>>,
    /// The value of the column tenants are assigned by, when one was asked for.
    pub key: Option<String>,
}

/// A whole trace file, rows in file order.
#[derive(Clone, Debug)]
pub struct TraceFile {
    pub path: PathBuf,
    pub format: TraceFormat,
    /// SHA-256 of the file's bytes, hex.
    pub sha256: String,
    pub rows: Vec<TraceRow>,
    /// The timestamps' resolution in seconds: the largest step every timestamp is a multiple
    /// of (Mooncake's conversation trace: 3 s groups); 0 when they are not on a grid.
    pub resolution_s: f64,
}

/// Reads a trace. `format`: `None` detects it from the first line. `key_column`: the column
/// (CSV header name or JSON field) whose value each row keeps as [`TraceRow::key`]; a row
/// without it is an error.
pub fn read(
    path: &Path,
    format: Option<TraceFormat>,
    key_column: Option<&str>,
) -> Result<TraceFile, Error> {
    let bytes = std::fs::read(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let sha256 = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>();
    let text = String::from_utf8(bytes).map_err(|e| line_error(path, 0, e.to_string()))?;
    let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    let format = match format.or_else(|| TraceFormat::detect(first)) {
        Some(f) => f,
        None => {
            return Err(line_error(
                path,
                1,
                "unknown trace format: expected an Azure or BurstGPT CSV header, or a JSON \
                 object with input_length (Mooncake) or arrival_s; name it with --trace-format"
                    .into(),
            ))
        }
    };
    let (rows, stamps) = match format {
        TraceFormat::Azure | TraceFormat::Burstgpt => read_csv(path, &text, format, key_column)?,
        TraceFormat::Mooncake | TraceFormat::Jsonl => read_jsonl(path, &text, format, key_column)?,
    };
    if rows.is_empty() {
        return Err(Error::EmptyTrace {
            path: path.to_path_buf(),
        });
    }
    let resolution_s = resolution(&stamps, unit(format));
    Ok(TraceFile {
        path: path.to_path_buf(),
        format,
        sha256,
        rows,
        resolution_s,
    })
}

fn line_error(path: &Path, line: usize, problem: String) -> Error {
    Error::TraceLine {
        path: path.to_path_buf(),
        line,
        problem,
    }
}

/// A timestamp as read: seconds, and the same as an integer count of the file's unit where it
/// is one (for the resolution).
type Stamp = (f64, Option<i128>);

fn read_csv(
    path: &Path,
    text: &str,
    format: TraceFormat,
    key_column: Option<&str>,
) -> Result<(Vec<TraceRow>, Vec<Stamp>), Error> {
    let mut reader = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .from_reader(text.as_bytes());
    let headers = reader
        .headers()
        .map_err(|e| line_error(path, 1, e.to_string()))?
        .clone();
    let column = |name: &str| {
        headers
            .iter()
            .position(|h| h.trim_start_matches('\u{feff}') == name)
            .ok_or_else(|| line_error(path, 1, format!("no column '{name}' in the header")))
    };
    let (time, prompt, output) = match format {
        TraceFormat::Azure => ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
        _ => ("Timestamp", "Request tokens", "Response tokens"),
    };
    let (time, prompt, output) = (column(time)?, column(prompt)?, column(output)?);
    let key = key_column.map(column).transpose()?;
    let (mut rows, mut stamps) = (Vec::new(), Vec::new());
    for record in reader.records() {
        let record = record.map_err(|e| {
            let line = e.position().map_or(0, |p| p.line() as usize);
            line_error(path, line, e.to_string())
        })?;
        let line = record.position().map_or(0, |p| p.line() as usize);
        let field = |i: usize| record.get(i).unwrap_or("");
        let stamp = match format {
            TraceFormat::Azure => azure_time(field(time)),
            _ => seconds(field(time)),
        }
        .map_err(|p| line_error(path, line, p))?;
        stamps.push(stamp);
        rows.push(TraceRow {
            line,
            time_s: stamp.0,
            prompt_tokens: count(field(prompt)).map_err(|p| line_error(path, line, p))?,
            output_tokens: count(field(output)).map_err(|p| line_error(path, line, p))?,
            hash_ids: None,
            key: key.map(|k| field(k).to_string()),
        });
    }
    relative(&mut rows, &mut stamps, unit(format));
    Ok((rows, stamps))
}

/// Seconds per integer count of a format's timestamps.
fn unit(format: TraceFormat) -> f64 {
    match format {
        TraceFormat::Azure => 1e-7,
        TraceFormat::Mooncake => 1e-3,
        TraceFormat::Burstgpt | TraceFormat::Jsonl => 1.0,
    }
}

#[derive(Deserialize)]
struct MooncakeRow {
    timestamp: f64,
    input_length: u32,
    output_length: u32,
    #[serde(default)]
    hash_ids: Option<Vec<u64>>,
}

#[derive(Deserialize)]
struct OwnRow {
    arrival_s: f64,
    prompt_tokens: u32,
    output_tokens: u32,
    #[serde(default)]
    hash_ids: Option<Vec<u64>>,
}

fn read_jsonl(
    path: &Path,
    text: &str,
    format: TraceFormat,
    key_column: Option<&str>,
) -> Result<(Vec<TraceRow>, Vec<Stamp>), Error> {
    let (mut rows, mut stamps) = (Vec::new(), Vec::new());
    for (i, l) in text.lines().enumerate() {
        let line = i + 1;
        if l.trim().is_empty() {
            continue;
        }
        let err = |p: String| line_error(path, line, p);
        let v: Value = serde_json::from_str(l).map_err(|e| err(e.to_string()))?;
        let key = match key_column {
            None => None,
            Some(k) => Some(match v.get(k) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(a)) => a.first().map_or(String::new(), Value::to_string),
                Some(other) => other.to_string(),
                None => return Err(err(format!("no field '{k}'"))),
            }),
        };
        let (stamp, prompt, output, hash_ids) = match format {
            TraceFormat::Mooncake => {
                let r: MooncakeRow = serde_json::from_value(v).map_err(|e| err(e.to_string()))?;
                let whole = (r.timestamp.fract() == 0.0).then_some(r.timestamp as i128);
                (
                    (r.timestamp / 1e3, whole),
                    r.input_length,
                    r.output_length,
                    r.hash_ids,
                )
            }
            _ => {
                let r: OwnRow = serde_json::from_value(v).map_err(|e| err(e.to_string()))?;
                (
                    (r.arrival_s, None),
                    r.prompt_tokens,
                    r.output_tokens,
                    r.hash_ids,
                )
            }
        };
        if !(stamp.0.is_finite() && stamp.0 >= 0.0) {
            return Err(err(format!(
                "the time must be >= 0 and finite, got {}",
                stamp.0
            )));
        }
        stamps.push(stamp);
        rows.push(TraceRow {
            line,
            time_s: stamp.0,
            prompt_tokens: prompt,
            output_tokens: output,
            hash_ids,
            key,
        });
    }
    relative(&mut rows, &mut stamps, unit(format));
    Ok((rows, stamps))
}

/// Makes times relative to the earliest one: from the integer counts of `unit` seconds where
/// every timestamp has one (exact), else from the seconds.
fn relative(rows: &mut [TraceRow], stamps: &mut [Stamp], unit: f64) {
    let ints: Option<Vec<i128>> = stamps.iter().map(|s| s.1).collect();
    match ints {
        Some(ints) => {
            let i0 = ints.iter().copied().min().unwrap_or(0);
            for ((r, s), i) in rows.iter_mut().zip(stamps.iter_mut()).zip(ints) {
                *s = ((i - i0) as f64 * unit, Some(i - i0));
                r.time_s = s.0;
            }
        }
        None => {
            let t0 = rows.iter().map(|r| r.time_s).fold(f64::INFINITY, f64::min);
            for (r, s) in rows.iter_mut().zip(stamps.iter_mut()) {
                r.time_s -= t0;
                *s = (r.time_s, None);
            }
        }
    }
}

/// The greatest common step of the timestamps, in seconds, when all are integers of the
/// file's `unit` (Mooncake: ms; Azure: 100 ns; BurstGPT: s); 0 otherwise.
fn resolution(stamps: &[Stamp], unit: f64) -> f64 {
    let mut g: i128 = 0;
    for &(_, i) in stamps {
        let Some(i) = i else { return 0.0 };
        g = gcd(g, i);
    }
    g as f64 * unit
}

fn gcd(a: i128, b: i128) -> i128 {
    let (mut a, mut b) = (a.abs(), b.abs());
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

fn count(s: &str) -> Result<u32, String> {
    s.trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0 && v.fract() == 0.0 && *v <= f64::from(u32::MAX))
        .map(|v| v as u32)
        .ok_or_else(|| format!("'{s}' is not a token count"))
}

/// BurstGPT's timestamps: seconds, as a number.
fn seconds(s: &str) -> Result<Stamp, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => {
            Ok((v, (v.fract() == 0.0 && v < 1e15).then_some(v as i128)))
        }
        _ => Err(format!("'{s}' is not a time in seconds")),
    }
}

/// An Azure timestamp, `YYYY-MM-DD HH:MM:SS[.fraction][+HH:MM|Z]`, as seconds since 1970 and
/// as an integer count of 100 ns (the 7 fractional digits of the 2023 trace).
fn azure_time(s: &str) -> Result<Stamp, String> {
    let bad = || format!("'{s}' is not a timestamp like 2023-11-16 18:15:46.6805900");
    let t = s.trim();
    let (date, rest) = t.split_once([' ', 'T']).ok_or_else(bad)?;
    // The zone: "+HH:MM", "-HH:MM" or "Z" after the time.
    let (time, offset_s) = match rest.rfind(['+', '-']) {
        Some(at) => {
            let (h, m) = rest[at + 1..].split_once(':').ok_or_else(bad)?;
            let (h, m): (i64, i64) = (h.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?);
            let sign = if rest.as_bytes()[at] == b'-' { -1 } else { 1 };
            (&rest[..at], sign * (h * 3600 + m * 60))
        }
        None => (rest.strip_suffix('Z').unwrap_or(rest), 0),
    };
    let num = |x: &str| x.parse::<i64>().map_err(|_| bad());
    let d: Vec<&str> = date.split('-').collect();
    let [y, mo, da] = d[..] else {
        return Err(bad());
    };
    let (y, mo, da) = (num(y)?, num(mo)?, num(da)?);
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let hms: Vec<&str> = hms.split(':').collect();
    let [h, mi, se] = hms[..] else {
        return Err(bad());
    };
    let (h, mi, se) = (num(h)?, num(mi)?, num(se)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&da) || h > 23 || mi > 59 || se > 60 {
        return Err(bad());
    }
    if frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let ticks_frac = format!("{frac:0<7}")[..7]
        .parse::<i64>()
        .map_err(|_| bad())?;
    let secs = days_from_civil(y, mo, da) * 86_400 + h * 3600 + mi * 60 + se - offset_s;
    let ticks = i128::from(secs) * 10_000_000 + i128::from(ticks_frac);
    let exact = frac.len() <= 7 || frac[7..].bytes().all(|b| b == b'0');
    Ok((ticks as f64 / 1e7, exact.then_some(ticks)))
}

/// Days from 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests;
