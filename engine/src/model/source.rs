//! Where a model's configuration comes from: a directory's `config.json`, or a GGUF file's
//! metadata. Kept apart from both readers, which know nothing of each other.

use super::config::ModelConfig;
use crate::error::EngineError;
use std::path::Path;

impl ModelConfig {
    /// Reads `dir/config.json`, or the metadata of `dir` when it is a GGUF file.
    pub fn from_model_dir(dir: &Path) -> Result<ModelConfig, EngineError> {
        if super::gguf::is_gguf(dir) {
            return super::gguf::GgufFile::open(dir)?.config();
        }
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                EngineError::model_files(&path, "not found (a model directory needs config.json)")
            } else {
                EngineError::model_files(&path, format!("cannot read: {e}"))
            }
        })?;
        ModelConfig::from_json(&text, &path)
    }
}
