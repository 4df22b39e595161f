//! Model code over candle: the Llama family with paged attention over the block-first KV
//! arena, shared by the CPU and CUDA runners.
//!
//! - [`config`]: `config.json` → [`ModelConfig`] (supported architectures, clear errors).
//! - [`weights`]: finding and loading (sharded) safetensors in f32/f16/bf16.
//! - [`gguf`]: a GGUF file as a model (config from its metadata, dequantized tensors), and
//!   its import into a Hugging Face directory.
//! - [`kv_arena`]: a KV tier as one tensor in block-first layout ([`KvArena`]).
//! - [`llama`]: the transformer and its paged forward ([`PagedLlama`]).
//! - [`tiny`]: the embedded random-weight default model (its text is meaningless), and the
//!   real-size random shapes (`random:llama-3-8b`, ...).
//! - `gpu_llama` (feature `cuda`): the same model on a CUDA GPU with our kernels.

pub mod config;
mod cpu_attention;
pub mod gguf;
#[cfg(feature = "cuda")]
pub mod gpu_llama;
pub mod kv_arena;
pub mod llama;
mod source;
pub mod tiny;
pub mod weights;

pub use config::ModelConfig;
pub use kv_arena::KvArena;
pub use llama::{PagedLlama, SeqChunk};
