//! `deploy/` against the server: the Kubernetes manifests parse and agree with the gateway's
//! configuration (its defaults and constants, read from the code, not repeated here), and
//! every metric name the Grafana dashboard and the Prometheus alert rules use is on a live
//! server's `/metrics`.

use reqwest::StatusCode;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use superinfer_gateway::server::{LIVENESS_PATH, METRICS_PATH, READINESS_PATH};
use superinfer_gateway::{ServeConfig, Settings};
use superinfer_tests::{metric_names, TestOptions, TestServer};
use yaml_rust2::{Yaml, YamlLoader};

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn read(rel: &str) -> String {
    let p = deploy().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Every document of every `deploy/k8s/*.yaml`, as (file, document).
fn manifests() -> Vec<(String, Yaml)> {
    let mut out = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(deploy().join("k8s"))
        .expect("deploy/k8s")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    for f in files {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&f).unwrap();
        let docs = YamlLoader::load_from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        for d in docs {
            assert!(
                d["apiVersion"].as_str().is_some() && d["kind"].as_str().is_some(),
                "{name}: a document without apiVersion/kind"
            );
            out.push((name.clone(), d));
        }
    }
    out
}

fn one<'a>(all: &'a [(String, Yaml)], kind: &str, name: &str) -> &'a Yaml {
    let found: Vec<_> = all
        .iter()
        .filter(|(_, d)| {
            d["kind"].as_str() == Some(kind) && d["metadata"]["name"].as_str() == Some(name)
        })
        .collect();
    assert_eq!(found.len(), 1, "exactly one {kind} {name}");
    &found[0].1
}

fn int(y: &Yaml, what: &str) -> i64 {
    y.as_i64()
        .unwrap_or_else(|| panic!("{what}: not an integer: {y:?}"))
}

/// The ConfigMap's settings file, through the server's own parser and defaults.
fn served_config(all: &[(String, Yaml)]) -> ServeConfig {
    let cm = one(all, "ConfigMap", "superinfer-config");
    let toml = cm["data"]["superinfer.toml"]
        .as_str()
        .expect("superinfer.toml");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("superinfer.toml");
    std::fs::write(&path, toml).unwrap();
    let settings = Settings::from_file(&path).expect("the server reads the ConfigMap's file");
    ServeConfig::resolve(settings).expect("valid settings")
}

#[test]
fn the_manifests_agree_with_the_servers_configuration() {
    let all = manifests();
    let defaults = ServeConfig::resolve(Settings::default()).expect("the defaults");
    let cfg = served_config(&all);
    let port = i64::from(cfg.listen.port());
    assert_eq!(port, i64::from(defaults.listen.port()), "the default port");
    assert!(
        cfg.listen.ip().is_unspecified(),
        "a pod listens on every interface"
    );
    assert_eq!(
        cfg.metrics_listen, None,
        "/metrics on the API port, as the manifests scrape"
    );

    let deploy = one(&all, "StatefulSet", "superinfer");
    let pod = &deploy["spec"]["template"];
    let labels = pod["metadata"]["labels"]
        .as_hash()
        .expect("pod labels")
        .clone();
    let c = &pod["spec"]["containers"][0];
    let env = c["env"].as_vec().expect("env");
    let config_env = env
        .iter()
        .find(|e| e["name"].as_str() == Some("SUPERINFER_CONFIG"))
        .expect("SUPERINFER_CONFIG");
    let mount = c["volumeMounts"]
        .as_vec()
        .unwrap()
        .iter()
        .find(|m| m["name"].as_str() == Some("config"))
        .expect("the config volume");
    assert_eq!(
        config_env["value"].as_str().unwrap(),
        format!("{}/superinfer.toml", mount["mountPath"].as_str().unwrap())
    );
    let data = c["volumeMounts"]
        .as_vec()
        .unwrap()
        .iter()
        .find(|m| m["name"].as_str() == Some("data"))
        .expect("the data volume");
    assert_eq!(Path::new(data["mountPath"].as_str().unwrap()), cfg.data_dir);
    // The data directory (tenant store and usage ledger) is each pod's persistent volume,
    // kept when the set scales down, never an emptyDir that a rescheduled pod loses.
    let claims = deploy["spec"]["volumeClaimTemplates"]
        .as_vec()
        .expect("volume claims");
    assert!(claims
        .iter()
        .any(|c| c["metadata"]["name"].as_str() == Some("data")));
    let volumes = pod["spec"]["volumes"].as_vec().expect("volumes");
    assert!(!volumes.iter().any(|v| v["name"].as_str() == Some("data")));
    let retain = &deploy["spec"]["persistentVolumeClaimRetentionPolicy"];
    assert_eq!(retain["whenScaled"].as_str(), Some("Retain"));
    assert_eq!(retain["whenDeleted"].as_str(), Some("Retain"));
    // Its pods are named under a headless Service, which the fleet's usage export uses.
    let nodes = one(
        &all,
        "Service",
        deploy["spec"]["serviceName"].as_str().unwrap(),
    );
    assert_eq!(nodes["spec"]["clusterIP"].as_str(), Some("None"));
    assert_eq!(
        nodes["spec"]["selector"].as_hash(),
        deploy["spec"]["selector"]["matchLabels"].as_hash()
    );
    let http = &c["ports"][0];
    assert_eq!(http["name"].as_str(), Some("http"));
    assert_eq!(int(&http["containerPort"], "containerPort"), port);
    for (probe, path) in [
        ("startupProbe", LIVENESS_PATH),
        ("livenessProbe", LIVENESS_PATH),
        ("readinessProbe", READINESS_PATH),
    ] {
        assert_eq!(c[probe]["httpGet"]["path"].as_str(), Some(path), "{probe}");
        assert_eq!(
            c[probe]["httpGet"]["port"].as_str(),
            Some("http"),
            "{probe}"
        );
    }
    let pre_stop = int(&c["lifecycle"]["preStop"]["sleep"]["seconds"], "preStop");
    let grace = int(
        &deploy["spec"]["template"]["spec"]["terminationGracePeriodSeconds"],
        "grace",
    );
    assert!(
        pre_stop as f64 + cfg.drain_timeout.as_secs_f64() < grace as f64,
        "preStop {pre_stop} s + drain {:?} must end before the SIGKILL at {grace} s",
        cfg.drain_timeout
    );

    let svc = one(&all, "Service", "superinfer");
    assert_eq!(svc["spec"]["ports"][0]["targetPort"].as_str(), Some("http"));
    let pool = one(&all, "InferencePool", "superinfer");
    assert_eq!(
        pool["apiVersion"].as_str(),
        Some("inference.networking.k8s.io/v1")
    );
    assert_eq!(
        int(&pool["spec"]["targetPorts"][0]["number"], "targetPorts"),
        port
    );
    for (selector, what) in [
        (&pool["spec"]["selector"]["matchLabels"], "pool"),
        (&svc["spec"]["selector"], "service"),
        (&deploy["spec"]["selector"]["matchLabels"], "deployment"),
    ] {
        for (k, v) in selector
            .as_hash()
            .unwrap_or_else(|| panic!("{what} selector"))
        {
            assert_eq!(labels.get(k), Some(v), "the {what} selects the pods");
        }
    }
    let objectives: BTreeSet<&str> = all
        .iter()
        .filter(|(_, d)| d["kind"].as_str() == Some("InferenceObjective"))
        .map(|(_, d)| {
            assert_eq!(
                d["apiVersion"].as_str(),
                Some("inference.networking.x-k8s.io/v1alpha2")
            );
            assert_eq!(d["spec"]["poolRef"]["name"].as_str(), Some("superinfer"));
            d["metadata"]["name"].as_str().unwrap()
        })
        .collect();
    let configured: BTreeSet<&str> = cfg.proxy.objectives.keys().map(String::as_str).collect();
    assert!(!objectives.is_empty());
    assert_eq!(
        objectives, configured,
        "each InferenceObjective is a configured objective"
    );
    assert!(
        !cfg.proxy.trusted.is_empty(),
        "the gateway's proxy is trusted"
    );

    let route = one(&all, "HTTPRoute", "superinfer");
    let backend = &route["spec"]["rules"][0]["backendRefs"][0];
    assert_eq!(backend["kind"].as_str(), Some("InferencePool"));
    assert_eq!(backend["name"].as_str(), Some("superinfer"));
    let monitor = one(&all, "PodMonitor", "superinfer");
    let ep = &monitor["spec"]["podMetricsEndpoints"][0];
    assert_eq!(ep["port"].as_str(), Some("http"));
    assert_eq!(ep["path"].as_str(), Some(METRICS_PATH));
}

#[test]
fn the_tenants_configmap_is_a_tenants_file_the_server_applies() {
    let all = manifests();
    let cfg = served_config(&all);
    let file = cfg
        .tenants_file
        .as_ref()
        .expect("the pods apply a tenants file");
    let deploy = one(&all, "StatefulSet", "superinfer");
    let pod = &deploy["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let mount = c["volumeMounts"]
        .as_vec()
        .unwrap()
        .iter()
        .find(|m| m["name"].as_str() == Some("tenants"))
        .expect("the tenants volume is mounted");
    assert_eq!(
        file.path.parent(),
        Some(Path::new(mount["mountPath"].as_str().unwrap())),
        "tenants_file is in the mounted ConfigMap"
    );
    let volume = pod["volumes"]
        .as_vec()
        .unwrap()
        .iter()
        .find(|v| v["name"].as_str() == Some("tenants"))
        .expect("the tenants volume");
    let cm_name = volume["configMap"]["name"].as_str().expect("a ConfigMap");
    let cm = one(&all, "ConfigMap", cm_name);
    let key = file.path.file_name().unwrap().to_str().unwrap();
    let text = cm["data"][key]
        .as_str()
        .unwrap_or_else(|| panic!("ConfigMap {cm_name} has no {key}"));

    // The keys that `api_key_env` names come from the Secret the pods take their env from.
    let secret = one(&all, "Secret", "superinfer-tenant-keys");
    let from_env: Vec<&str> = c["envFrom"]
        .as_vec()
        .expect("envFrom")
        .iter()
        .filter_map(|e| e["secretRef"]["name"].as_str())
        .collect();
    assert!(from_env.contains(&"superinfer-tenant-keys"), "{from_env:?}");
    let values = secret["stringData"].as_hash().expect("stringData");
    let asked = std::cell::RefCell::new(BTreeSet::new());
    let parsed = superinfer_tenants::TenantsFile::parse(key, text, |var| {
        asked.borrow_mut().insert(var.to_string());
        values
            .get(&Yaml::String(var.to_string()))
            .and_then(Yaml::as_str)
            .map(str::to_string)
    })
    .expect("the ConfigMap is a tenants file the server accepts, with the Secret's keys");
    let in_secret: BTreeSet<String> = values
        .keys()
        .map(|k| k.as_str().unwrap().to_string())
        .collect();
    assert!(!asked.borrow().is_empty(), "the example shows api_key_env");
    assert_eq!(
        *asked.borrow(),
        in_secret,
        "each env reference is in the Secret, and only they"
    );
    assert!(
        text.contains("api_key_sha256"),
        "the example shows api_key_sha256"
    );
    let dir = tempfile::tempdir().unwrap();
    let store = superinfer_tenants::TenantStore::open(dir.path().join("tenants")).unwrap();
    store
        .apply(&parsed, file.prune)
        .expect("the tenants store applies it");
    let mut names: Vec<String> = store.list().unwrap().into_iter().map(|t| t.name).collect();
    names.sort();
    let mut want: Vec<String> = parsed.names().map(str::to_string).collect();
    want.sort();
    assert_eq!(names, want);

    // The quota store is the Redis Service of redis.yaml.
    let quota = cfg
        .quota_store
        .as_ref()
        .expect("the pods share quotas in Redis");
    let svc = one(&all, "Service", "superinfer-redis");
    let port = int(&svc["spec"]["ports"][0]["port"], "redis port");
    assert_eq!(quota.url, format!("redis://superinfer-redis:{port}"));
    let redis = one(&all, "Deployment", "superinfer-redis");
    let rc = &redis["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        rc["ports"][0]["name"].as_str(),
        svc["spec"]["ports"][0]["targetPort"].as_str()
    );
    for (k, v) in svc["spec"]["selector"].as_hash().unwrap() {
        assert_eq!(
            redis["spec"]["template"]["metadata"]["labels"]
                .as_hash()
                .unwrap()
                .get(k),
            Some(v),
            "the Redis Service selects the Redis pod"
        );
    }
}

/// The metric names in a PromQL expression: our namespaces only (`superinfer_`, `vllm:`);
/// recording rules (`tenant_slo:…`) are not metrics the server exports.
fn promql_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut in_quotes = false;
    let mut word = String::new();
    for ch in expr.chars().chain([' ']) {
        if ch == '"' {
            in_quotes = !in_quotes;
        }
        if !in_quotes && (ch.is_ascii_alphanumeric() || ch == '_' || ch == ':') {
            word.push(ch);
            continue;
        }
        if word.starts_with("superinfer_") || word.starts_with("vllm:") {
            names.push(std::mem::take(&mut word));
        }
        word.clear();
    }
    names
}

fn dashboard_queries() -> Vec<String> {
    let dash: Value = serde_json::from_str(&read("grafana/superinfer.json")).expect("JSON");
    let mut q = Vec::new();
    for p in dash["panels"].as_array().expect("panels") {
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{}", p["title"]);
        q.extend(
            targets
                .iter()
                .map(|t| t["expr"].as_str().unwrap().to_string()),
        );
    }
    for v in dash["templating"]["list"].as_array().unwrap() {
        if let Some(def) = v["definition"].as_str() {
            q.push(def.to_string());
        }
    }
    q
}

/// The alert file's expressions, each with what it reads besides our metrics: the names of
/// the file's own recording rules (each must be recorded there).
fn alert_queries() -> Vec<String> {
    let docs = YamlLoader::load_from_str(&read("prometheus/alerts.yml")).expect("YAML");
    let mut q = Vec::new();
    let mut recorded = BTreeSet::new();
    let rules: Vec<&Yaml> = docs[0]["groups"]
        .as_vec()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_vec().expect("rules"))
        .collect();
    for r in &rules {
        if let Some(name) = r["record"].as_str() {
            recorded.insert(name.to_string());
        }
    }
    for r in rules {
        assert!(r["alert"].as_str().is_some() || r["record"].as_str().is_some());
        let expr = r["expr"].as_str().expect("expr");
        let uses_rules: Vec<&str> = expr
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .filter(|w| w.starts_with("tenant_slo:"))
            .collect();
        for w in &uses_rules {
            assert!(recorded.contains(*w), "alerts use {w}, recorded nowhere");
        }
        if uses_rules.is_empty() {
            q.push(expr.to_string());
        }
    }
    q
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_and_alerts_use_is_exported() {
    // With a quota store, for its series: one that refuses connections (port 1), so the
    // server fails open and answers from its own limiters.
    let s = TestServer::start_with(TestOptions {
        settings: Settings {
            quota_store: Some("redis://127.0.0.1:1".into()),
            ..Settings::default()
        },
        ..TestOptions::default()
    })
    .await;
    let (status, _) = s.complete(&s.key, 8).await;
    assert_eq!(status, StatusCode::OK);
    let bad = s
        .post(
            "/v1/completions",
            &s.key,
            &json!({"model": s.model(), "prompt": 1}),
        )
        .await;
    assert_eq!(
        bad.status(),
        StatusCode::BAD_REQUEST,
        "a refusal, for the rejected series"
    );
    let exported = metric_names(&s.scrape().await);
    let mut used = BTreeSet::new();
    for (source, queries) in [
        ("dashboard", dashboard_queries()),
        ("alerts", alert_queries()),
    ] {
        for q in queries {
            let names = promql_names(&q);
            assert!(
                !names.is_empty(),
                "{source}: `{q}` reads none of our metrics"
            );
            for n in names {
                assert!(
                    exported.contains(&n),
                    "{source} uses {n}, which /metrics does not export:\n{exported:?}"
                );
                used.insert(n);
            }
        }
    }
    for needed in [
        "superinfer_slo_met_total",
        "superinfer_time_to_first_token_seconds_bucket",
        "superinfer_inter_token_latency_seconds_bucket",
        "superinfer_requests_rejected_total",
        "superinfer_kv_usage_ratio",
        "superinfer_rotations_total",
        "superinfer_quota_store_up",
    ] {
        assert!(used.contains(needed), "the dashboard shows {needed}");
    }
    s.shutdown().await;
}

#[test]
fn promql_names_skip_labels_functions_and_recording_rules() {
    let q = r#"1 - sum by (tenant) (rate(superinfer_slo_met_total{slo="superinfer_x"}[5m])) / tenant_slo:superinfer_slo_miss_ratio:rate5m + vllm:num_requests_running"#;
    assert_eq!(
        promql_names(q),
        ["superinfer_slo_met_total", "vllm:num_requests_running"]
    );
}

/// The Dockerfiles (not built in CI: no Docker daemon here): multi-stage, the final stage runs
/// as a non-root user, and they build as the README (CPU) and scripts/gpu (CUDA) do.
#[test]
fn the_dockerfiles_build_as_the_readme_and_scripts_do_and_run_as_non_root() {
    let readme = std::fs::read_to_string(deploy().join("../README.md")).expect("README.md");
    assert!(readme.contains("-p superinfer-gateway --bin superinfer"));
    let slo = std::fs::read_to_string(deploy().join("../scripts/gpu/slo.sh")).expect("slo.sh");
    assert!(slo.contains("--target-dir target-cuda"));
    let cases: [(&str, &[&str]); 2] = [
        (
            "Dockerfile",
            &["cargo build --release -p superinfer-gateway --bin superinfer"],
        ),
        (
            "Dockerfile.cuda",
            &[
                "cargo build --release -p superinfer-gateway",
                "--features cuda",
                "--target-dir target-cuda",
            ],
        ),
    ];
    for (file, must) in cases {
        let text = read(file);
        let lines: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect();
        assert!(
            lines.iter().filter(|l| l.starts_with("FROM ")).count() >= 2,
            "{file}: not multi-stage"
        );
        let joined = lines.join(" ").replace("\\ ", " ");
        for m in must {
            assert!(joined.contains(m), "{file}: no `{m}`");
        }
        let last = lines.iter().rposition(|l| l.starts_with("FROM ")).unwrap();
        let user = lines[last..]
            .iter()
            .rev()
            .find_map(|l| l.strip_prefix("USER "))
            .unwrap_or_else(|| panic!("{file}: the final stage sets no USER"));
        let uid = user.split(':').next().unwrap_or_default();
        assert!(uid != "0" && uid != "root", "{file}: runs as {user}");
        assert!(
            lines[last..].iter().any(|l| l.starts_with("ENTRYPOINT")),
            "{file}: no ENTRYPOINT in the final stage"
        );
    }
}

/// The shipped alert rules, tested by Prometheus's own `promtool` on series where a tenant is
/// starved (`deploy/prometheus/alerts_test.yml`). `scripts/test` installs it (Debian's
/// `prometheus` package); a test that passed without running it would hide broken rules.
#[test]
fn the_burn_rate_alerts_fire_for_a_starved_tenant() {
    let rules = deploy().join("prometheus/alerts_test.yml");
    let out = std::process::Command::new("promtool")
        .args(["test", "rules"])
        .arg(&rules)
        .output()
        .expect("promtool is needed for this test (Debian: apt-get install prometheus; scripts/test installs it)");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
