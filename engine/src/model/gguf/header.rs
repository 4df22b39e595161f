//! The one thing candle's GGUF reader does not tell: which tensor has a type it does not know
//! (it stops at the first such type without naming the tensor). Used only to word that error.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

/// ggml's type numbers (`ggml.h`) of every type, for error messages.
const TYPE_NAMES: &[(u32, &str)] = &[
    (0, "F32"),
    (1, "F16"),
    (2, "Q4_0"),
    (3, "Q4_1"),
    (6, "Q5_0"),
    (7, "Q5_1"),
    (8, "Q8_0"),
    (9, "Q8_1"),
    (10, "Q2_K"),
    (11, "Q3_K"),
    (12, "Q4_K"),
    (13, "Q5_K"),
    (14, "Q6_K"),
    (15, "Q8_K"),
    (16, "IQ2_XXS"),
    (17, "IQ2_XS"),
    (18, "IQ3_XXS"),
    (19, "IQ1_S"),
    (20, "IQ4_NL"),
    (21, "IQ3_S"),
    (22, "IQ2_S"),
    (23, "IQ4_XS"),
    (24, "I8"),
    (25, "I16"),
    (26, "I32"),
    (27, "I64"),
    (28, "F64"),
    (29, "IQ1_M"),
    (30, "BF16"),
    (34, "TQ1_0"),
    (35, "TQ2_0"),
    (39, "MXFP4"),
];

/// Types candle's reader knows (the others stop it).
const KNOWN: &[u32] = &[0, 1, 2, 3, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 30];

/// ggml's name of a type candle reads.
pub(super) fn dtype_name(t: candle_core::quantized::GgmlDType) -> &'static str {
    use candle_core::quantized::GgmlDType as G;
    match t {
        G::F32 => "F32",
        G::F16 => "F16",
        G::BF16 => "BF16",
        G::Q4_0 => "Q4_0",
        G::Q4_1 => "Q4_1",
        G::Q5_0 => "Q5_0",
        G::Q5_1 => "Q5_1",
        G::Q8_0 => "Q8_0",
        G::Q8_1 => "Q8_1",
        G::Q2K => "Q2_K",
        G::Q3K => "Q3_K",
        G::Q4K => "Q4_K",
        G::Q5K => "Q5_K",
        G::Q6K => "Q6_K",
        G::Q8K => "Q8_K",
    }
}

pub(super) fn type_name(ty: u32) -> String {
    TYPE_NAMES
        .iter()
        .find(|(n, _)| *n == ty)
        .map_or_else(|| format!("#{ty}"), |(_, name)| (*name).to_owned())
}

/// The first tensor (name, ggml type number) of a type candle cannot read; `None` when the
/// header is not a GGUF v2/v3 header or has no such tensor.
pub(super) fn unknown_tensor_type(path: &Path) -> Option<(String, u32)> {
    let mut r = BufReader::new(File::open(path).ok()?);
    if u32le(&mut r)? != 0x4655_4747 || !matches!(u32le(&mut r)?, 2 | 3) {
        return None;
    }
    let tensors = u64le(&mut r)?;
    let kvs = u64le(&mut r)?;
    for _ in 0..kvs {
        skip_string(&mut r)?;
        let ty = u32le(&mut r)?;
        skip_value(&mut r, ty, 0)?;
    }
    for _ in 0..tensors {
        let name = string(&mut r)?;
        let dims = u32le(&mut r)?;
        if dims > 8 {
            return None;
        }
        r.seek_relative(8 * i64::from(dims)).ok()?;
        let ty = u32le(&mut r)?;
        u64le(&mut r)?;
        if !KNOWN.contains(&ty) {
            return Some((name, ty));
        }
    }
    None
}

fn u32le(r: &mut impl Read) -> Option<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b).ok()?;
    Some(u32::from_le_bytes(b))
}

fn u64le(r: &mut impl Read) -> Option<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b).ok()?;
    Some(u64::from_le_bytes(b))
}

fn string(r: &mut impl Read) -> Option<String> {
    let n = usize::try_from(u64le(r)?).ok().filter(|n| *n < 1 << 20)?;
    let mut b = vec![0u8; n];
    r.read_exact(&mut b).ok()?;
    String::from_utf8(b).ok()
}

fn skip_string(r: &mut BufReader<File>) -> Option<()> {
    let n = i64::try_from(u64le(r)?).ok()?;
    r.seek_relative(n).ok()
}

/// Skips one metadata value of GGUF value type `ty` (arrays may nest).
fn skip_value(r: &mut BufReader<File>, ty: u32, depth: u32) -> Option<()> {
    let fixed = match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        8 => return skip_string(r),
        9 if depth < 4 => {
            let elem = u32le(r)?;
            let n = u64le(r)?;
            for _ in 0..n {
                skip_value(r, elem, depth + 1)?;
            }
            return Some(());
        }
        _ => return None,
    };
    r.seek_relative(fixed).ok()
}
