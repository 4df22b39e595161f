//! SuperInfer's HTTP edge: the OpenAI-compatible API in front of the engine, for many
//! tenants at once.
//!
//! What it does: authenticates each request by API key against the tenant registry
//! ([`registry`], kept fresh from sled), enforces the tenant's quotas ([`quota`]:
//! in-process, or fleet-wide in Redis), validates and tokenizes ([`validate`], [`text`]), admits into the engine with
//! the tenant's SLO and weight ([`admission`]), and streams the answer back as server-sent
//! events or one JSON body ([`openai`], [`generate`]), with tool calls parsed out of the
//! text ([`tools`]); serves the admin API ([`admin`]),
//! `/metrics` ([`metrics`]), health checks, and the `superinfer` command line ([`cli`],
//! [`config`]). [`server`] wires it together and shuts it down in order.
//!
//! What it does not do: scheduling, KV management or model execution (the engine crate),
//! tenant storage (the tenants crate), TLS (put a proxy in front).
//!
//! All errors are one enum, [`GatewayError`], mapped to HTTP in one place.
#![forbid(unsafe_code)]

pub mod admin;
pub mod admission;
pub mod auth;
pub mod backend;
pub mod cli;
pub mod config;
pub mod conn;
pub mod error;
pub mod generate;
pub mod layers;
pub mod metrics;
pub mod openai;
pub mod proxy;
pub mod quota;
pub mod registry;
pub mod server;
pub mod state;
pub mod stats;
pub mod tenants_file;
pub mod text;
pub mod tools;
pub mod usage;
pub mod validate;
pub mod wire;

pub use config::{ServeConfig, Settings};
pub use error::GatewayError;
pub use server::{start, RunningServer};
