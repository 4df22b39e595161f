//! A fleet's usage export (`superinfer usage --node …`): two nodes, each with its own ledger,
//! summed exactly once; tenants matched by name though their ids differ; the same node twice
//! or a node that does not answer is an error, never a wrong sum.

use serde_json::json;
use std::collections::HashMap;
use superinfer_gateway::cli::fleet_usage::{fleet_report, FleetUsageArgs};
use superinfer_gateway::usage::Format;
use superinfer_tests::{TestServer, ADMIN_TOKEN};

fn args(nodes: &[&TestServer]) -> FleetUsageArgs {
    FleetUsageArgs {
        nodes: nodes.iter().map(|s| s.base.clone()).collect(),
        admin_token: ADMIN_TOKEN.to_string(),
        tenant: None,
        from: None,
        to: None,
        format: Format::Json,
        timeout_s: 10.0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_export_sums_every_node_once() {
    let a = TestServer::start().await;
    let b = TestServer::start().await;
    // "acme" gets a different id on each node.
    let (acme_a_id, acme_a) = a.create_tenant(json!({"name": "acme"})).await;
    b.create_tenant(json!({"name": "other"})).await;
    let (acme_b_id, acme_b) = b.create_tenant(json!({"name": "acme"})).await;
    assert_ne!(acme_a_id, acme_b_id);
    // Completion tokens the clients were told, per tenant name: (requests, tokens).
    let mut told: HashMap<&str, (u64, u64)> = HashMap::new();
    for (node, key, name, rounds) in [
        (&a, &acme_a, "acme", 3),
        (&b, &acme_b, "acme", 2),
        (&a, &a.key, "default", 1),
        (&b, &b.key, "default", 2),
    ] {
        for i in 0..rounds {
            let (status, v) = node.complete(key, 2 + i).await;
            assert!(status.is_success(), "{v}");
            let e = told.entry(name).or_default();
            e.0 += 1;
            e.1 += v["usage"]["completion_tokens"].as_u64().unwrap();
        }
    }
    let fleet = fleet_report(&args(&[&a, &b])).await.unwrap();
    assert_eq!(fleet.ledgers.len(), 2);
    assert_ne!(fleet.ledgers[0], fleet.ledgers[1]);
    for (name, (requests, tokens)) in &told {
        let rows: Vec<_> = fleet
            .data
            .iter()
            .filter(|r| r.tenant.as_deref() == Some(*name))
            .collect();
        let sum_requests: u64 = rows.iter().map(|r| r.counts.requests).sum();
        let sum_tokens: u64 = rows.iter().map(|r| r.counts.completion_tokens).sum();
        assert_eq!((sum_requests, sum_tokens), (*requests, *tokens), "{name}");
    }
    assert_eq!(fleet.totals.requests, 8);
    // One tenant by name, on every node.
    let only = FleetUsageArgs {
        tenant: Some("acme".into()),
        ..args(&[&a, &b])
    };
    let acme = fleet_report(&only).await.unwrap();
    assert_eq!(acme.totals.requests, 5);
    // The same node twice would count its ledger twice: refused.
    let err = fleet_report(&args(&[&a, &b, &a])).await.unwrap_err();
    assert!(err.to_string().contains("counted twice"), "{err:#}");
    // A wrong token, and a node that is gone: errors naming the node, no partial sum.
    let bad = FleetUsageArgs {
        admin_token: "not-the-admin-token-at-all".into(),
        ..args(&[&a])
    };
    let err = fleet_report(&bad).await.unwrap_err();
    assert!(err.to_string().contains(&a.base), "{err:#}");
    let gone = b.base.clone();
    b.shutdown().await;
    let err = fleet_report(&FleetUsageArgs {
        nodes: vec![a.base.clone(), gone.clone()],
        ..args(&[&a])
    })
    .await
    .unwrap_err();
    assert!(format!("{err:#}").contains(&gone), "{err:#}");
    a.shutdown().await;
}
