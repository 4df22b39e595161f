//! Finding and loading the safetensors weights of a Hugging Face model directory: one
//! `model.safetensors`, or shards listed by `model.safetensors.index.json`, or every
//! `*.safetensors` in the directory. f32, f16 and bf16 files load into any compute dtype.

use crate::error::EngineError;
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

fn err(path: &Path, msg: impl Into<String>) -> EngineError {
    EngineError::ModelFiles {
        file: path.display().to_string(),
        msg: msg.into(),
    }
}

/// The weight files of `dir`, in a stable order.
pub fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>, EngineError> {
    let index = dir.join("model.safetensors.index.json");
    if let Some(v) = crate::text::read_json(&index)? {
        let map = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| err(&index, "field weight_map: missing or not an object"))?;
        let files: BTreeSet<&str> = map.values().filter_map(|f| f.as_str()).collect();
        if files.is_empty() {
            return Err(err(&index, "field weight_map: names no file"));
        }
        let paths: Vec<PathBuf> = files.into_iter().map(|f| dir.join(f)).collect();
        if let Some(missing) = paths.iter().find(|p| !p.is_file()) {
            return Err(err(
                missing,
                "not found (listed in model.safetensors.index.json)",
            ));
        }
        return Ok(paths);
    }
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| err(dir, format!("cannot list the model directory: {e}")))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    found.sort();
    if found.is_empty() {
        return Err(err(
            &single,
            "not found (nor model.safetensors.index.json, nor any *.safetensors)",
        ));
    }
    Ok(found)
}

/// Loads every weight of `dir` onto `device`; `get` converts to `dtype` on use. `dir` may
/// also be a GGUF file, whose tensors are dequantized to `dtype` ([`super::gguf`]).
pub fn load(dir: &Path, dtype: DType, device: &Device) -> Result<Weights, EngineError> {
    if super::gguf::is_gguf(dir) {
        let tensors = super::gguf::GgufFile::open(dir)?.tensors(dtype, device)?;
        return Ok(Weights {
            vb: VarBuilder::from_tensors(tensors, dtype, device),
            files: dir.display().to_string(),
        });
    }
    let files = safetensors_files(dir)?;
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    for f in &files {
        let part = candle_core::safetensors::load(f, device)
            .map_err(|e| err(f, format!("cannot load safetensors: {e}")))?;
        tensors.extend(part);
    }
    let names = files
        .iter()
        .map(|f| f.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    Ok(Weights {
        vb: VarBuilder::from_tensors(tensors, dtype, device),
        files: names,
    })
}

/// Loaded weights by Hugging Face name.
pub struct Weights {
    vb: VarBuilder<'static>,
    files: String,
}

impl Weights {
    /// Tensor `name` with `shape`, in the compute dtype; a missing tensor or a wrong shape is
    /// an error naming the files and the tensor.
    pub fn get(&self, shape: &[usize], name: &str) -> Result<Tensor, EngineError> {
        if !self.vb.contains_tensor(name) {
            return Err(EngineError::ModelFiles {
                file: self.files.clone(),
                msg: format!("tensor {name} is missing"),
            });
        }
        self.vb
            .get(shape, name)
            .map_err(|e| EngineError::ModelFiles {
                file: self.files.clone(),
                msg: format!("tensor {name}: {e}"),
            })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.vb.contains_tensor(name)
    }
}
