//! The HTTP edge's limits and timeouts (docs/OPERATIONS.md, "Limits and timeouts"), resolved
//! from the settings with their defaults.

use anyhow::bail;
use std::time::Duration;

use super::settings::Settings;
use crate::text::TextPoolConfig;

/// Connection limits, timeouts and the text pool's size.
#[derive(Clone, Debug, PartialEq)]
pub struct EdgeConfig {
    /// Request headers must be complete this long after the connection opened or its previous
    /// response ended (hyper's `header_read_timeout`).
    pub header_timeout: Duration,
    /// A request body must have arrived this long after its headers (408 otherwise).
    pub body_timeout: Duration,
    pub max_connections: usize,
    pub max_connections_per_ip: usize,
    pub max_headers: usize,
    /// Events of one stream buffered while its client does not read.
    pub stream_buffer: usize,
    /// A stream whose buffer stayed full this long is aborted (a client that stopped reading).
    pub stream_stall_timeout: Duration,
    pub text_pool: TextPoolConfig,
}

/// How much of a stream may wait for a client that does not read, and for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamLimits {
    /// Events buffered in the gateway (beyond what the socket and hyper hold).
    pub buffer: usize,
    /// With the buffer full this long, the stream is aborted and its connection closed.
    pub stall_timeout: Duration,
}

pub const DEFAULT_HEADER_TIMEOUT_S: f64 = 10.0;
pub const DEFAULT_BODY_TIMEOUT_S: f64 = 60.0;
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
pub const DEFAULT_MAX_CONNECTIONS_PER_IP: usize = 256;
pub const DEFAULT_MAX_HEADERS: usize = 64;
pub const DEFAULT_STREAM_BUFFER: usize = 64;
pub const DEFAULT_STREAM_STALL_TIMEOUT_S: f64 = 30.0;

impl Default for EdgeConfig {
    fn default() -> Self {
        EdgeConfig {
            header_timeout: Duration::from_secs_f64(DEFAULT_HEADER_TIMEOUT_S),
            body_timeout: Duration::from_secs_f64(DEFAULT_BODY_TIMEOUT_S),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_ip: DEFAULT_MAX_CONNECTIONS_PER_IP,
            max_headers: DEFAULT_MAX_HEADERS,
            stream_buffer: DEFAULT_STREAM_BUFFER,
            stream_stall_timeout: Duration::from_secs_f64(DEFAULT_STREAM_STALL_TIMEOUT_S),
            text_pool: TextPoolConfig::default(),
        }
    }
}

impl EdgeConfig {
    /// The limits of one stream whose client does not read.
    pub fn stream_limits(&self) -> StreamLimits {
        StreamLimits {
            buffer: self.stream_buffer,
            stall_timeout: self.stream_stall_timeout,
        }
    }

    pub fn resolve(s: &Settings) -> anyhow::Result<EdgeConfig> {
        let d = EdgeConfig::default();
        let secs = |name: &str, v: Option<f64>, default: Duration| match v {
            None => Ok(default),
            Some(x) if x.is_finite() && x > 0.0 && x <= 86_400.0 => Ok(Duration::from_secs_f64(x)),
            Some(x) => {
                bail!("{name} must be a number of seconds above 0 and at most 86400, got {x}")
            }
        };
        let at_least_one = |name: &str, v: Option<usize>, default: usize| match v {
            Some(0) => bail!("{name} must be at least 1"),
            v => Ok(v.unwrap_or(default)),
        };
        let max_connections =
            at_least_one("max_connections", s.max_connections, d.max_connections)?;
        let per_ip = at_least_one(
            "max_connections_per_ip",
            s.max_connections_per_ip,
            d.max_connections_per_ip,
        )?;
        if per_ip > max_connections {
            bail!(
                "max_connections_per_ip ({per_ip}) must not exceed max_connections \
                 ({max_connections})"
            );
        }
        let max_headers = at_least_one("max_headers", s.max_headers, d.max_headers)?;
        if max_headers > 1024 {
            bail!("max_headers must be at most 1024, got {max_headers}");
        }
        Ok(EdgeConfig {
            header_timeout: secs("header_timeout_s", s.header_timeout_s, d.header_timeout)?,
            body_timeout: secs("body_timeout_s", s.body_timeout_s, d.body_timeout)?,
            max_connections,
            max_connections_per_ip: per_ip,
            max_headers,
            stream_buffer: at_least_one("stream_buffer", s.stream_buffer, d.stream_buffer)?,
            stream_stall_timeout: secs(
                "stream_stall_timeout_s",
                s.stream_stall_timeout_s,
                d.stream_stall_timeout,
            )?,
            text_pool: TextPoolConfig {
                workers: at_least_one("text_workers", s.text_workers, d.text_pool.workers)?,
                queue: s.text_queue.unwrap_or(d.text_pool.queue),
            },
        })
    }
}
