//! `import`: a GGUF file written out as a Hugging Face model directory (`config.json`,
//! `generation_config.json`, `model.safetensors`, `tokenizer.json`, `tokenizer_config.json`)
//! that the CPU and GPU paths and other tools (`transformers`) load.

use super::{gguf_err, GgufFile};
use crate::error::EngineError;
use crate::serve::ModelDtype;
use candle_core::{DType, Device};
use serde_json::json;
use std::path::Path;

/// How to write the directory.
#[derive(Clone, Copy, Debug)]
pub struct ImportOptions {
    /// Dtype of the written weights. f32 keeps the dequantized values exactly; bf16 or f16
    /// halve the size.
    pub dtype: ModelDtype,
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions {
            dtype: ModelDtype::F32,
        }
    }
}

fn write_json(path: &Path, v: &serde_json::Value) -> Result<(), EngineError> {
    let text = serde_json::to_string_pretty(v).expect("a JSON value always serializes");
    std::fs::write(path, text + "\n").map_err(|e| gguf_err(path, format!("cannot write: {e}")))
}

/// Writes the model of the GGUF file `gguf` into the directory `out` (created if needed).
/// Files already in `out` with these names are replaced.
pub fn import(gguf: &Path, out: &Path, opts: ImportOptions) -> Result<(), EngineError> {
    let file = GgufFile::open(gguf)?;
    let mut config = file.config_json()?;
    let dtype = opts.dtype.dtype();
    config["torch_dtype"] = json!(match dtype {
        DType::BF16 => "bfloat16",
        DType::F16 => "float16",
        _ => "float32",
    });
    // Validated here so that a file the engine cannot serve writes nothing.
    file.config()?;
    let text = crate::text::gguf::from_gguf(&file)?;
    let tensors = file.tensors(dtype, &Device::Cpu)?;
    std::fs::create_dir_all(out).map_err(|e| gguf_err(out, format!("cannot create: {e}")))?;
    let weights = out.join("model.safetensors");
    candle_core::safetensors::save(&tensors, &weights)
        .map_err(|e| gguf_err(&weights, format!("cannot write: {e}")))?;
    let tok = out.join("tokenizer.json");
    text.tokenizer
        .save(&tok, false)
        .map_err(|e| gguf_err(&tok, format!("cannot write: {e}")))?;
    write_json(&out.join("tokenizer_config.json"), &text.tokenizer_config)?;
    let mut generation = json!({ "eos_token_id": text.eos_ids });
    if let Some(b) = text.bos_id {
        generation["bos_token_id"] = json!(b);
    }
    write_json(&out.join("generation_config.json"), &generation)?;
    write_json(&out.join("config.json"), &config)?;
    Ok(())
}
