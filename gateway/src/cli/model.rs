//! `superinfer model tiny --out DIR`: writes the embedded default model, a deterministic
//! random-weight Llama-architecture model with a real byte-level BPE tokenizer and a chat
//! template, into a directory that `superinfer serve --model-dir DIR` (or any Hugging Face
//! loader) can load. Its weights are random, so its text is meaningless.

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
}

pub fn run(args: ModelArgs) -> anyhow::Result<()> {
    match args.command {
        ModelCommand::Tiny { out, seed } => {
            superinfer_engine::model::tiny::write_tiny_model(&out, seed)
                .with_context(|| format!("writing the tiny model into {}", out.display()))?;
            println!("wrote the tiny model into {}", out.display());
            Ok(())
        }
    }
}
