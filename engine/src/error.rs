//! The engine's one error enum.

use superinfer_policies::RequestId;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("request {0:?}: the prompt is empty")]
    EmptyPrompt(RequestId),
    #[error(
        "request {id:?}: {tokens} tokens need {blocks} KV blocks but HBM holds only {capacity}"
    )]
    TooLong {
        id: RequestId,
        tokens: u32,
        blocks: u32,
        capacity: u32,
    },
    #[error("request {0:?} is already in the engine")]
    Duplicate(RequestId),
    #[error("the engine queue is full ({0} requests waiting)")]
    QueueFull(usize),
    /// Refused at admission: its tenant's queue would hold it past its TTFT SLO.
    #[error(
        "request {id:?} would miss its TTFT SLO: this tenant's requests wait {wait_s:.1} s to \
         start now"
    )]
    WouldMissSlo { id: RequestId, wait_s: f64 },
    #[error("request {id:?}: weight must be positive and SLOs positive, got weight {weight}")]
    BadRequest { id: RequestId, weight: f64 },
    #[error("request {id:?}: this model runner does not report {what}")]
    Unsupported { id: RequestId, what: &'static str },
    #[error("profile {name}: {msg}")]
    Profile { name: String, msg: String },
    #[error("model runner: {0}")]
    Runner(String),
    #[error("the engine is not running")]
    Stopped,
    #[error("config: {0}")]
    Config(String),
    /// A model directory is incomplete or malformed; `file` names the file (and field).
    #[error("model file {file}: {msg}")]
    ModelFiles { file: String, msg: String },
    /// Tokenizing, detokenizing or rendering a chat template failed.
    #[error("text: {0}")]
    Text(String),
}

impl EngineError {
    /// A model or tokenizer file at `path` that cannot be used, and why.
    pub fn model_files(path: &std::path::Path, msg: impl Into<String>) -> EngineError {
        EngineError::ModelFiles {
            file: path.display().to_string(),
            msg: msg.into(),
        }
    }
}
