//! `superinfer model tiny --out DIR`: writes the embedded default model, a deterministic
//! random-weight Llama-architecture model with a real byte-level BPE tokenizer and a chat
//! template, into a directory that `superinfer serve --model-dir DIR` (or any Hugging Face
//! loader) can load. Its weights are random, so its text is meaningless.
//!
//! `superinfer model import FILE.gguf --out DIR`: writes a GGUF model as a Hugging Face
//! directory (config, dequantized safetensors, tokenizer, chat template).

use anyhow::Context;
use clap::{Args, Subcommand};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct ModelArgs {
    #[command(subcommand)]
    pub command: ModelCommand,
}

#[derive(Subcommand, Debug)]
pub enum ModelCommand {
    /// Write the embedded tiny model (a few MB) into a directory.
    Tiny {
        /// Directory to write (created if needed).
        #[arg(long)]
        out: PathBuf,
        /// Seed of the random weights (the same seed gives the same files).
        #[arg(long, default_value_t = crate::backend::TINY_MODEL_SEED)]
        seed: u64,
    },
    /// Write a GGUF model as a Hugging Face directory (config.json, model.safetensors,
    /// tokenizer.json, tokenizer_config.json, generation_config.json).
    Import {
        /// The GGUF file.
        gguf: PathBuf,
        /// Directory to write (created if needed).
        #[arg(long)]
        out: PathBuf,
        /// Dtype of the written weights: f32 keeps the dequantized values exactly.
        #[arg(long, value_enum, default_value_t = ImportDtype::F32)]
        dtype: ImportDtype,
    },
}

/// Weight dtypes `model import` writes.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum ImportDtype {
    F32,
    F16,
    Bf16,
}

pub fn run(args: ModelArgs) -> anyhow::Result<()> {
    match args.command {
        ModelCommand::Tiny { out, seed } => {
            superinfer_engine::model::tiny::write_tiny_model(&out, seed)
                .with_context(|| format!("writing the tiny model into {}", out.display()))?;
            println!("wrote the tiny model into {}", out.display());
            Ok(())
        }
        ModelCommand::Import { gguf, out, dtype } => {
            use superinfer_engine::model::gguf::{import, ImportOptions};
            use superinfer_engine::serve::ModelDtype;
            let dtype = match dtype {
                ImportDtype::F32 => ModelDtype::F32,
                ImportDtype::F16 => ModelDtype::F16,
                ImportDtype::Bf16 => ModelDtype::Bf16,
            };
            import(&gguf, &out, ImportOptions { dtype })
                .with_context(|| format!("importing {}", gguf.display()))?;
            println!("wrote {} into {}", gguf.display(), out.display());
            Ok(())
        }
    }
}
