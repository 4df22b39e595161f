//! The decode-attention kernels a model can launch, and the operator's choice of one
//! (`SUPERINFER_DECODE_KERNEL`).

use crate::error::{Error, Result};

/// The decode attention kernels (same arguments, same split workspace).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum DecodeKernel {
    /// attention.cu's: scores, softmax, values in three phases through shared memory.
    ThreePhase = 0,
    /// decode.cu's: one pass with an online softmax, two tiles of 4 keys per group in flight.
    OnePass = 1,
    /// decode_mma.cu's: tiles of 16 keys copied by cp.async into a per-warp pipeline, scores
    /// and values on tensor cores. The default: on the H200 it read KV at 60% of HBM bandwidth
    /// at batch 64 x 513 and 63% at 8 x 4,096, where the one-pass kernel read 40% and 46%
    /// (docs/BENCHMARKS.md).
    #[default]
    TensorCore = 2,
}

impl DecodeKernel {
    pub const ALL: [DecodeKernel; 3] = [
        DecodeKernel::ThreePhase,
        DecodeKernel::OnePass,
        DecodeKernel::TensorCore,
    ];

    /// Whether the kernel reads each sequence's keys per split from its entry (`part` 0, as
    /// the fixed plans of CUDA graphs launch it).
    pub fn per_sequence_parts(self) -> bool {
        self != DecodeKernel::ThreePhase
    }

    /// The name `SUPERINFER_DECODE_KERNEL` takes.
    pub fn name(self) -> &'static str {
        match self {
            DecodeKernel::ThreePhase => "three-phase",
            DecodeKernel::OnePass => "one-pass",
            DecodeKernel::TensorCore => "tensor-core",
        }
    }

    /// The kernel `SUPERINFER_DECODE_KERNEL` names (`three-phase`, `one-pass` or
    /// `tensor-core`), or the default when it is unset: an operator's choice of decode kernel
    /// (and a way to compare them in the served loop without a rebuild).
    pub fn from_env() -> Result<DecodeKernel> {
        match std::env::var("SUPERINFER_DECODE_KERNEL") {
            Err(std::env::VarError::NotPresent) => Ok(DecodeKernel::default()),
            Ok(v) => DecodeKernel::parse(&v).ok_or_else(|| {
                Error::Invalid(format!(
                    "SUPERINFER_DECODE_KERNEL={v:?}: expected one of three-phase, one-pass, \
                     tensor-core"
                ))
            }),
            Err(e) => Err(Error::Invalid(format!("SUPERINFER_DECODE_KERNEL: {e}"))),
        }
    }

    /// The kernel of [`DecodeKernel::name`] `name`.
    pub fn parse(name: &str) -> Option<DecodeKernel> {
        DecodeKernel::ALL
            .into_iter()
            .find(|k| k.name() == name.trim())
    }

    /// Threads per CTA.
    pub fn threads(self) -> u32 {
        match self {
            DecodeKernel::ThreePhase | DecodeKernel::OnePass => 128,
            DecodeKernel::TensorCore => 64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::DecodeKernel;

    #[test]
    fn decode_kernel_names_round_trip_and_others_are_refused() {
        for k in DecodeKernel::ALL {
            assert_eq!(DecodeKernel::parse(k.name()), Some(k));
        }
        assert_eq!(
            DecodeKernel::parse(" tensor-core\n"),
            Some(DecodeKernel::TensorCore)
        );
        assert_eq!(DecodeKernel::parse("tensorcore"), None);
        assert_eq!(DecodeKernel::parse(""), None);
    }
}
