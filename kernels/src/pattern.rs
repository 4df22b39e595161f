//! Test data for copies: every 8-byte word of a block is a hash of (the block's tag, the piece,
//! the word index), so a verifier finds a missing, stale, misplaced or torn copy, whatever the
//! layout. The CUDA kernels in `cuda::source` compute the same function on the device. Also
//! the small deterministic RNG and the stable hash the benchmark and the NVRTC cache use.

#[cfg(test)]
mod tests;

/// SplitMix64's finalizer: a bijection on u64 with good avalanche.
pub const fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Word `word` of piece `piece` of a block tagged `tag`.
pub const fn word(tag: u64, piece: u32, word: u32) -> u64 {
    mix64(tag.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (((piece as u64) << 32) | word as u64))
}

/// A tag unique to (generation, tier, block): a fresh generation per experiment makes data
/// left over from an earlier one fail verification.
pub const fn block_tag(generation: u32, tier: u8, block: u32) -> u64 {
    ((generation as u64) << 33) | (((tier & 1) as u64) << 32) | block as u64
}

/// Fills one piece (`buf.len()` a multiple of 8) with its pattern.
pub fn fill_piece(buf: &mut [u8], tag: u64, piece: u32) {
    for (i, w) in buf.chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(&word(tag, piece, i as u32).to_le_bytes());
    }
}

/// Words of one piece that differ from its pattern.
pub fn count_mismatches(buf: &[u8], tag: u64, piece: u32) -> u64 {
    buf.chunks_exact(8)
        .enumerate()
        .filter(|(i, w)| {
            let got = u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
            got != word(tag, piece, *i as u32)
        })
        .count() as u64
}

/// A piece to fill or check: its bytes, the tag of the block it belongs to, its index.
pub struct PieceJob<B> {
    pub buf: B,
    pub tag: u64,
    pub piece: u32,
}

/// Fills pieces on `threads` threads.
pub fn par_fill(jobs: Vec<PieceJob<&mut [u8]>>, threads: usize) {
    let mut jobs = jobs;
    let per = jobs.len().div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        for part in jobs.chunks_mut(per) {
            s.spawn(move || {
                for j in part.iter_mut() {
                    fill_piece(j.buf, j.tag, j.piece);
                }
            });
        }
    });
}

/// Mismatching words over all pieces, checked on `threads` threads.
pub fn par_count_mismatches(jobs: &[PieceJob<&[u8]>], threads: usize) -> u64 {
    let per = jobs.len().div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .chunks(per)
            .map(|part| {
                s.spawn(move || {
                    part.iter()
                        .map(|j| count_mismatches(j.buf, j.tag, j.piece))
                        .sum::<u64>()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a checker thread panicked"))
            .sum()
    })
}

/// A small deterministic generator (SplitMix64) for block ids in benchmarks and tests.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.0.wrapping_sub(0x9E37_79B9_7F4A_7C15))
    }

    /// Uniform in `0..n` (n > 0), by rejection so there is no modulo bias.
    pub fn below(&mut self, n: u64) -> u64 {
        let zone = u64::MAX - u64::MAX % n;
        loop {
            let x = self.next_u64();
            if x < zone {
                return x % n;
            }
        }
    }

    /// A uniformly random permutation of `0..n` (Fisher-Yates).
    pub fn permutation(&mut self, n: u32) -> Vec<u32> {
        let mut v: Vec<u32> = (0..n).collect();
        for i in (1..v.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
        v
    }
}

/// FNV-1a, 64 bit: a hash that is stable across Rust versions and machines (the NVRTC cache
/// keys files by it).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}
