//! The crate's one error type.

use std::fmt;

use crate::inflight::Conflict;

#[derive(Debug)]
pub enum Error {
    /// A CUDA driver or library call failed.
    Cuda { op: &'static str, detail: String },
    /// NVRTC rejected a kernel source.
    Compile { module: String, log: String },
    /// A batch would race a copy in flight (see [`crate::inflight`]).
    Hazard(Conflict),
    /// Arguments that cannot work (sizes, block ids out of range).
    Invalid(String),
    /// File access of the kernel cache.
    Io {
        path: String,
        source: std::io::Error,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Cuda { op, detail } => write!(f, "CUDA {op} failed: {detail}"),
            Error::Compile { module, log } => write!(f, "NVRTC could not compile {module}: {log}"),
            Error::Hazard(c) => write!(f, "copy hazard: {c}"),
            Error::Invalid(what) => write!(f, "invalid argument: {what}"),
            Error::Io { path, source } => write!(f, "{path}: {source}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl From<Conflict> for Error {
    fn from(c: Conflict) -> Self {
        Error::Hazard(c)
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
