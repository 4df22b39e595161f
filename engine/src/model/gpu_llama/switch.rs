//! The environment switches of a [`GpuLlama`](super::GpuLlama)'s decode settings, read at load.

use crate::error::EngineError;

/// A switch from the environment: `1` on, `0` off, unset `default`; anything else is an error
/// naming the variable (`SUPERINFER_FUSED_NORM`: `GpuLlama::set_decode_fused_norm`;
/// `SUPERINFER_FUSED_SILU`: `GpuLlama::set_decode_fused_silu`; `SUPERINFER_PDL`:
/// `GpuLlama::set_decode_overlap` with `Overlap::PDL`, on unless `0`).
pub(super) fn switch_from_env(name: &str, default: bool) -> Result<bool, EngineError> {
    match std::env::var(name) {
        Err(std::env::VarError::NotPresent) => Ok(default),
        Ok(v) if v.trim() == "0" => Ok(false),
        Ok(v) if v.trim() == "1" => Ok(true),
        Ok(v) => Err(EngineError::Config(format!(
            "{name}={v:?}: expected 0 or 1"
        ))),
        Err(e) => Err(EngineError::Config(format!("{name}: {e}"))),
    }
}
