//! SuperInfer engine: continuous batching with chunked prefill over a two-tier (HBM + DRAM)
//! paged KV cache, scheduled by a pluggable [`superinfer_policies::Policy`] and moved by a
//! duplex copy engine.
//!
//! The [`Engine`] is a state machine driven by [`Engine::step`]; it never sleeps or spawns.
//! Its runner ([`runner::ModelRunner`]), copy engine ([`transfer::Transfer`]) and clock
//! ([`clock::Clock`]) are parameters, so the simulated twin (`SimRunner`, `SimTransfer`,
//! `VirtualClock`) runs the very scheduler, KV pool and accounting that serve traffic.
//! This crate knows nothing of HTTP or tenants beyond the plain fields of a request.
//!
//! - [`engine`]: the iteration loop.
//! - [`kv`]: blocks, their lifecycle table, the two-tier pool.
//! - [`request`]: requests and their states.
//! - [`runner`], [`transfer`], [`clock`]: the backend contracts and the simulated backends.
//! - [`profile`]: hardware + model profiles for the simulation.
//! - [`sim`]: a ready-made simulated engine.
//! - [`handle`]: real-clock serving on a dedicated thread, with per-request event streams.
//! - [`grammar`]: structured outputs (llguidance grammars, token masks computed while the step runs).
//! - [`text`]: tokenizer, chat template and incremental detokenization ([`TextCodec`]).
//! - [`serve`]: a ready CPU engine from a model directory ([`serve::cpu_engine`]).
//! - [`model`]: model code; [`model::tiny`] writes the embedded random-weight default model.
//!
//! [`model`], [`serve`], `runner::cpu`, `transfer::host` and `text::gguf` need the default
//! feature `model` (candle); without it the crate is the scheduler-facing core that the load
//! generator and the twin use.
#![forbid(unsafe_code)]

pub mod clock;
pub mod engine;
pub mod error;
pub mod grammar;
pub mod handle;
pub mod kv;
#[cfg(feature = "model")]
pub mod model;
pub mod profile;
pub mod request;
pub mod runner;
pub mod sampling;
#[cfg(feature = "model")]
pub mod serve;
pub mod sim;
pub mod text;
pub mod transfer;

pub use engine::{
    Engine, EngineConfig, EngineEvent, EngineStats, RequestEnd, StepReport, TokenExtra,
};
pub use error::EngineError;
pub use handle::{
    spawn, EndTrace, EngineHandle, EngineHealth, EngineThread, HandleConfig, RequestStream,
    StepMetrics, StreamErrorKind, StreamEvent,
};
pub use kv::{CacheScope, PrefixHit};
pub use request::{EngineRequest, ErrorCause, FinishReason, ReqState};
pub use sampling::{SamplingParams, TokenLogprobs};
pub use text::{ChatMessage, IncrementalDecoder, TextCodec};
