//! The gateway's one error enum, and the one place where errors become HTTP: a status, a
//! `Retry-After` where waiting helps, and OpenAI's error body
//! `{"error": {"message", "type", "param", "code"}}`.

use axum::extract::rejection::BytesRejection;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use superinfer_tenants::TenantError;

mod refusals;

/// Everything a request can fail with. Every message says what to change.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The body or a field of it is wrong; `param` names the field as the client spelled it.
    #[error("{message}")]
    InvalidRequest {
        message: String,
        param: Option<String>,
    },
    #[error("the request body is larger than {limit} bytes; send a shorter prompt")]
    BodyTooLarge { limit: usize },
    #[error("the model `{requested}` does not exist; this server serves `{served}` (see GET /v1/models)")]
    ModelNotFound { requested: String, served: String },
    #[error("no API key: send `Authorization: Bearer <your key>`")]
    MissingKey,
    #[error("invalid API key: check the key, or ask an administrator for a new one")]
    InvalidKey,
    #[error("tenant `{name}` is disabled; ask an administrator to enable it")]
    TenantDisabled { name: String },
    /// Over a quota; retrying after `retry_after_s` seconds will succeed if the load eases.
    #[error("{message}")]
    RateLimited { message: String, retry_after_s: u64 },
    /// The engine cannot take more work now.
    #[error("{message}")]
    Overloaded { message: String, retry_after_s: u64 },
    #[error("the server is shutting down; retry on another replica")]
    ShuttingDown,
    #[error(
        "too many connections {} (limit {limit}); close idle connections or retry after the \
         Retry-After seconds",
        if *per_address { "from this address" } else { "to this server" }
    )]
    TooManyConnections { limit: usize, per_address: bool },
    #[error("the request body did not arrive within {seconds} s; send it without pauses")]
    BodyTimeout { seconds: u64 },
    #[error("the request has {count} header fields; at most {limit} are allowed")]
    TooManyHeaders { count: usize, limit: usize },
    #[error("the request has {count} `{name}` headers; send exactly one")]
    DuplicateHeader { name: &'static str, count: usize },
    /// An error answered by a layer below the handlers (a path that cannot be decoded, a
    /// method the route lacks, …), in OpenAI's shape: its status and its text.
    #[error("{message}")]
    Protocol { status: StatusCode, message: String },
    #[error("no route for {method} {path}; see docs/API.md for the endpoints")]
    NotFound { method: String, path: String },
    #[error("{method} is not allowed on {path}")]
    MethodNotAllowed { method: String, path: String },
    #[error(
        "the admin API is disabled; start the server with --admin-token or SUPERINFER_ADMIN_TOKEN"
    )]
    AdminDisabled,
    #[error("invalid admin token: send `Authorization: Bearer <admin token>`")]
    AdminUnauthorized,
    /// `{0}` says how the tenant was named: "with id 7", "named `acme`".
    #[error("no tenant {0}")]
    TenantNotFound(String),
    /// A tenant-store operation failed (admin API).
    #[error(transparent)]
    Tenant(#[from] TenantError),
    /// The engine failed while serving a request.
    #[error("the engine failed: {0}")]
    Engine(String),
    /// The engine thread failed (a panic): nothing is served until the process restarts.
    #[error(
        "{0}; this server is restarting, retry on another replica or after the Retry-After seconds"
    )]
    EngineFailed(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl GatewayError {
    /// A 400 about field `param`.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        GatewayError::InvalidRequest {
            message: message.into(),
            param: Some(param.into()),
        }
    }

    /// A 400 about the request as a whole.
    pub fn bad_request(message: impl Into<String>) -> Self {
        GatewayError::InvalidRequest {
            message: message.into(),
            param: None,
        }
    }

    /// A request body that could not be read: over the limit of `max_body_bytes` (413), not
    /// arrived within `body_timeout_s` seconds (408), or cut off (400).
    pub fn from_body(e: &BytesRejection, max_body_bytes: usize, body_timeout_s: u64) -> Self {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            return GatewayError::BodyTooLarge {
                limit: max_body_bytes,
            };
        }
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
        while let Some(s) = source {
            if s.is::<tower_http::timeout::TimeoutError>() {
                return GatewayError::BodyTimeout {
                    seconds: body_timeout_s,
                };
            }
            source = s.source();
        }
        GatewayError::bad_request(format!("cannot read the request body: {}", e.body_text()))
    }

    pub fn status(&self) -> StatusCode {
        use GatewayError as E;
        match self {
            E::InvalidRequest { .. } => StatusCode::BAD_REQUEST,
            E::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            E::ModelNotFound { .. } | E::NotFound { .. } | E::TenantNotFound(_) => {
                StatusCode::NOT_FOUND
            }
            E::MissingKey | E::InvalidKey | E::AdminUnauthorized => StatusCode::UNAUTHORIZED,
            E::TenantDisabled { .. } | E::AdminDisabled => StatusCode::FORBIDDEN,
            E::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            E::Overloaded { .. } | E::ShuttingDown | E::EngineFailed(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            E::TooManyConnections { per_address, .. } => {
                if *per_address {
                    StatusCode::TOO_MANY_REQUESTS
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                }
            }
            E::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            E::TooManyHeaders { .. } => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            E::DuplicateHeader { .. } => StatusCode::BAD_REQUEST,
            E::Protocol { status, .. } => *status,
            E::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            E::Tenant(e) => match e {
                TenantError::Invalid { .. } => StatusCode::BAD_REQUEST,
                TenantError::NameTaken(_) => StatusCode::CONFLICT,
                TenantError::NotFound(_) => StatusCode::NOT_FOUND,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            },
            E::Engine(_) | E::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// OpenAI's `type` and `code` fields.
    fn kind(&self) -> (&'static str, Option<&'static str>) {
        use GatewayError as E;
        match self {
            E::InvalidRequest { .. } | E::BodyTooLarge { .. } => ("invalid_request_error", None),
            E::ModelNotFound { .. } => ("invalid_request_error", Some("model_not_found")),
            E::NotFound { .. } | E::MethodNotAllowed { .. } => ("invalid_request_error", None),
            E::MissingKey | E::InvalidKey => ("authentication_error", Some("invalid_api_key")),
            E::AdminUnauthorized => ("authentication_error", Some("invalid_admin_token")),
            E::TenantDisabled { .. } => ("permission_error", Some("tenant_disabled")),
            E::AdminDisabled => ("permission_error", Some("admin_disabled")),
            E::RateLimited { .. } => ("rate_limit_error", Some("rate_limit_exceeded")),
            E::Overloaded { .. } => ("overloaded_error", Some("overloaded")),
            E::ShuttingDown => ("overloaded_error", Some("shutting_down")),
            E::EngineFailed(_) => ("server_error", Some("engine_failed")),
            E::TooManyConnections {
                per_address: true, ..
            } => ("rate_limit_error", Some("too_many_connections")),
            E::TooManyConnections { .. } => ("overloaded_error", Some("too_many_connections")),
            E::BodyTimeout { .. } => ("invalid_request_error", Some("body_timeout")),
            E::TooManyHeaders { .. } | E::DuplicateHeader { .. } => ("invalid_request_error", None),
            E::Protocol { status, .. } if status.is_server_error() => ("server_error", None),
            E::Protocol { .. } => ("invalid_request_error", None),
            E::TenantNotFound(_) => ("invalid_request_error", Some("tenant_not_found")),
            E::Tenant(TenantError::Invalid { .. }) => ("invalid_request_error", None),
            E::Tenant(TenantError::NameTaken(_)) => ("invalid_request_error", Some("name_taken")),
            E::Tenant(TenantError::NotFound(_)) => {
                ("invalid_request_error", Some("tenant_not_found"))
            }
            E::Tenant(_) | E::Engine(_) | E::Internal(_) => ("server_error", None),
        }
    }

    fn param(&self) -> Option<String> {
        match self {
            GatewayError::InvalidRequest { param, .. } => param.clone(),
            GatewayError::Tenant(TenantError::Invalid { field, .. }) => Some(field.to_string()),
            GatewayError::ModelNotFound { .. } => Some("model".into()),
            _ => None,
        }
    }

    fn retry_after_s(&self) -> Option<u64> {
        match self {
            GatewayError::RateLimited { retry_after_s, .. }
            | GatewayError::Overloaded { retry_after_s, .. } => Some((*retry_after_s).max(1)),
            GatewayError::ShuttingDown
            | GatewayError::TooManyConnections { .. }
            | GatewayError::EngineFailed(_) => Some(1),
            _ => None,
        }
    }

    /// The OpenAI error body, also sent as the last event of a stream that fails.
    pub fn body(&self) -> ErrorBody {
        let (kind, code) = self.kind();
        ErrorBody {
            error: ErrorDetail {
                message: self.to_string(),
                kind,
                param: self.param(),
                code,
            },
        }
    }
}

/// `{"error": {...}}` as OpenAI sends it.
#[derive(Debug, Serialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize)]
pub struct ErrorDetail {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() && self.retry_after_s().is_none() {
            tracing::error!(error = %self, "request failed");
        } else {
            refusals::log(status.as_u16(), &self.to_string());
        }
        let body = serde_json::to_vec(&self.body()).unwrap_or_default();
        let mut resp = (status, body).into_response();
        let headers = resp.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(s) = self.retry_after_s() {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        resp
    }
}

/// Shorthand for handlers.
pub type Result<T, E = GatewayError> = std::result::Result<T, E>;
