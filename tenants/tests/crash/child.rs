//! The child: opens the store and does random admin writes until it is killed, reporting each
//! one before (`BEGIN`) and after (`ACK`) the store call (see `protocol.rs`).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::io::Write;
use std::time::{Duration, Instant};
use superinfer_tenants::{NewTenant, TenantId, TenantPatch, TenantStore};

use super::protocol::Op;

/// A child the parent forgot must still end.
const LIFETIME: Duration = Duration::from_secs(10);
/// Keep the population small so every round touches existing tenants often.
const MAX_TENANTS: usize = 24;

struct Live {
    id: u32,
    name: String,
}

pub fn run(dir: &str, seed: u64) {
    let store = TenantStore::open(dir).expect("child opens the store");
    let mut live: Vec<Live> = store
        .list()
        .expect("child lists tenants")
        .into_iter()
        .map(|t| Live {
            id: t.id.0,
            name: t.name,
        })
        .collect();
    let mut rng = StdRng::seed_from_u64(seed);
    // The harness printed "test crash_child ... " without a newline; end that line first.
    say("\nREADY");
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < LIFETIME {
        n += 1;
        let op = choose(&mut rng, &live, seed, n);
        say(&op.begin_line());
        match apply(&store, &op, &mut live) {
            Ok(ack) => say(&ack),
            Err(e) => {
                say(&format!("ERR {op:?}: {e}"));
                return;
            }
        }
    }
}

fn choose(rng: &mut StdRng, live: &[Live], seed: u64, n: u64) -> Op {
    let weight = f64::from(rng.random_range(1u32..=64)) / 4.0;
    let roll = rng.random_range(0..100);
    if live.len() < 3 || (roll < 30 && live.len() < MAX_TENANTS) {
        return Op::Create {
            name: format!("c{seed}-{n}"),
            weight,
        };
    }
    let t = &live[rng.random_range(0..live.len())];
    match roll {
        0..=54 => Op::Patch {
            id: t.id,
            name: if rng.random_bool(0.2) {
                format!("r{seed}-{n}")
            } else {
                t.name.clone()
            },
            weight,
            enabled: rng.random_bool(0.7),
        },
        55..=79 => Op::Rotate { id: t.id },
        _ => Op::Delete { id: t.id },
    }
}

fn apply(store: &TenantStore, op: &Op, live: &mut Vec<Live>) -> superinfer_tenants::Result<String> {
    Ok(match op {
        Op::Create { name, weight } => {
            let mut new = NewTenant::named(name.clone());
            new.weight = *weight;
            let (t, key) = store.create(new)?;
            live.push(Live {
                id: t.id.0,
                name: t.name.clone(),
            });
            format!(
                "ACK create {} {} {} {}",
                t.id,
                t.name,
                t.weight,
                key.expose()
            )
        }
        Op::Patch {
            id,
            name,
            weight,
            enabled,
        } => {
            let patch = TenantPatch {
                name: Some(name.clone()),
                weight: Some(*weight),
                enabled: Some(*enabled),
                ..TenantPatch::default()
            };
            store.patch(TenantId(*id), patch)?;
            if let Some(l) = live.iter_mut().find(|l| l.id == *id) {
                l.name = name.clone();
            }
            format!("ACK patch {id}")
        }
        Op::Rotate { id } => {
            let key = store.rotate_key(TenantId(*id))?;
            format!("ACK rotate {id} {}", key.expose())
        }
        Op::Delete { id } => {
            store.delete(TenantId(*id))?;
            live.retain(|l| l.id != *id);
            format!("ACK delete {id}")
        }
    })
}

/// One line in one write, flushed; a failed write means the parent is gone, so stop.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    if out
        .write_all(format!("{line}\n").as_bytes())
        .and_then(|_| out.flush())
        .is_err()
    {
        std::process::exit(0);
    }
}
