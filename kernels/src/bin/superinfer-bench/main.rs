//! `superinfer-bench`: GPU benchmarks and checks of the kernels crate (feature `cuda`).
//!
//! - `duplex`: PAPER.md Table 1 on this GPU (Naive, Merged segments, Merged + batched,
//!   DuplexKV, ceilings), each row a fraction of the ceiling measured in the same run and its
//!   data verified; the duplex run beside a memory-bound kernel; then the hazard checks.
//! - `checks`: the hazard checks alone.

mod checks;
mod duplex;
mod opts;

use std::path::PathBuf;
use std::process::ExitCode;

use opts::Opts;

const USAGE: &str =
    "usage: superinfer-bench duplex [--gib N] [--reps N] [--naive-reps N] [--seed N]
                               [--chunk-gib N] [--out DIR] [--no-checks] [--no-naive-layer]
                               [--no-naive-sync]
       superinfer-bench checks";

fn parse(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().cloned().ok_or(format!("{name} needs a value"));
        let num = |s: String| s.parse::<u64>().map_err(|e| format!("{s}: {e}"));
        match a.as_str() {
            "--gib" => o.gib = num(value(a)?)?,
            "--reps" => o.reps = num(value(a)?)? as usize,
            "--naive-reps" => o.naive_reps = num(value(a)?)? as usize,
            "--seed" => o.seed = num(value(a)?)?,
            "--chunk-gib" => o.chunk_gib = num(value(a)?)?,
            "--out" => o.out = Some(PathBuf::from(value(a)?)),
            "--no-checks" => o.checks = false,
            "--no-naive-layer" => o.naive_layer = false,
            "--no-naive-sync" => o.naive_sync = false,
            other => return Err(format!("unknown option {other}")),
        }
    }
    if o.gib == 0 || o.reps == 0 || o.chunk_gib == 0 {
        return Err("--gib, --reps and --chunk-gib must be positive".into());
    }
    Ok(o)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("duplex") => parse(&args[1..])
            .map_err(|e| format!("{e}\n{USAGE}"))
            .and_then(|o| {
                let ok = duplex::run(&o).map_err(|e| e.to_string())?;
                let checks_ok = if o.checks {
                    checks::run().map_err(|e| e.to_string())?
                } else {
                    true
                };
                Ok(ok && checks_ok)
            }),
        Some("checks") => checks::run().map_err(|e| e.to_string()),
        _ => Err(USAGE.to_string()),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("some results are wrong (see FAIL or 'words wrong' above)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
