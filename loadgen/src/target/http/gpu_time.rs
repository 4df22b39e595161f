//! The server's GPU time per tenant, read from its Prometheus text (`GET /metrics`): the sum
//! of superinfer's `superinfer_request_gpu_seconds` histogram by its `tenant` label, each
//! sequence's share of the steps it ran in. Read before and after a run, the difference is the
//! run's. A server without the series (vLLM, …) reports none, and the report says so.

use std::collections::HashMap;

/// The histogram's running sum, one sample per tenant.
pub const SERIES: &str = "superinfer_request_gpu_seconds_sum";

/// Seconds by tenant name in a Prometheus text exposition; `None` when the series is absent.
pub fn parse(text: &str) -> Option<HashMap<String, f64>> {
    let mut out = HashMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(SERIES).and_then(|r| r.strip_prefix('{')) else {
            continue;
        };
        let Some((tenant, value)) = tenant_and_value(rest) else {
            continue;
        };
        *out.entry(tenant).or_insert(0.0) += value;
    }
    (!out.is_empty()).then_some(out)
}

/// The GPU time each of `tenants` (by name) had between two readings; `None` unless the
/// later one has the series.
pub fn between(
    before: Option<&HashMap<String, f64>>,
    after: Option<&HashMap<String, f64>>,
    tenants: impl Iterator<Item = impl AsRef<str>>,
) -> Option<Vec<f64>> {
    let after = after?;
    let at = |m: Option<&HashMap<String, f64>>, t: &str| {
        m.and_then(|m| m.get(t)).copied().unwrap_or(0.0)
    };
    Some(
        tenants
            .map(|t| (at(Some(after), t.as_ref()) - at(before, t.as_ref())).max(0.0))
            .collect(),
    )
}

/// From `name="v",…} 1.5` (the text after the series' `{`): the `tenant` label's value
/// (escapes `\\`, `\"`, `\n` undone) and the sample.
fn tenant_and_value(s: &str) -> Option<(String, f64)> {
    let mut rest = s;
    let mut tenant = None;
    loop {
        rest = rest.trim_start_matches([',', ' ']);
        if let Some(after) = rest.strip_prefix('}') {
            let value = after.split_whitespace().next()?.parse().ok()?;
            return Some((tenant?, value));
        }
        let (name, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        if name.trim() == "tenant" {
            tenant = Some(value);
        }
        rest = &after[end + 1..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# TYPE superinfer_request_gpu_seconds histogram\n\
superinfer_request_gpu_seconds_bucket{tenant=\"gold\",le=\"0.1\"} 3\n\
superinfer_request_gpu_seconds_sum{tenant=\"gold\"} 1.25\n\
superinfer_request_gpu_seconds_count{tenant=\"gold\"} 4\n\
superinfer_request_gpu_seconds_sum{le=\"x\",tenant=\"a \\\"quoted\\\" one\"} 0.5\n\
superinfer_request_gpu_seconds_sum{tenant=\"bad\"} nope\n\
superinfer_requests_total{tenant=\"gold\"} 9\n";

    #[test]
    fn reads_each_tenants_sum_and_nothing_else() {
        let m = parse(TEXT).unwrap();
        assert_eq!(m.len(), 2, "{m:?}");
        assert_eq!(m["gold"], 1.25);
        assert_eq!(m["a \"quoted\" one"], 0.5);
        assert_eq!(parse("vllm:num_requests_running 3\n"), None);
    }

    #[test]
    fn a_run_is_the_difference_of_two_readings() {
        let before = parse("superinfer_request_gpu_seconds_sum{tenant=\"gold\"} 1\n");
        let after = parse(TEXT);
        let names = ["gold", "bronze"];
        assert_eq!(
            between(before.as_ref(), after.as_ref(), names.iter()),
            Some(vec![0.25, 0.0])
        );
        assert_eq!(
            between(None, after.as_ref(), names.iter()),
            Some(vec![1.25, 0.0])
        );
        assert_eq!(between(before.as_ref(), None, names.iter()), None);
    }
}
