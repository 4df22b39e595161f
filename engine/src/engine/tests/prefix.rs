//! The prefix cache in the engine (issue 12): hits in HBM and from DRAM, isolation between
//! namespaces, shared namespaces and salts, dropping a namespace, the HBM-only cache, and
//! rotation that never copies or drops what others still use.

use super::*;
use crate::kv::CacheScope;

fn cache_engine(hbm: u32, dram_level: bool) -> TestEngine {
    engine_with(
        PolicyKind::Wlvf,
        EngineConfig {
            hbm_blocks: hbm,
            dram_blocks: 512,
            b_xfer: Some(64),
            max_batched_tokens: 512,
            max_num_seqs: 64,
            prefix_cache_dram: dram_level,
            ..EngineConfig::default()
        },
    )
}

/// A request of `tenant` whose prompt is `prompt`.
fn asking(id: u64, tenant: u32, prompt: &[u32], max_tokens: u32) -> EngineRequest {
    let mut r = request(id, tenant, 1, max_tokens);
    r.prompt = prompt.to_vec();
    r
}

/// 100 tokens: six full blocks and a partial one.
fn chat() -> Vec<u32> {
    (0..100).map(|i| 5000 + i).collect()
}

/// Runs one request to its end; returns its Finished event's cached prefix, its time to first
/// token, and the prefill tokens the engine computed for it.
fn run_one(e: &mut TestEngine, req: EngineRequest) -> (PrefixHit, f64, u32) {
    let id = req.id;
    let t0 = e.clock().now();
    e.submit(req).unwrap();
    let (mut first, mut prefill) = (None, 0);
    for _ in 0..1000 {
        if e.request(id).is_none() {
            break;
        }
        let r = e.step().unwrap();
        prefill += r.prefill_tokens;
        if let Some(t) = r.idle_until {
            e.clock_mut().skip_to(t);
        }
        e.pool().check().unwrap();
        for ev in e.take_events() {
            match ev {
                EngineEvent::Token { id: i, t, .. } if i == id => {
                    first.get_or_insert(t - t0);
                }
                EngineEvent::Finished { id: i, end, .. } if i == id => {
                    return (end.cached, first.expect("a token first"), prefill);
                }
                _ => {}
            }
        }
    }
    panic!("{id:?} did not finish");
}

/// Steps until the pool's writebacks have landed (so the blocks are cache entries).
fn settle(e: &mut TestEngine) {
    for _ in 0..20 {
        e.clock_mut().advance(0.01);
        e.step().unwrap();
    }
}

#[test]
fn a_hit_on_a_long_prompt_shortens_its_time_to_first_token() {
    // 1,500 tokens: three 512-token chunks, each bound by compute on the h200 profile.
    let mut e = cache_engine(256, true);
    let long: Vec<u32> = (0..1500).map(|i| 7000 + i).collect();
    let (_, ttft_miss, prefill_miss) = run_one(&mut e, asking(1, 0, &long, 4));
    assert_eq!(prefill_miss, 1500);
    settle(&mut e);
    let (hit, ttft_hit, prefill_hit) = run_one(&mut e, asking(2, 0, &long, 4));
    assert_eq!(hit.hbm, 1488, "{hit:?}");
    assert_eq!(prefill_hit, 12);
    assert!(
        ttft_hit < ttft_miss / 3.0,
        "a hit of 1,488 tokens: {ttft_hit} vs {ttft_miss}"
    );
}

#[test]
fn a_repeated_prompt_hits_in_hbm_and_prefills_only_its_tail() {
    let mut e = cache_engine(256, true);
    let (miss, ttft_miss, prefill_miss) = run_one(&mut e, asking(1, 0, &chat(), 4));
    assert_eq!(miss, PrefixHit::default());
    assert_eq!(prefill_miss, 100);
    settle(&mut e);
    let (hit, ttft_hit, prefill_hit) = run_one(&mut e, asking(2, 0, &chat(), 4));
    // Six full blocks cached; the partial tail (4 tokens) is prefilled again.
    assert_eq!(hit, PrefixHit { hbm: 96, dram: 0 });
    assert_eq!(prefill_hit, 4);
    // A 100-token prefill on the h200 profile is bound by reading the weights, as is a 4-token
    // one: the hit is no slower (the cheaper admission is what `prefill_hit` shows).
    assert!(
        ttft_hit <= ttft_miss * (1.0 + 1e-9),
        "{ttft_hit} vs {ttft_miss}"
    );
    let s = e.stats();
    assert_eq!(s.prefix_hit_hbm_tokens, 96);
    assert_eq!(s.prefix_query_tokens, 200);
    assert!(
        s.prefix_hbm_blocks >= 6 && s.prefix_dram_blocks >= 6,
        "{s:?}"
    );
}

#[test]
fn a_prompt_of_whole_blocks_recomputes_its_last_block() {
    let mut e = cache_engine(256, true);
    let prompt: Vec<u32> = (0..64).collect();
    // Two tokens: it ends while its writebacks are in flight; its blocks are kept anyway.
    run_one(&mut e, asking(1, 0, &prompt, 2));
    settle(&mut e);
    // Its last token's logits are computed, so its block is never shared: 3 of 4 blocks hit.
    let (hit, _, prefill) = run_one(&mut e, asking(2, 0, &prompt, 2));
    assert_eq!(hit.tokens(), 48);
    assert_eq!(prefill, 16);
}

#[test]
fn another_tenant_gets_no_hit_and_no_faster_first_token() {
    let mut e = cache_engine(256, true);
    let (_, ttft_a, _) = run_one(&mut e, asking(1, 0, &chat(), 4));
    settle(&mut e);
    let (hit, ttft_b, prefill) = run_one(&mut e, asking(2, 1, &chat(), 4));
    assert_eq!(hit, PrefixHit::default());
    assert_eq!(prefill, 100);
    // The same work on an idle engine: the same time to first token, to the tick.
    assert!((ttft_b - ttft_a).abs() < 1e-9, "{ttft_b} vs {ttft_a}");
}

#[test]
fn a_shared_namespace_hits_across_tenants_and_a_salt_narrows_it() {
    let mut e = cache_engine(256, true);
    let shared = |id, tenant, salt: Option<&str>| {
        let mut r = asking(id, tenant, &chat(), 4);
        r.cache = Some(CacheScope::shared("team").salted(salt.map(String::from)));
        r
    };
    run_one(&mut e, shared(1, 0, None));
    settle(&mut e);
    assert_eq!(run_one(&mut e, shared(2, 1, None)).0.tokens(), 96);
    // A salt is a namespace of its own: first a miss, then a hit for the same salt only.
    assert_eq!(run_one(&mut e, shared(3, 1, Some("s1"))).0.tokens(), 0);
    settle(&mut e);
    assert_eq!(run_one(&mut e, shared(4, 2, Some("s1"))).0.tokens(), 96);
    assert_eq!(run_one(&mut e, shared(5, 2, Some("s2"))).0.tokens(), 0);
    // The tenant's own namespace is not the shared one.
    assert_eq!(run_one(&mut e, asking(6, 0, &chat(), 4)).0.tokens(), 0);
}

#[test]
fn dropping_a_namespace_ends_its_hits_and_spares_the_others() {
    let mut e = cache_engine(256, true);
    run_one(&mut e, asking(1, 0, &chat(), 4));
    run_one(&mut e, asking(2, 1, &chat(), 4));
    settle(&mut e);
    let dropped = e.drop_prefix_cache(&CacheScope::tenant_base(TenantId(0)));
    assert!(dropped >= 6, "{dropped}");
    e.pool().check().unwrap();
    assert_eq!(run_one(&mut e, asking(3, 0, &chat(), 4)).0.tokens(), 0);
    assert_eq!(run_one(&mut e, asking(4, 1, &chat(), 4)).0.tokens(), 96);
}

/// Fills HBM with other prompts, so that the first prompt's cached copies leave HBM (their
/// DRAM copies stay).
fn push_out_of_hbm(e: &mut TestEngine) {
    for i in 0..6 {
        let other: Vec<u32> = (0..200).map(|t| 90_000 + i * 1000 + t).collect();
        run_one(e, asking(100 + u64::from(i), 0, &other, 8));
        settle(e);
    }
}

#[test]
fn a_hit_only_in_dram_is_copied_in_through_the_copy_engine() {
    let mut e = cache_engine(24, true);
    run_one(&mut e, asking(1, 0, &chat(), 4));
    settle(&mut e);
    push_out_of_hbm(&mut e);
    let h2d = e.stats().bytes_h2d;
    let (hit, _, prefill) = run_one(&mut e, asking(2, 0, &chat(), 4));
    assert_eq!(hit, PrefixHit { hbm: 0, dram: 96 });
    assert_eq!(prefill, 4);
    let block = e.runner.geometry().block_bytes();
    assert_eq!(e.stats().bytes_h2d - h2d, 6 * block);
}

#[test]
fn an_hbm_only_cache_forgets_what_left_hbm() {
    let mut e = cache_engine(24, false);
    run_one(&mut e, asking(1, 0, &chat(), 4));
    settle(&mut e);
    assert_eq!(run_one(&mut e, asking(2, 0, &chat(), 4)).0.tokens(), 96);
    settle(&mut e);
    push_out_of_hbm(&mut e);
    let (hit, _, prefill) = run_one(&mut e, asking(3, 0, &chat(), 4));
    assert_eq!(hit, PrefixHit::default());
    assert_eq!(prefill, 100);
}

/// An engine with the prefix cache and no DRAM tier (HBM-only KV).
fn no_dram_engine(hbm: u32) -> TestEngine {
    engine_with(
        PolicyKind::Wlvf,
        EngineConfig {
            hbm_blocks: hbm,
            dram_blocks: 0,
            max_batched_tokens: 512,
            max_num_seqs: 64,
            ..EngineConfig::default()
        },
    )
}

#[test]
fn without_a_dram_tier_finished_blocks_are_cached_in_hbm() {
    // Nothing is written back (no DRAM): the six full blocks of the first request stay in
    // HBM as entries when it finishes, and the same prompt hits them there.
    let mut e = no_dram_engine(64);
    let (hit, _, prefill) = run_one(&mut e, asking(1, 0, &chat(), 4));
    assert_eq!((hit, prefill), (PrefixHit::default(), 100));
    let (hit, _, prefill) = run_one(&mut e, asking(2, 0, &chat(), 4));
    assert_eq!(hit, PrefixHit { hbm: 96, dram: 0 });
    assert_eq!(prefill, 4);
    assert_eq!(e.stats().bytes_h2d + e.stats().bytes_d2h, 0);
    // A conversation's next turn starts with its history: it hits the blocks of the turn
    // before (prompt and answer) that are full.
    let mut history = chat();
    history.extend(1000..1030);
    let (hit, _, _) = run_one(&mut e, asking(3, 0, &history, 4));
    assert_eq!(hit.tokens(), 96);
    e.pool().check().unwrap();
}

#[test]
fn without_a_dram_tier_cached_blocks_give_way_to_running_requests() {
    // 24 slots: other prompts need the cached blocks' slots, which are dropped (the entries
    // with them: there is no DRAM copy to keep); the prompt then misses.
    let mut e = no_dram_engine(24);
    run_one(&mut e, asking(1, 0, &chat(), 4));
    for i in 0..3 {
        let other: Vec<u32> = (0..300).map(|t| 90_000 + i * 1000 + t).collect();
        run_one(&mut e, asking(100 + u64::from(i), 0, &other, 8));
    }
    e.pool().check().unwrap();
    let (hit, _, prefill) = run_one(&mut e, asking(2, 0, &chat(), 4));
    assert_eq!(hit, PrefixHit::default());
    assert_eq!(prefill, 100);
    assert_eq!(e.pool().hbm_available(), 24);
}

#[test]
fn a_history_loses_its_tail_before_the_prefix_its_next_turn_starts_with() {
    // HBM-only, 24 slots: the first prompt leaves six entries; the second takes the 18 free
    // slots and one more, so exactly one of them is dropped. Its last block goes (released
    // last to first), so the prompt still hits its first five blocks; were the oldest fill
    // dropped first, its first block would go and with it every hit after it.
    let mut e = cache_engine(24, false);
    run_one(&mut e, asking(1, 0, &chat(), 4));
    settle(&mut e);
    let other: Vec<u32> = (0..290).map(|t| 60_000 + t).collect();
    run_one(&mut e, asking(2, 0, &other, 4));
    settle(&mut e);
    let (hit, _, prefill) = run_one(&mut e, asking(3, 0, &chat(), 4));
    assert_eq!(hit, PrefixHit { hbm: 80, dram: 0 });
    assert_eq!(prefill, 20);
}

#[test]
fn rotating_out_a_request_copies_none_of_the_blocks_others_share() {
    let mut e = cache_engine(256, true);
    run_one(&mut e, asking(1, 0, &chat(), 4));
    settle(&mut e);
    // Two requests share the six cached blocks; rotating one out leaves them in HBM for the
    // other and copies at most its private tail.
    e.submit(asking(2, 0, &chat(), 200)).unwrap();
    e.submit(asking(3, 0, &chat(), 200)).unwrap();
    for _ in 0..5 {
        e.step().unwrap();
    }
    let shared = |e: &TestEngine, id| {
        e.pool()
            .table(RequestId(id))
            .iter()
            .filter(|b| b.state == BlockState::Shared)
            .count()
    };
    assert_eq!(shared(&e, 2), 6);
    assert_eq!(shared(&e, 3), 6);
    let d2h = e.stats().bytes_d2h;
    let mut copies = crate::transfer::CopyBatch::default();
    e.rotate_out(RequestId(2), &mut copies);
    assert!(copies.d2h.len() <= 1, "{:?}", copies.d2h);
    let hbm: Vec<_> = e.pool().hbm_slots(RequestId(3));
    assert_eq!(hbm.len(), e.pool().table(RequestId(3)).len());
    assert!(e.pool().table(RequestId(2))[..6]
        .iter()
        .all(|b| b.state == BlockState::SharedOut && b.hbm.is_none()));
    let tickets = e.transfer.submit(e.clock().now(), copies);
    e.pool.commit(tickets);
    e.pool().check().unwrap();
    assert!(e.stats().bytes_d2h - d2h <= e.runner.geometry().block_bytes());
    // Both finish; the cache keeps the blocks.
    drain(&mut e, 2000);
    assert!(e.is_empty());
    assert_eq!(run_one(&mut e, asking(4, 0, &chat(), 4)).0.tokens(), 96);
}

/// Runs every live request to its end; returns each one's Finished cached prefix and the
/// prefill tokens computed in all.
fn run_all(e: &mut TestEngine, ids: &[RequestId]) -> (Vec<PrefixHit>, u32) {
    let mut cached = vec![None; ids.len()];
    let mut prefill = 0;
    for _ in 0..2000 {
        if cached.iter().all(Option::is_some) {
            break;
        }
        e.clock_mut().advance(0.001);
        let r = e.step().unwrap();
        prefill += r.prefill_tokens;
        e.pool().check().unwrap();
        for ev in e.take_events() {
            if let EngineEvent::Finished { id, end, .. } = ev {
                if let Some(i) = ids.iter().position(|&x| x == id) {
                    cached[i] = Some(end.cached);
                }
            }
        }
    }
    let cached = cached.into_iter().map(|c| c.expect("finished")).collect();
    (cached, prefill)
}

#[test]
fn choices_that_follow_a_leader_find_its_prompt_cached_instead_of_computing_it() {
    // Three choices of one prompt submitted at once.
    let trio = |e: &mut TestEngine, base: u64, follow: bool| {
        let leader = asking(base, 0, &chat(), 8);
        e.submit(leader).unwrap();
        for j in 1..3 {
            let mut r = asking(base + j, 0, &chat(), 8);
            r.follows = follow.then_some(RequestId(base));
            e.submit(r).unwrap();
        }
        [RequestId(base), RequestId(base + 1), RequestId(base + 2)]
    };
    // Without `follows` all three are admitted together and each computes the prompt.
    let mut e = cache_engine(256, true);
    let ids = trio(&mut e, 1, false);
    let (cached, prefill) = run_all(&mut e, &ids);
    assert_eq!(prefill, 300, "{cached:?}");
    // With it the followers wait for the leader's blocks: six full blocks each are cached,
    // and only their 4-token tails are computed again.
    let mut e = cache_engine(256, true);
    let ids = trio(&mut e, 1, true);
    let (cached, prefill) = run_all(&mut e, &ids);
    assert_eq!(cached[0], PrefixHit::default());
    for c in &cached[1..] {
        assert_eq!(c.hbm + c.dram, 96, "{cached:?}");
    }
    assert_eq!(prefill, 100 + 2 * 4);
    // A follower whose leader is gone (aborted) does not wait.
    let mut e = cache_engine(256, true);
    let ids = trio(&mut e, 1, true);
    e.abort(ids[0]);
    let (_, prefill) = run_all(&mut e, &ids[1..]);
    assert!(prefill >= 100, "{prefill}");
    // Without the prefix cache, `follows` changes nothing.
    let mut e = engine_with(
        PolicyKind::Wlvf,
        EngineConfig {
            hbm_blocks: 256,
            dram_blocks: 512,
            prefix_cache: false,
            ..EngineConfig::default()
        },
    );
    let ids = trio(&mut e, 1, true);
    assert_eq!(run_all(&mut e, &ids).1, 300);
}

#[test]
fn a_request_arriving_while_its_prefix_is_prefilled_waits_for_it_instead_of_computing_it() {
    // A 1,500-token prompt prefills in three 512-token chunks; one step in, a second prompt
    // arrives that shares its first 1,200 tokens (75 full blocks) and then differs.
    let long: Vec<u32> = (0..1500).map(|i| 7000 + i).collect();
    let mut other = long[..1200].to_vec();
    other.extend((0..300).map(|i| 20_000 + i));
    let pair = |tenant: u32| {
        let mut e = cache_engine(256, true);
        e.submit(asking(1, 0, &long, 4)).unwrap();
        e.clock_mut().advance(0.001);
        let r = e.step().unwrap();
        assert_eq!(r.prefill_tokens, 512);
        e.submit(asking(2, tenant, &other, 4)).unwrap();
        let (cached, rest) = run_all(&mut e, &[RequestId(1), RequestId(2)]);
        (cached, 512 + rest)
    };
    let (cached, prefill) = pair(0);
    assert_eq!(cached[0], PrefixHit::default());
    assert_eq!(cached[1].hbm + cached[1].dram, 1200, "{cached:?}");
    assert_eq!(prefill, 1500 + 300);
    // Another tenant's namespace shares nothing, so its request never waits for the prefix.
    let (cached, prefill) = pair(1);
    assert_eq!(cached[1], PrefixHit::default());
    assert_eq!(prefill, 1500 + 1500);
}
