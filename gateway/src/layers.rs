//! The HTTP layer's own checks and answers, as tower/axum middleware (wired in order by
//! [`crate::server::router`]):
//! - [`sanitize_request_id`]: a client's `x-request-id` is kept only when it is at most
//!   [`MAX_REQUEST_ID_CHARS`] characters of `A-Z a-z 0-9 . _ : -`; otherwise it is replaced by
//!   a new one (it is echoed back and logged, so it must be short and harmless);
//! - [`header_limits`]: more than `max_headers` header fields → 431; more than one
//!   `Authorization` header → 400 (which one would count is ambiguous);
//! - [`openai_errors`]: every error answer that is not JSON already (axum's rejections such as
//!   a path that cannot be percent-decoded, tower-http's 413 for a `Content-Length` over the
//!   limit) becomes OpenAI's error shape with the same status and headers.

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::GatewayError;
use crate::state::Shared;

/// Longest client request id kept.
pub const MAX_REQUEST_ID_CHARS: usize = 64;

/// Whether a client's request id is kept as it is.
pub fn valid_request_id(v: &HeaderValue) -> bool {
    let b = v.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_REQUEST_ID_CHARS
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b':' | b'-'))
}

/// Drops a client's `x-request-id` that is too long, has other characters, or comes twice, so
/// the next layer sets a fresh one.
pub async fn sanitize_request_id(mut req: Request) -> Request {
    let h = req.headers();
    let ids: Vec<_> = h.get_all("x-request-id").iter().collect();
    let keep = ids.len() == 1 && valid_request_id(ids[0]);
    if !ids.is_empty() && !keep {
        req.headers_mut().remove("x-request-id");
    }
    req
}

pub async fn header_limits(State(state): State<Shared>, req: Request, next: Next) -> Response {
    let limit = state.max_headers;
    if let Err(e) = check_headers(req.headers(), limit) {
        return e.into_response();
    }
    next.run(req).await
}

/// The header checks, on their own (also used by the fuzz test of the parser).
pub fn check_headers(h: &HeaderMap, limit: usize) -> Result<(), GatewayError> {
    let count = h.len();
    if count > limit {
        return Err(GatewayError::TooManyHeaders { count, limit });
    }
    let auth = h.get_all(header::AUTHORIZATION).iter().count();
    if auth > 1 {
        return Err(GatewayError::DuplicateHeader {
            name: "Authorization",
            count: auth,
        });
    }
    Ok(())
}

/// Error answers made by layers below the handlers, in OpenAI's shape.
pub async fn openai_errors(State(state): State<Shared>, resp: Response) -> Response {
    let status = resp.status();
    if !(status.is_client_error() || status.is_server_error()) || is_json(resp.headers()) {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let err = match status {
        StatusCode::PAYLOAD_TOO_LARGE => GatewayError::BodyTooLarge {
            limit: state.max_body_bytes,
        },
        StatusCode::REQUEST_TIMEOUT => GatewayError::BodyTimeout {
            seconds: state.body_timeout_s,
        },
        _ => {
            let text = axum::body::to_bytes(body, 4096)
                .await
                .map(|b| String::from_utf8_lossy(&b).trim().to_string())
                .unwrap_or_default();
            let message = if text.is_empty() {
                status.canonical_reason().unwrap_or("error").to_string()
            } else {
                text
            };
            GatewayError::Protocol { status, message }
        }
    };
    let mut out = err.into_response();
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            out.headers_mut().insert(name.clone(), value.clone());
        }
    }
    out
}

fn is_json(h: &HeaderMap) -> bool {
    h.get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;

    #[test]
    fn request_ids_are_bounded_and_plain() {
        let ok = |s: &str| valid_request_id(&HeaderValue::from_str(s).unwrap());
        assert!(ok("req-1234_abc.def:9"));
        assert!(ok(&"a".repeat(MAX_REQUEST_ID_CHARS)));
        assert!(!ok(&"a".repeat(MAX_REQUEST_ID_CHARS + 1)));
        assert!(!ok("a b"));
        assert!(!ok("<script>"));
        assert!(!ok(""));
        let mut req = Request::new(Body::empty());
        req.headers_mut()
            .append("x-request-id", HeaderValue::from_static("a"));
        req.headers_mut()
            .append("x-request-id", HeaderValue::from_static("b"));
        assert!(
            futures_util::FutureExt::now_or_never(sanitize_request_id(req))
                .unwrap()
                .headers()
                .get("x-request-id")
                .is_none()
        );
    }

    #[test]
    fn two_authorization_headers_or_too_many_fields_are_refused() {
        let mut h = HeaderMap::new();
        h.append(header::AUTHORIZATION, HeaderValue::from_static("Bearer a"));
        assert!(check_headers(&h, 4).is_ok());
        h.append(header::AUTHORIZATION, HeaderValue::from_static("Bearer b"));
        let e = check_headers(&h, 4).unwrap_err();
        assert_eq!(e.status(), 400);
        assert!(e.to_string().contains("2 `Authorization` headers"), "{e}");
        for i in 0..5 {
            h.insert(
                header::HeaderName::from_bytes(format!("x-{i}").as_bytes()).unwrap(),
                HeaderValue::from_static("v"),
            );
        }
        assert_eq!(check_headers(&h, 4).unwrap_err().status(), 431);
    }
}
