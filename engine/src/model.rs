//! Model code over candle: the Llama family with paged attention over the block-first KV
//! arena, shared by the CPU and CUDA runners.
//!
//! - [`config`]: `config.json` → [`ModelConfig`] (supported architectures, clear errors).
//! - [`weights`]: finding and loading (sharded) safetensors in f32/f16/bf16.
//! - [`kv_arena`]: a KV tier as one tensor in block-first layout ([`KvArena`]).
//! - [`llama`]: the transformer and its paged forward ([`PagedLlama`]).
//! - [`tiny`]: the embedded random-weight default model (its text is meaningless).

pub mod config;
mod cpu_attention;
pub mod kv_arena;
pub mod llama;
pub mod tiny;
pub mod weights;

pub use config::ModelConfig;
pub use kv_arena::KvArena;
pub use llama::{PagedLlama, SeqChunk};
