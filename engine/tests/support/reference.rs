//! Reading the JSON references of `scripts/smollm2_reference.py` (the CPU fixture and the GPU
//! machine's references): shared (`#[path]`) by `gguf_smollm2.rs` and `gpu_smollm2.rs`.

use serde_json::Value;

/// A list of token ids.
pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("a list of ids")
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}

/// A list of numbers.
#[allow(dead_code)] // used by the GPU test only (feature `cuda`)
pub fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .expect("a list of numbers")
        .iter()
        .map(|x| x.as_f64().expect("a number"))
        .collect()
}
