//! Reading the store's own length-prefixed files (its verified copy and the ledger log): a
//! cursor over bytes that answers `None` past their end, so a torn file is never a panic.

/// Reads `n` bytes at `*at` of `b`.
pub(crate) fn take<'a>(b: &'a [u8], at: &mut usize, n: usize) -> Option<&'a [u8]> {
    let s = b.get(*at..at.checked_add(n)?)?;
    *at += n;
    Some(s)
}

/// Reads a big-endian u32 at `*at` of `b`.
pub(crate) fn take_u32(b: &[u8], at: &mut usize) -> Option<usize> {
    take(b, at, 4).map(|s| u32::from_be_bytes(s.try_into().expect("4 bytes")) as usize)
}

/// Reads a u32 length and that many bytes at `*at` of `b`.
pub(crate) fn take_bytes(b: &[u8], at: &mut usize) -> Option<Vec<u8>> {
    let n = take_u32(b, at)?;
    take(b, at, n).map(<[u8]>::to_vec)
}
