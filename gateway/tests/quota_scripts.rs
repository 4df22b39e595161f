//! The fleet's quota scripts (`gateway/src/quota/fleet/*.lua`) against a real `redis-server`,
//! on the tests' own clock: the same quotas admit the same requests as the local limiters
//! (governor's GCRA for the rate, the token bucket for tokens per minute), and concurrency
//! leases expire unless refreshed.

#[path = "support/redis_server.rs"]
mod redis_server;

use governor::clock::FakeRelativeClock;
use governor::RateLimiter;
use rand::{Rng, SeedableRng};
use redis::aio::MultiplexedConnection;
use std::time::{Duration, Instant};
use superinfer_gateway::quota::fleet::scripts::{self, Decision, TenantKeys};
use superinfer_gateway::quota::local::{rate_quota, TokenBucket};
use superinfer_gateway::quota::Refusal;
use superinfer_tenants::Quotas;

const T0: u64 = 1_700_000_000_000_000; // µs
const TTL: Duration = Duration::from_secs(30);

async fn connect(r: &redis_server::RedisServer) -> MultiplexedConnection {
    redis::Client::open(r.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("connects to the test redis-server")
}

fn quotas(rps: f64, burst: u32, tpm: u64, concurrent: u32) -> Quotas {
    Quotas {
        requests_per_s: rps,
        burst,
        tokens_per_min: tpm,
        max_concurrent: concurrent,
        ..Quotas::default()
    }
}

#[tokio::test]
async fn the_request_rate_is_governors_gcra() {
    let r = redis_server::RedisServer::start();
    let mut c = connect(&r).await;
    let keys = TenantKeys::new("t:", "rate");
    let q = quotas(8.0, 4, 1_000_000, 1_000_000); // T = 125 ms exactly, in µs and ns
    let clock = FakeRelativeClock::default();
    let local = RateLimiter::direct_with_clock(rate_quota(&q), clock.clone());
    let mut rng = rand::rngs::StdRng::seed_from_u64(15);
    let mut now = T0;
    let (mut admitted, mut refused) = (0, 0);
    for i in 0..400 {
        // Bursts and pauses around the rate.
        let gap_us = if rng.random_bool(0.8) {
            rng.random_range(0..60_000)
        } else {
            900_000
        };
        now += gap_us;
        clock.advance(Duration::from_micros(gap_us));
        let lease = format!("l{i}");
        let fleet = scripts::admit(&mut c, &keys, &q, &lease, TTL, Some(now))
            .await
            .unwrap();
        let want = local.check().is_ok();
        assert_eq!(
            fleet == Decision::Admitted,
            want,
            "request {i} at +{} µs",
            now - T0
        );
        match fleet {
            Decision::Admitted => admitted += 1,
            Decision::Refused(Refusal::Rate { wait, .. }) => {
                refused += 1;
                assert!(wait > Duration::ZERO && wait <= Duration::from_millis(125));
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(
        admitted > 50 && refused > 50,
        "{admitted} admitted, {refused} refused"
    );
}

#[tokio::test]
async fn tokens_per_minute_is_the_local_bucket_with_debt() {
    let r = redis_server::RedisServer::start();
    let mut c = connect(&r).await;
    let keys = TenantKeys::new("t:", "tokens");
    let q = quotas(1e6, 1_000_000, 600, 1_000_000); // 10 tokens/s
                                                    // The local unit test's numbers: 650 tokens leave 50 in debt, repaid in 5 s.
    assert_eq!(d_at(&keys, &q, T0, &mut c, 0).await, Decision::Admitted);
    let balance = scripts::charge(&mut c, &keys, 600, 650, Some(T0))
        .await
        .unwrap();
    assert!((balance + 50.0).abs() < 1e-6, "{balance}");
    match d_at(&keys, &q, T0, &mut c, 1).await {
        Decision::Refused(Refusal::Tokens { limit: 600, wait }) => {
            assert_eq!(wait, Duration::from_secs(5))
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        d_at(&keys, &q, T0 + 4_999_000, &mut c, 2).await,
        Decision::Refused(_)
    ));
    assert_eq!(
        d_at(&keys, &q, T0 + 5_000_000, &mut c, 3).await,
        Decision::Admitted
    );
    // The refill stops at the quota.
    let full = scripts::charge(&mut c, &keys, 600, 1, Some(T0 + 3_600_000_000))
        .await
        .unwrap();
    assert!((full - 599.0).abs() < 1e-6, "{full}");
    // A refund fills the bucket no further than full.
    let refunded = scripts::charge(&mut c, &keys, 600, -500, Some(T0 + 3_600_000_000))
        .await
        .unwrap();
    assert!((refunded - 600.0).abs() < 1e-6, "{refunded}");

    // Random charges and admissions: the same decisions and balances as the local bucket.
    let keys = TenantKeys::new("t:", "tokens-random");
    let q = quotas(1e6, 1_000_000, 12_000, 1_000_000);
    let start = Instant::now();
    let mut local = TokenBucket::new(12_000, start);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut now = 0u64;
    for i in 0..300 {
        now += rng.random_range(0..400_000);
        let at = start + Duration::from_micros(now);
        let fleet = d_at(&keys, &q, T0 + now, &mut c, i).await;
        let wait = local.debt_wait(at);
        match (&fleet, wait) {
            (Decision::Admitted, None) => {}
            (Decision::Refused(Refusal::Tokens { wait: w, .. }), Some(l)) => {
                assert!(w.abs_diff(l) <= Duration::from_micros(2), "{w:?} vs {l:?}")
            }
            other => panic!("step {i}: {other:?}"),
        }
        if fleet == Decision::Admitted {
            let tokens: u64 = rng.random_range(1..3_000);
            local.charge(tokens, at);
            scripts::charge(&mut c, &keys, 12_000, tokens as i64, Some(T0 + now))
                .await
                .unwrap();
            // Every third request used less than it reserved: the rest is refunded.
            if i % 3 == 0 {
                let back: u64 = rng.random_range(0..tokens + 2_000);
                local.refund(back, at);
                scripts::charge(&mut c, &keys, 12_000, -(back as i64), Some(T0 + now))
                    .await
                    .unwrap();
            }
        }
    }
}

async fn d_at(
    keys: &TenantKeys,
    q: &Quotas,
    now: u64,
    c: &mut MultiplexedConnection,
    i: usize,
) -> Decision {
    scripts::admit(c, keys, q, &format!("l{i}"), TTL, Some(now))
        .await
        .unwrap()
}

#[tokio::test]
async fn concurrency_leases_expire_unless_refreshed_and_release_frees_them() {
    let r = redis_server::RedisServer::start();
    let mut c = connect(&r).await;
    let keys = TenantKeys::new("t:", "leases");
    let q = quotas(1e6, 1_000_000, 1_000_000, 2);
    let ttl = Duration::from_secs(3);
    let conn = c.clone();
    let admit = |lease: &'static str, now: u64| {
        let (keys, q) = (keys.clone(), q);
        let mut c = conn.clone();
        async move {
            scripts::admit(&mut c, &keys, &q, lease, ttl, Some(now))
                .await
                .unwrap()
        }
    };
    assert_eq!(admit("a", T0).await, Decision::Admitted);
    assert_eq!(admit("b", T0).await, Decision::Admitted);
    assert_eq!(
        admit("c", T0 + 1).await,
        Decision::Refused(Refusal::Concurrency { limit: 2 })
    );
    // `a` keeps its slot by its heartbeat; `b` (its node died) expires at T0 + 3 s.
    assert!(
        scripts::refresh(&mut c, &keys, "a", ttl, Some(T0 + 2_000_000))
            .await
            .unwrap()
    );
    assert!(matches!(
        admit("c", T0 + 2_999_999).await,
        Decision::Refused(_)
    ));
    assert_eq!(admit("c", T0 + 3_000_000).await, Decision::Admitted);
    // A heartbeat after expiry does not bring `b` back over the limit.
    assert!(
        !scripts::refresh(&mut c, &keys, "b", ttl, Some(T0 + 3_000_001))
            .await
            .unwrap()
    );
    assert_eq!(scripts::leases(&mut c, &keys).await.unwrap(), 2);
    scripts::release(&mut c, &keys, "a").await.unwrap();
    assert_eq!(admit("d", T0 + 3_000_002).await, Decision::Admitted);
    assert!(matches!(
        admit("e", T0 + 3_000_003).await,
        Decision::Refused(_)
    ));
}

#[tokio::test]
async fn the_scripts_load_again_after_redis_forgets_them() {
    let r = redis_server::RedisServer::start();
    let mut c = connect(&r).await;
    let keys = TenantKeys::new("t:", "flush");
    let q = quotas(1e6, 1_000_000, 1_000_000, 10);
    assert_eq!(
        scripts::admit(&mut c, &keys, &q, "a", TTL, None)
            .await
            .unwrap(),
        Decision::Admitted
    );
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async::<()>(&mut c)
        .await
        .unwrap();
    // The server's clock this time (`None`), as in serving.
    assert_eq!(
        scripts::admit(&mut c, &keys, &q, "b", TTL, None)
            .await
            .unwrap(),
        Decision::Admitted
    );
    assert_eq!(scripts::leases(&mut c, &keys).await.unwrap(), 2);
    scripts::charge(&mut c, &keys, 1_000_000, 10, None)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_fan_out_takes_its_seats_all_or_none() {
    let r = redis_server::RedisServer::start();
    let mut c = connect(&r).await;
    let keys = TenantKeys::new("t:", "seats");
    let q = quotas(1000.0, 1000, 1_000_000, 8);
    let first = scripts::admit(&mut c, &keys, &q, "a", TTL, Some(T0))
        .await
        .unwrap();
    assert_eq!(first, Decision::Admitted);
    let ids = |p: &str, n: usize| (0..n).map(|i| format!("{p}{i}")).collect::<Vec<_>>();
    // Eight more would make nine: refused whole, nothing taken.
    assert!(
        !scripts::seats(&mut c, &keys, 8, &ids("b", 8), TTL, Some(T0))
            .await
            .unwrap()
    );
    assert_eq!(scripts::leases(&mut c, &keys).await.unwrap(), 1);
    assert!(
        scripts::seats(&mut c, &keys, 8, &ids("b", 7), TTL, Some(T0))
            .await
            .unwrap()
    );
    assert_eq!(scripts::leases(&mut c, &keys).await.unwrap(), 8);
    let full = scripts::admit(&mut c, &keys, &q, "c", TTL, Some(T0))
        .await
        .unwrap();
    assert_eq!(full, Decision::Refused(Refusal::Concurrency { limit: 8 }));
    // Seats expire like any lease when their node stops refreshing them.
    let later = T0 + TTL.as_micros() as u64 + 1;
    assert!(
        scripts::seats(&mut c, &keys, 8, &ids("d", 7), TTL, Some(later))
            .await
            .unwrap()
    );
}
