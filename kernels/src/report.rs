//! Benchmark results and their tables (Markdown, so they paste into docs/BENCHMARKS.md).
//! Plain Rust: the arithmetic of rates and fractions is tested without a GPU.

#[cfg(test)]
mod tests;

use std::fmt::Write as _;

/// How a row moves its two directions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Out (D2H), then in (H2D), on one stream.
    Sequential,
    /// Both directions at once on two streams.
    Duplex,
}

/// What the verifier found after a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verified {
    Ok,
    /// Words that differ from the source's pattern.
    Mismatch(u64),
}

/// One measured row.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub name: String,
    pub mode: Mode,
    /// Copies (contiguous segments) per direction: (H2D, D2H).
    pub copies: (u64, u64),
    /// Driver calls or kernel launches per direction: (H2D, D2H).
    pub calls: (u64, u64),
    /// Bytes moved per direction.
    pub bytes: u64,
    /// Time of the whole row (median over repetitions).
    pub total_ms: f64,
    /// Time of each direction on its own stream: (H2D, D2H).
    pub dir_ms: (f64, f64),
    pub verified: Verified,
}

/// Decimal gigabytes per second.
pub fn gbps(bytes: u64, ms: f64) -> f64 {
    if ms <= 0.0 {
        return 0.0;
    }
    bytes as f64 / (ms * 1e-3) / 1e9
}

/// Median of a non-empty sample (mean of the two middle values for even lengths).
pub fn median(samples: &[f64]) -> f64 {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => s[n / 2],
        _ => 0.5 * (s[n / 2 - 1] + s[n / 2]),
    }
}

/// The same-run ceilings: contiguous pinned copies, out then in, and both at once.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ceilings {
    pub sequential_ms: f64,
    pub duplex_ms: f64,
}

impl Ceilings {
    /// Ceiling time over row time, for the ceiling of the row's own mode.
    pub fn of_same_mode(&self, row: &Row) -> f64 {
        let c = match row.mode {
            Mode::Sequential => self.sequential_ms,
            Mode::Duplex => self.duplex_ms,
        };
        c / row.total_ms
    }

    /// Duplex ceiling time over row time: how close a row comes to the link's best.
    pub fn of_duplex(&self, row: &Row) -> f64 {
        self.duplex_ms / row.total_ms
    }
}

/// The Table 1 reproduction as Markdown.
pub fn table(rows: &[Row], ceilings: &Ceilings) -> String {
    let mut out = String::new();
    out.push_str("| row | copies (calls) per direction | mean copy | ms | H2D GB/s | D2H GB/s | of same-mode ceiling | of duplex ceiling | data |\n");
    out.push_str("|---|---|---|---:|---:|---:|---:|---:|---|\n");
    for r in rows {
        let mean_copy = r.bytes / r.copies.0.max(r.copies.1).max(1);
        let data = match r.verified {
            Verified::Ok => "verified".to_string(),
            Verified::Mismatch(n) => format!("**{n} words wrong**"),
        };
        let _ = writeln!(
            out,
            "| {} | {} ({}) | {} KiB | {:.1} | {:.1} | {:.1} | {:.0}% | {:.0}% | {} |",
            r.name,
            r.copies.0.max(r.copies.1),
            r.calls.0.max(r.calls.1),
            mean_copy >> 10,
            r.total_ms,
            gbps(r.bytes, r.dir_ms.0),
            gbps(r.bytes, r.dir_ms.1),
            100.0 * ceilings.of_same_mode(r),
            100.0 * ceilings.of_duplex(r),
            data,
        );
    }
    out
}

/// One workload timed alone and beside another.
#[derive(Clone, Debug, PartialEq)]
pub struct Interference {
    pub name: String,
    pub alone_ms: f64,
    pub together_ms: f64,
}

impl Interference {
    pub fn slowdown(&self) -> f64 {
        self.together_ms / self.alone_ms
    }
}

/// The interference table as Markdown.
pub fn interference_table(rows: &[Interference]) -> String {
    let mut out =
        String::from("| workload | alone ms | together ms | slowdown |\n|---|---:|---:|---:|\n");
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {:.1} | {:.1} | {:.2}x |",
            r.name,
            r.alone_ms,
            r.together_ms,
            r.slowdown()
        );
    }
    out
}
