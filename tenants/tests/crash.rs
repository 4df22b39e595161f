//! Crash test in the style of sled's own: a child process does admin writes in a loop and
//! reports each one it got acknowledged; the parent kills it with SIGKILL at a random moment,
//! reopens the store, and checks that every acknowledged write is there, nothing else is
//! (except possibly the one write in flight), and the store is consistent. Many rounds, one
//! store, so each round also recovers from the previous kill.
//!
//! The child is this same test binary, re-executed with `CHILD_DIR` set, running only the
//! `crash_child` test. Set `SUPERINFER_CRASH_SEED` to replay a failing run.

#[path = "crash/child.rs"]
mod child;
#[path = "crash/model.rs"]
mod model;
#[path = "crash/protocol.rs"]
mod protocol;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use superinfer_tenants::TenantStore;

const CHILD_DIR: &str = "SUPERINFER_TENANTS_CRASH_CHILD_DIR";
const CHILD_SEED: &str = "SUPERINFER_TENANTS_CRASH_CHILD_SEED";
/// Kills per run: 100 in the test suite; `SUPERINFER_CRASH_ROUNDS` sets more
/// (`scripts/bench_store_crash.sh` runs 20,000).
const ROUNDS: u64 = 100;

fn rounds() -> u64 {
    std::env::var("SUPERINFER_CRASH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(ROUNDS)
}

/// Stores rebuilt from their verified copy so far (each keeps its damaged files beside it).
fn rebuilt(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| {
        d.filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().contains(".corrupt-"))
            .count()
    })
}

/// The child's entry point; a no-op in a normal test run.
#[test]
fn crash_child() {
    let (Ok(dir), Ok(seed)) = (std::env::var(CHILD_DIR), std::env::var(CHILD_SEED)) else {
        return;
    };
    child::run(&dir, seed.parse().expect("the parent passes a number"));
}

#[test]
fn acknowledged_admin_writes_survive_sigkill() {
    let seed = std::env::var("SUPERINFER_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            now.as_nanos() as u64 % 1_000_000_007
        });
    eprintln!("crash test seed {seed} (replay with SUPERINFER_CRASH_SEED={seed})");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let mut model = model::Model::default();
    let (mut acked, mut in_flight, mut landed) = (0, 0, 0);
    let start = Instant::now();
    let rounds = rounds();
    for round in 0..rounds {
        let lines = run_and_kill(&path, seed * 1000 + round, &mut rng);
        let r = model
            .absorb(&lines)
            .unwrap_or_else(|e| panic!("round {round}, seed {seed}: {e}"));
        let store = TenantStore::open(&path)
            .unwrap_or_else(|e| panic!("round {round}, seed {seed}: reopen failed: {e}"));
        let applied = model
            .verify(&store, &r)
            .unwrap_or_else(|e| panic!("round {round}, seed {seed}: {e}"));
        acked += r.acked;
        in_flight += u64::from(r.pending.is_some());
        landed += u64::from(applied);
    }
    eprintln!(
        "{rounds} kills in {:.1} s: {acked} acknowledged writes, {in_flight} kills with a write \
         in flight ({landed} of those landed), {} reopens rebuilt from the verified copy",
        start.elapsed().as_secs_f64(),
        rebuilt(dir.path())
    );
    // The test means something only if the child made progress and kills hit mid-write.
    assert!(acked >= 2 * rounds, "only {acked} writes acknowledged");
    assert!(
        in_flight >= rounds / 2,
        "only {in_flight} kills hit a write in flight"
    );
}

/// Starts a child on the store, kills it with SIGKILL at a random moment, and returns the
/// complete lines it printed.
fn run_and_kill(path: &Path, child_seed: u64, rng: &mut StdRng) -> Vec<protocol::Line> {
    let exe = std::env::current_exe().expect("the test binary knows its path");
    let mut child = Command::new(exe)
        .args(["crash_child", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_DIR, path)
        .env(CHILD_SEED, child_seed.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the child");
    let stdout = child.stdout.take().expect("stdout is piped");
    let (ready_tx, ready_rx) = mpsc::channel();
    let reader = thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut lines = Vec::new();
        let mut buf = String::new();
        // A last line without its newline was cut by the kill: it counts as never printed.
        while matches!(reader.read_line(&mut buf), Ok(n) if n > 0) && buf.ends_with('\n') {
            if let Some(line) = protocol::parse(buf.trim_end()) {
                if line == protocol::Line::Ready {
                    let _ = ready_tx.send(());
                }
                lines.push(line);
            }
            buf.clear();
        }
        lines
    });
    // Mostly kill while writes are flowing; sometimes while the store is still opening (and
    // recovering from the previous kill).
    if rng.random_bool(0.15) {
        thread::sleep(Duration::from_millis(rng.random_range(0..30)));
    } else {
        let _ = ready_rx.recv_timeout(Duration::from_secs(5));
        thread::sleep(Duration::from_micros(rng.random_range(0..40_000)));
    }
    child.kill().expect("SIGKILL the child");
    child.wait().expect("reap the child");
    reader.join().expect("the reader thread does not panic")
}
