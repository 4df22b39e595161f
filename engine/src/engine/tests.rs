use super::*;
use crate::clock::VirtualClock;
use crate::kv::{BlockState, CacheScope};
use crate::profile::Profile;
use crate::runner::sim::SimRunner;
use crate::sampling::SamplingParams;
use crate::transfer::sim::SimTransfer;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use superinfer_policies::TenantId;
use superinfer_policies::{PolicyKind, Slo, WlvfConfig};

mod copy_timeout;
mod deadline;
mod faults;
mod long_prompts;
mod prefix;
mod step_budget;

type TestEngine = Engine<SimRunner, SimTransfer, VirtualClock>;

fn engine(kind: PolicyKind, hbm: u32, dram: u32, b_xfer: u32) -> TestEngine {
    engine_with(
        kind,
        EngineConfig {
            hbm_blocks: hbm,
            dram_blocks: dram,
            b_xfer: Some(b_xfer),
            max_batched_tokens: 256,
            max_num_seqs: 64,
            ..EngineConfig::default()
        },
    )
}

/// An engine at the h200-llama-3-8b profile; weighted-LVF caps: 2 s wait, 3 rotations.
fn engine_with(kind: PolicyKind, cfg: EngineConfig) -> TestEngine {
    let profile = Profile::builtin("h200-llama-3-8b").unwrap();
    let transfer = SimTransfer::new(&profile.hw, profile.model.geometry(16).block_bytes());
    let runner = SimRunner::new(profile, 16);
    let policy_cfg = WlvfConfig {
        max_wait_s: Some(2.0),
        max_consecutive_rotations: Some(3),
        ..Default::default()
    };
    Engine::new(
        cfg,
        kind.build(&policy_cfg),
        runner,
        transfer,
        VirtualClock::new(),
    )
    .unwrap()
}

fn request(id: u64, tenant: u32, prompt: u32, max_tokens: u32) -> EngineRequest {
    EngineRequest {
        id: RequestId(id),
        tenant: TenantId(tenant),
        weight: f64::from(tenant + 1),
        slo: Slo::default(),
        // Distinct per request: the prefix cache finds nothing unless a test means it to.
        prompt: (0..prompt).map(|i| id as u32 * 1000 + i).collect(),
        max_tokens,
        ignore_eos: true,
        stop_token_ids: vec![],
        sampling: SamplingParams::default(),
        arrival: None,
        cache: None,
        follows: None,
        queue_deadline_s: None,
    }
}

/// Drives the engine until it has no requests left (or `limit` steps).
fn drain(e: &mut TestEngine, limit: usize) -> Vec<EngineEvent> {
    let mut events = Vec::new();
    for _ in 0..limit {
        if e.is_empty() {
            break;
        }
        let r = e.step().unwrap();
        if let Some(t) = r.idle_until {
            e.clock_mut().skip_to(t);
        }
        e.pool().check().unwrap();
        events.extend(e.take_events());
    }
    events
}

#[test]
fn one_request_runs_to_its_length() {
    let mut e = engine(PolicyKind::Lvf, 64, 128, 64);
    e.submit(request(1, 0, 40, 5)).unwrap();
    let events = drain(&mut e, 100);
    let tokens = events
        .iter()
        .filter(|ev| matches!(ev, EngineEvent::Token { .. }))
        .count();
    assert_eq!(tokens, 5);
    let Some(EngineEvent::Finished { end, .. }) = events.last() else {
        panic!("ends with Finished: {:?}", events.last());
    };
    assert_eq!(
        (end.reason, end.completion_tokens, end.prompt_tokens),
        (FinishReason::Length, 5, 40)
    );
    assert_eq!(e.pool().hbm_available(), 64);
    assert_eq!(e.pool().dram_available(), 128);
}

#[test]
fn bad_requests_are_refused_and_nothing_is_kept() {
    let mut e = engine(PolicyKind::Lvf, 8, 16, 8);
    assert!(matches!(
        e.submit(request(1, 0, 0, 5)),
        Err(EngineError::EmptyPrompt(_))
    ));
    assert!(matches!(
        e.submit(request(2, 0, 200, 5)),
        Err(EngineError::TooLong { .. })
    ));
    let mut bad = request(3, 0, 4, 4);
    bad.weight = 0.0;
    assert!(e.submit(bad).is_err());
    e.submit(request(4, 0, 4, 4)).unwrap();
    assert!(matches!(
        e.submit(request(4, 0, 4, 4)),
        Err(EngineError::Duplicate(_))
    ));
    assert_eq!(e.len(), 1);
}

#[test]
fn chunked_prefill_respects_the_token_budget() {
    let mut e = engine(PolicyKind::Fcfs, 256, 512, 64);
    e.submit(request(1, 0, 600, 2)).unwrap();
    let r = e.step().unwrap();
    assert_eq!(r.prefill_tokens, 256);
    let r = e.step().unwrap();
    assert_eq!(r.prefill_tokens, 256);
    let r = e.step().unwrap();
    assert_eq!(r.prefill_tokens, 88);
    assert_eq!(
        e.take_events().len(),
        1,
        "the last chunk samples the first token"
    );
}

#[test]
fn full_blocks_are_written_back_eagerly_and_rotation_copies_only_the_tail() {
    // 12 HBM blocks: request 1 (40 prompt tokens) holds 3 of them. The private path: with the
    // prefix cache on, synced full blocks become shared entries (tests/prefix.rs).
    let mut e = engine_with(
        PolicyKind::Lvf,
        EngineConfig {
            hbm_blocks: 12,
            dram_blocks: 128,
            b_xfer: Some(64),
            max_batched_tokens: 256,
            max_num_seqs: 64,
            prefix_cache: false,
            ..EngineConfig::default()
        },
    );
    e.submit(request(1, 0, 40, 100)).unwrap();
    for _ in 0..3 {
        e.step().unwrap();
    }
    // 40 prompt tokens + 2 decoded: blocks 0 and 1 are full, their writebacks were issued.
    let table = e.pool().table(RequestId(1));
    assert_eq!(table.len(), 3);
    assert!(
        table[..2].iter().all(|b| b.state != BlockState::Dirty),
        "{table:?}"
    );
    assert_eq!(table[2].state, BlockState::Dirty);
    // The writebacks land: both full blocks become synced within a few more steps.
    let mut steps = 0;
    while !e.pool().table(RequestId(1))[..2]
        .iter()
        .all(|b| b.state == BlockState::Synced)
    {
        steps += 1;
        assert!(
            steps < 10,
            "writebacks never landed: {:?}",
            e.pool().table(RequestId(1))
        );
        e.step().unwrap();
    }
    assert_eq!(e.pool().unsynced(RequestId(1)), 1);
    // A second request of 10 blocks needs room: LVF rotates request 1 out, and the rotation
    // copies only its dirty tail (one block), dropping the synced blocks' HBM slots.
    let block_bytes = e.runner.geometry().block_bytes();
    let before = e.stats().bytes_d2h;
    e.submit(request(2, 0, 150, 10)).unwrap();
    e.step().unwrap();
    assert_eq!(e.stats().rotations_out, 1);
    assert_eq!(e.stats().bytes_d2h - before, block_bytes);
    let table = e.pool().table(RequestId(1));
    assert!(
        table[..2].iter().all(|b| b.state == BlockState::Parked),
        "{table:?}"
    );
    assert!(
        matches!(table[2].state, BlockState::Evicting | BlockState::Parked),
        "{table:?}"
    );
    e.pool().check().unwrap();
}

#[test]
fn the_rotation_count_resets_only_after_progress_tokens_in_one_running_period() {
    // 24 requests of 64 + 160 tokens against 48 HBM blocks (about 3 requests' worth): weighted
    // LVF rotates constantly until a request reaches its cap (3). With progress_tokens 48 a
    // restored request keeps its count until it has produced 48 tokens in one running period
    // (the default, 16, would reset it sooner).
    let progress = 48;
    let mut e = engine_with(
        PolicyKind::Wlvf,
        EngineConfig {
            hbm_blocks: 48,
            dram_blocks: 2048,
            b_xfer: Some(64),
            max_batched_tokens: 256,
            max_num_seqs: 64,
            progress_tokens: progress,
            ..EngineConfig::default()
        },
    );
    for i in 0..24 {
        e.submit(request(i, (i % 3) as u32, 64, 160)).unwrap();
    }
    let mut kept_past_the_default = 0;
    for _ in 0..20_000 {
        if e.is_empty() {
            break;
        }
        let r = e.step().unwrap();
        if let Some(t) = r.idle_until {
            e.clock_mut().skip_to(t);
        }
        e.take_events();
        for (id, r) in &e.requests {
            if r.run_tokens >= progress {
                assert_eq!(r.consecutive_rotations, 0, "{id:?} made progress");
            } else if r.consecutive_rotations > 0 && r.run_tokens >= 16 {
                kept_past_the_default += 1;
            }
        }
    }
    assert!(e.is_empty(), "every request finishes");
    assert!(e.stats().rotations_out > 0);
    assert!(
        kept_past_the_default > 0,
        "no restored request ran 16..48 tokens"
    );
}

/// The block and request invariants the randomized test checks after every step.
/// What the randomized test has checked of one request's prefix-cache names so far.
#[derive(Default)]
struct Seen {
    root: Option<crate::kv::BlockHash>,
    own: Vec<crate::kv::BlockHash>,
    table: usize,
}

/// `own` memoizes each request's chain as the test computes it (hashing every request's whole
/// sequence after every operation would dominate the test's time).
fn check_requests(e: &TestEngine, own: &mut HashMap<RequestId, Seen>) {
    e.pool().check().unwrap();
    let mut census = Census::default();
    for r in e.requests.values() {
        census.add(r.state);
    }
    assert_eq!(
        census.0, e.census.0,
        "the census drifted from the requests' states"
    );
    for (id, r) in &e.requests {
        let table = e.pool().table(*id);
        match r.state {
            ReqState::Waiting => assert!(table.is_empty(), "{id:?} waiting with blocks"),
            ReqState::Running => assert!(table.iter().all(|b| b.hbm.is_some()), "{id:?}"),
            ReqState::Rotary => {
                assert!(
                    table
                        .iter()
                        .all(|b| matches!(b.state, BlockState::Parked | BlockState::SharedOut)),
                    "{id:?} {table:?}"
                )
            }
            ReqState::Evicting | ReqState::Restoring => assert!(e.transit.contains(id)),
        }
        if r.state == ReqState::Running && !r.prefilling() {
            assert!(table.len() as u32 * 16 >= r.kv_len);
        }
        // Its hashes name its own tokens in its own namespace, and every block it shares is
        // the entry of exactly that hash (the pool checks the latter): no hit crosses
        // namespaces, and a cached block holds what this request would have computed.
        let seen = own.entry(*id).or_default();
        let root = *seen.root.get_or_insert_with(|| {
            let scope = r.spec.cache.clone();
            scope.unwrap_or_else(|| CacheScope::tenant(r.tenant)).root()
        });
        // Hashes only grow: the new ones are checked (the old ones were, when new).
        let from = seen.own.len();
        let upto = (r.hashes.len() * 16).min(r.tokens.len());
        crate::kv::prefix::extend_chain(&mut seen.own, root, &r.tokens[..upto], 16);
        assert_eq!(seen.own.len(), r.hashes.len(), "{id:?} hashes");
        assert_eq!(seen.own[from..], r.hashes[from..], "{id:?} hashes");
        let named = e.pool().table_hashes(*id);
        if named.len() != seen.table {
            assert_eq!(named, &r.hashes[..named.len()], "{id:?} table hashes");
            seen.table = named.len();
        }
        assert!(
            named.len() as u32 * 16 <= r.kv_len,
            "{id:?} named past its KV"
        );
    }
}

/// A prompt of about `len` tokens that the prefix cache can hit: a system prompt and a
/// message, a recent prompt with a new turn, or tokens from a tiny alphabet (chance repeats);
/// tenants are drawn apart from prompts, so identical prompts of two tenants are common.
fn reusing_prompt(rng: &mut ChaCha8Rng, recent: &mut Vec<Vec<u32>>, len: usize) -> Vec<u32> {
    let mut p: Vec<u32> = match rng.random_range(0..3) {
        0 => (0..40)
            .map(|i| rng.random_range(0..2u32) * 100 + i)
            .collect(),
        1 if !recent.is_empty() => recent[rng.random_range(0..recent.len())].clone(),
        _ => Vec::new(),
    };
    p.extend((0..len).map(|_| rng.random_range(0..3u32)));
    p.truncate(150);
    if recent.len() == 8 {
        recent.remove(0);
    }
    recent.push(p.clone());
    p
}

/// The most live requests the randomized test keeps (about 20 times what the HBM tier holds).
const MAX_LIVE: usize = 400;

fn random_ops(kind: PolicyKind, seed: u64, ops: usize) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    // Small tiers so that rotation, recompute (DRAM full) and quarantine all happen; every
    // other seed with an HBM-only prefix cache, every third without a DRAM tier (HBM-only KV,
    // its cache made of finished requests' blocks in HBM).
    let mut e = engine_with(
        kind,
        EngineConfig {
            hbm_blocks: 48,
            dram_blocks: if seed % 3 == 2 { 0 } else { 40 },
            b_xfer: Some(12),
            max_batched_tokens: 256,
            max_num_seqs: 64,
            prefix_cache_dram: seed.is_multiple_of(2),
            ..EngineConfig::default()
        },
    );
    let mut recent: Vec<Vec<u32>> = Vec::new();
    let mut own = HashMap::new();
    let mut next_id = 0u64;
    let mut live: Vec<u64> = Vec::new();
    let mut finished: HashMap<u64, usize> = HashMap::new();
    let mut tokens: HashMap<u64, u32> = HashMap::new();
    let mut steps = 0;
    for _ in 0..ops {
        match rng.random_range(0..100) {
            // Submissions outpace what 48 blocks can serve: past `MAX_LIVE` requests a
            // submission becomes a step, so the queue stays deep but bounded (an unbounded
            // queue makes the test quadratic without testing anything more).
            0..=24 if live.len() < MAX_LIVE => {
                let (p, m) = (rng.random_range(1..120), rng.random_range(1..60));
                let mut req = request(next_id, rng.random_range(0..3), p, m);
                req.prompt = reusing_prompt(&mut rng, &mut recent, p as usize);
                // A tenth share a namespace on purpose, a tenth salt their own.
                req.cache = match rng.random_range(0..10) {
                    0 => Some(CacheScope::shared("team")),
                    1 => Some(CacheScope::tenant(req.tenant).salted(Some("s".into()))),
                    _ => None,
                };
                // A fifth are a later choice of a live request (same prompt and namespace):
                // they follow it and wait for its blocks.
                let leader = (!live.is_empty() && rng.random_range(0..5) == 0)
                    .then(|| live[rng.random_range(0..live.len())]);
                if let Some(l) = leader.and_then(|l| e.request(RequestId(l))) {
                    req = EngineRequest {
                        id: RequestId(next_id),
                        max_tokens: req.max_tokens,
                        follows: Some(l.spec.id),
                        ..(*l.spec).clone()
                    };
                }
                if e.submit(req).is_ok() {
                    live.push(next_id);
                }
                next_id += 1;
            }
            25..=29 if !live.is_empty() => {
                let id = live[rng.random_range(0..live.len())];
                e.abort(RequestId(id));
            }
            31 if rng.random_range(0..8) == 0 => {
                // The next copy batch fails: its requests are recomputed (kv/pool/fault.rs).
                e.transfer_mut().inject(crate::transfer::CopyFault::Fail);
            }
            30 => {
                // An operator drops a namespace: a tenant's own (all its salts) or the shared one.
                let base = match rng.random_range(0..4) {
                    3 => CacheScope::shared_base("team"),
                    t => CacheScope::tenant_base(TenantId(t)),
                };
                e.drop_prefix_cache(&base);
            }
            _ => {
                let r = e.step().unwrap();
                steps += 1;
                if let Some(t) = r.idle_until {
                    e.clock_mut().skip_to(t);
                }
                if rng.random_range(0..50) == 0 {
                    e.clock_mut().advance(0.5);
                }
            }
        }
        for ev in e.take_events() {
            match ev {
                EngineEvent::Token { id, .. } => {
                    assert!(!finished.contains_key(&id.0), "token after finish");
                    *tokens.entry(id.0).or_default() += 1;
                }
                EngineEvent::Finished { id, end, .. } => {
                    *finished.entry(id.0).or_default() += 1;
                    let made = tokens.get(&id.0).copied().unwrap_or(0);
                    assert_eq!(made, end.completion_tokens);
                    live.retain(|&x| x != id.0);
                }
            }
        }
        check_requests(&e, &mut own);
    }
    assert!(
        finished.values().all(|&n| n == 1),
        "a request finished twice"
    );
    let s = e.stats();
    assert!(steps > ops / 2);
    assert!(s.finished > 100, "{s:?}");
    assert!(s.prefix_hit_hbm_tokens > 0, "{kind}: no HBM hit: {s:?}");
    if s.dram_capacity == 0 {
        // Nothing to rotate into or copy: pressure is met by recompute alone.
        assert_eq!(
            s.rotations_out + s.copy_faults + s.prefix_hit_dram_tokens,
            0,
            "{s:?}"
        );
        assert_eq!(s.bytes_h2d + s.bytes_d2h, 0, "{s:?}");
        assert_eq!(s.prefix_dram_blocks, 0, "{s:?}");
        assert!(s.recomputes > 0, "{kind}: no recompute: {s:?}");
        return;
    }
    if kind != PolicyKind::Fcfs && kind != PolicyKind::Sf {
        assert!(s.rotations_out > 0, "{kind}: no rotation happened: {s:?}");
    }
    assert!(s.copy_faults > 0, "{kind}: no copy fault: {s:?}");
    if seed.is_multiple_of(2) {
        assert!(s.prefix_hit_dram_tokens > 0, "{kind}: no DRAM hit: {s:?}");
    } else {
        assert_eq!(
            s.prefix_hit_dram_tokens, 0,
            "{kind}: a DRAM hit in an HBM-only cache"
        );
    }
}

#[test]
fn randomized_operations_keep_every_invariant() {
    // 6 policies × 20,000 operations = 120,000 random submit/step/abort operations.
    for (i, kind) in PolicyKind::ALL.into_iter().enumerate() {
        random_ops(kind, 1000 + i as u64, 20_000);
    }
}

/// The long run: 6 policies × 170,000 = 1,020,000 operations, invariants after each.
/// `cargo test -p superinfer-engine --release --lib -- --ignored randomized_million`
#[test]
#[ignore = "about a minute in release; run with --ignored"]
fn randomized_million_operations_keep_every_invariant() {
    for (i, kind) in PolicyKind::ALL.into_iter().enumerate() {
        random_ops(kind, 7000 + i as u64, 170_000);
    }
}

#[test]
fn a_tenant_whose_queue_runs_late_is_refused_early_and_others_are_not() {
    // Tenant 0 queues 30 requests on a node that starts about one at a time; each waits
    // seconds to start. With shed_late 0.5, once its recent requests waited over half their
    // 5 s TTFT SLO, its next request is refused at once; tenant 1's is accepted.
    let mut e = engine_with(
        PolicyKind::Wlvf,
        EngineConfig {
            hbm_blocks: 16,
            dram_blocks: 64,
            b_xfer: Some(16),
            max_batched_tokens: 256,
            max_num_seqs: 64,
            shed_late: Some(0.5),
            ..EngineConfig::default()
        },
    );
    for i in 0..30 {
        e.submit(request(i, 0, 100, 100)).unwrap();
    }
    let mut refused = None;
    for k in 0..2000u64 {
        e.clock_mut().advance(0.05);
        e.step().unwrap();
        e.take_events();
        if let Err(err) = e.submit(request(1000 + k, 0, 100, 100)) {
            refused = Some(err);
            break;
        }
    }
    let err = refused.expect("tenant 0 was never refused");
    assert!(
        matches!(err, EngineError::WouldMissSlo { wait_s, .. } if wait_s > 2.5),
        "{err}"
    );
    assert!(e.stats().shed >= 1);
    e.submit(request(5000, 1, 100, 100))
        .expect("a tenant with nothing waiting is accepted");
    // Without the setting nobody is refused.
    let mut plain = engine(PolicyKind::Wlvf, 16, 64, 16);
    for i in 0..60 {
        plain.submit(request(i, 0, 100, 100)).unwrap();
        plain.clock_mut().advance(0.05);
        plain.step().unwrap();
    }
}

#[test]
fn the_automatic_rotation_budget_follows_the_link_and_the_iteration_time() {
    let cfg = |b_xfer| EngineConfig {
        hbm_blocks: 400,
        dram_blocks: 4000,
        b_xfer,
        max_batched_tokens: 256,
        max_num_seqs: 64,
        ..EngineConfig::default()
    };
    let mut auto = engine_with(PolicyKind::Wlvf, cfg(None));
    let mut fixed = engine_with(PolicyKind::Wlvf, cfg(Some(48)));
    for e in [&mut auto, &mut fixed] {
        for i in 0..40 {
            e.submit(request(i, (i % 2) as u32, 200, 300)).unwrap();
        }
    }
    let profile = Profile::builtin("h200-llama-3-8b").unwrap();
    let rate = profile.hw.duplex_each_gbps * 1e9 / profile.model.geometry(16).block_bytes() as f64;
    let mut seen = Vec::new();
    for _ in 0..400 {
        auto.step().unwrap();
        fixed.step().unwrap();
        let (a, f) = (auto.stats(), fixed.stats());
        assert_eq!(f.b_xfer, 48, "a fixed budget stays fixed");
        assert_eq!(f.link_blocks_per_s, 0.0);
        assert!((a.link_blocks_per_s - rate).abs() < 1e-6 * rate);
        // Never below the largest live request's current need: a waiting one's prompt (200
        // tokens = 13 blocks) at least, a whole request (500 tokens = 32 blocks) at most.
        if !auto.is_empty() {
            assert!(a.b_xfer >= 13, "{a:?}");
        }
        if let Some(t) = auto.xfer.iteration_s() {
            let link = (rate * t).round() as u32;
            assert!(
                a.b_xfer == link || (a.b_xfer > link && a.b_xfer <= 32),
                "{a:?}"
            );
        }
        seen.push(a.b_xfer);
    }
    seen.dedup();
    assert!(
        seen.len() > 1,
        "the budget never moved with the iteration time: {seen:?}"
    );
}
