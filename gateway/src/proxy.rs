//! Headers only a trusted proxy may set: the Gateway API Inference Extension's
//! `x-gateway-inference-objective` (the name of an InferenceObjective) and
//! `x-gateway-inference-fairness-id`. The TCP peer of the connection decides ([`PeerAddr`],
//! put in every request's extensions by `conn.rs`): only a peer inside a `--trusted-proxy`
//! network may send them. From any other peer either header is a 400 naming it (a client
//! cannot raise its own priority, and a header the server would drop silently is a field
//! accepted and ignored; docs/OPERATIONS.md, "Behind the Gateway API Inference Extension").
//!
//! What they do when trusted: an objective configured with `--objective NAME=TTFT_MS:TBT_MS`
//! tightens the tenant's SLO for that request (never loosens it: each part is the smaller of
//! the tenant's and the objective's), which the scheduler sees as an earlier deadline; an
//! objective not configured is a 400. The fairness id must be the tenant's name, because the
//! tenant of the API key is the scheduler's only fairness unit: another value would ask for
//! fairness the engine does not have, so it is a 400, not ignored.
//!
//! Either header more than once is a 400 (`DuplicateHeader`) from any peer, before anything
//! else: which copy counts would be a guess ([`at_most_once`]).

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

use crate::error::GatewayError;
use crate::metrics::Metrics;
use crate::registry::TenantCtx;

pub const OBJECTIVE_HEADER: &str = "x-gateway-inference-objective";
pub const FAIRNESS_HEADER: &str = "x-gateway-inference-fairness-id";

/// The TCP peer of the connection a request came on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// A trusted proxy: one address (`10.0.0.7`) or a network (`10.0.0.0/8`, `fd00::/8`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct TrustedNet {
    base: IpAddr,
    prefix: u8,
}

impl TrustedNet {
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.base, ip) {
            (IpAddr::V4(b), IpAddr::V4(a)) => {
                masked(u32::from(b).into(), 32, self.prefix)
                    == masked(u32::from(a).into(), 32, self.prefix)
            }
            (IpAddr::V6(b), IpAddr::V6(a)) => {
                masked(u128::from(b), 128, self.prefix) == masked(u128::from(a), 128, self.prefix)
            }
            _ => false,
        }
    }
}

/// The top `prefix` bits of a `bits`-bit address.
fn masked(addr: u128, bits: u8, prefix: u8) -> u128 {
    if prefix == 0 {
        return 0;
    }
    let shift = u32::from(bits - prefix);
    (addr >> shift) << shift
}

impl FromStr for TrustedNet {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let base: IpAddr = addr
            .trim()
            .parse()
            .map_err(|_| format!("trusted proxy `{s}`: not an IP address or CIDR network"))?;
        let bits = if base.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => bits,
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= bits)
                .ok_or_else(|| format!("trusted proxy `{s}`: the prefix must be 0..={bits}"))?,
        };
        Ok(TrustedNet { base, prefix })
    }
}

impl TryFrom<String> for TrustedNet {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

/// `NAME=TTFT_MS:TBT_MS`: the SLO an InferenceObjective named NAME asks for.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct ObjectiveSpec {
    pub name: String,
    pub ttft_ms: u32,
    pub tbt_ms: u32,
}

impl FromStr for ObjectiveSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("objective `{s}`: expected NAME=TTFT_MS:TBT_MS, e.g. critical=500:50");
        let (name, slo) = s.split_once('=').ok_or_else(bad)?;
        let (ttft, tbt) = slo.split_once(':').ok_or_else(bad)?;
        let ms = |v: &str| v.trim().parse::<u32>().ok().filter(|m| *m > 0);
        let name = name.trim();
        if name.is_empty() {
            return Err(bad());
        }
        Ok(ObjectiveSpec {
            name: name.to_string(),
            ttft_ms: ms(ttft).ok_or_else(bad)?,
            tbt_ms: ms(tbt).ok_or_else(bad)?,
        })
    }
}

impl TryFrom<String> for ObjectiveSpec {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

/// Who may send the inference-extension headers, and what the objectives mean.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProxyConfig {
    pub trusted: Vec<TrustedNet>,
    pub objectives: BTreeMap<String, ObjectiveSpec>,
}

impl ProxyConfig {
    pub fn new(trusted: Vec<TrustedNet>, objectives: Vec<ObjectiveSpec>) -> anyhow::Result<Self> {
        let mut map = BTreeMap::new();
        for o in objectives {
            if let Some(old) = map.insert(o.name.clone(), o) {
                anyhow::bail!("objective `{}` is configured twice", old.name);
            }
        }
        Ok(ProxyConfig {
            trusted,
            objectives: map,
        })
    }

    fn trusts(&self, peer: Option<PeerAddr>) -> bool {
        peer.is_some_and(|PeerAddr(p)| self.trusted.iter().any(|n| n.contains(p.ip())))
    }
}

/// The proxy layer's own state: the trusted networks and objectives, and the metrics that
/// count refusals.
#[derive(Clone)]
pub struct ProxyState {
    pub config: Arc<ProxyConfig>,
    pub metrics: Metrics,
}

/// The layer (after auth, before quota on the generation routes): refuses the headers from
/// an untrusted peer, and applies them from a trusted one.
pub async fn layer(State(state): State<ProxyState>, mut req: Request, next: Next) -> Response {
    let h = req.headers();
    let (objective, fairness) = (
        at_most_once(h, OBJECTIVE_HEADER),
        at_most_once(h, FAIRNESS_HEADER),
    );
    if matches!((&objective, &fairness), (Ok(None), Ok(None))) {
        return next.run(req).await;
    }
    let Some(ctx) = req.extensions().get::<Arc<TenantCtx>>().cloned() else {
        return GatewayError::Internal("the proxy layer runs after auth".into()).into_response();
    };
    let peer = req.extensions().get::<PeerAddr>().copied();
    let refuse = |reason: &'static str, e: GatewayError| {
        state.metrics.rejected(&ctx.tenant.name, reason);
        e.into_response()
    };
    let (objective, fairness) = match (objective, fairness) {
        (Ok(o), Ok(f)) => (o, f),
        (Err(e), _) | (_, Err(e)) => return refuse("duplicate_header", e),
    };
    let objective = objective.map(|v| v.to_str().map(str::trim));
    let fairness = fairness.map(|v| v.to_str().map(str::trim));
    if !state.config.trusts(peer) {
        let name = if objective.is_some() {
            OBJECTIVE_HEADER
        } else {
            FAIRNESS_HEADER
        };
        let from = peer.map_or("an unknown peer".to_string(), |p| p.0.ip().to_string());
        return refuse(
            "untrusted_header",
            GatewayError::invalid(
                name,
                format!(
                    "the header `{name}` may be set only by a trusted proxy (--trusted-proxy); \
                     {from} is not one. Remove the header, or send the request through the \
                     inference gateway"
                ),
            ),
        );
    }
    if let Some(f) = fairness {
        let ok = f.is_ok_and(|f| f == ctx.tenant.name);
        if !ok {
            return refuse(
                "fairness_id",
                GatewayError::invalid(
                    FAIRNESS_HEADER,
                    format!(
                        "`{FAIRNESS_HEADER}` must be the tenant's name (`{}`): fairness is \
                         per tenant of the API key, and there is no fairness inside a tenant",
                        ctx.tenant.name
                    ),
                ),
            );
        }
    }
    if let Some(o) = objective {
        let spec = o.ok().and_then(|o| state.config.objectives.get(o));
        let Some(spec) = spec else {
            let known: Vec<&str> = state.config.objectives.keys().map(String::as_str).collect();
            return refuse(
                "objective",
                GatewayError::invalid(
                    OBJECTIVE_HEADER,
                    format!(
                        "unknown inference objective in `{OBJECTIVE_HEADER}`; configured \
                         (--objective): [{}]",
                        known.join(", ")
                    ),
                ),
            );
        };
        let mut tenant = ctx.tenant.clone();
        tenant.slo.ttft_ms = tenant.slo.ttft_ms.min(spec.ttft_ms);
        tenant.slo.tbt_ms = tenant.slo.tbt_ms.min(spec.tbt_ms);
        let tightened = Arc::new(TenantCtx {
            tenant,
            limits: ctx.limits.clone(),
            stats: ctx.stats.clone(),
            metrics: ctx.metrics.clone(),
        });
        req.extensions_mut().insert(tightened);
    }
    next.run(req).await
}

/// The one value of header `name`, if present. A second copy is refused, not resolved: the
/// header raises a request's priority or names its fairness unit, so two copies are a proxy's
/// bug or a client's attempt to slip its own value past the proxy, and either choice would be
/// a guess.
fn at_most_once<'a>(
    h: &'a HeaderMap,
    name: &'static str,
) -> Result<Option<&'a HeaderValue>, GatewayError> {
    let mut values = h.get_all(name).iter();
    let first = values.next();
    match values.count() {
        0 => Ok(first),
        more => Err(GatewayError::DuplicateHeader {
            name,
            count: more + 1,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_contain_their_addresses_only() {
        let n: TrustedNet = "10.1.0.0/16".parse().unwrap();
        assert!(n.contains("10.1.200.3".parse().unwrap()));
        assert!(!n.contains("10.2.0.1".parse().unwrap()));
        assert!(
            n.contains("::ffff:10.1.0.9".parse().unwrap()),
            "v4-mapped v6"
        );
        let one: TrustedNet = "127.0.0.1".parse().unwrap();
        assert!(one.contains("127.0.0.1".parse().unwrap()));
        assert!(!one.contains("127.0.0.2".parse().unwrap()));
        let all: TrustedNet = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("192.0.2.1".parse().unwrap()));
        let v6: TrustedNet = "fd00::/8".parse().unwrap();
        assert!(v6.contains("fd12::1".parse().unwrap()));
        assert!(!v6.contains("10.0.0.1".parse().unwrap()));
        assert!("10.0.0.0/33".parse::<TrustedNet>().is_err());
        assert!("example.com".parse::<TrustedNet>().is_err());
    }

    #[test]
    fn objectives_parse_and_refuse_bad_specs() {
        let o: ObjectiveSpec = "critical=500:50".parse().unwrap();
        assert_eq!(
            (o.name.as_str(), o.ttft_ms, o.tbt_ms),
            ("critical", 500, 50)
        );
        for bad in ["critical", "=1:2", "x=0:5", "x=5", "x=a:b"] {
            assert!(bad.parse::<ObjectiveSpec>().is_err(), "{bad}");
        }
        let twice = vec![o.clone(), o];
        assert!(ProxyConfig::new(vec![], twice).is_err());
    }

    #[test]
    fn a_repeated_extension_header_is_refused_not_resolved() {
        for name in [OBJECTIVE_HEADER, FAIRNESS_HEADER] {
            let mut h = HeaderMap::new();
            assert_eq!(at_most_once(&h, name).unwrap(), None);
            h.append(name, HeaderValue::from_static("critical"));
            assert_eq!(
                at_most_once(&h, name).unwrap(),
                Some(&HeaderValue::from_static("critical"))
            );
            // The same value twice is refused too: the count, not the values, is the fault.
            for second in ["sheddable", "critical"] {
                let mut twice = h.clone();
                twice.append(name, HeaderValue::from_static(second));
                let e = at_most_once(&twice, name).unwrap_err();
                assert!(
                    matches!(e, GatewayError::DuplicateHeader { name: n, count: 2 } if n == name),
                    "{e:?}"
                );
                assert_eq!(e.status(), 400);
                assert!(
                    e.to_string().contains(&format!("2 `{name}` headers")),
                    "{e}"
                );
            }
        }
    }
}
