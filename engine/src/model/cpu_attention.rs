//! Decode attention on the CPU, reading K/V in place from an f32 arena through the block
//! tables. The device-generic path gathers every sequence's context into new tensors and
//! transposes them (three copies of the KV per layer); decode is dominated by exactly that
//! traffic, so on the CPU each query reads the arena rows directly instead. Each sequence is
//! computed on its own (in parallel), so its result does not depend on the batch.

use rayon::prelude::*;

/// One decode query: its context rows in the arena.
pub(super) struct DecodeSeq {
    /// Arena rows of K and of V for the positions the query may see, in order.
    pub k_rows: Vec<u32>,
    pub v_rows: Vec<u32>,
}

/// Shapes of the attention.
#[derive(Clone, Copy)]
pub(super) struct Heads {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
}

/// `q`: `(seqs, num_heads * head_dim)` row-major; `arena`: rows of `num_kv_heads * head_dim`.
/// Returns `(seqs, num_heads * head_dim)`.
pub(super) fn decode(q: &[f32], seqs: &[DecodeSeq], arena: &[f32], h: Heads) -> Vec<f32> {
    let qw = h.num_heads * h.head_dim;
    let mut out = vec![0f32; seqs.len() * qw];
    out.par_chunks_mut(qw)
        .zip(seqs.par_iter())
        .enumerate()
        .for_each(|(b, (o, s))| one(&q[b * qw..(b + 1) * qw], s, arena, h, o));
    out
}

fn one(q: &[f32], s: &DecodeSeq, arena: &[f32], h: Heads, out: &mut [f32]) {
    let (d, n) = (h.head_dim, s.k_rows.len());
    let width = h.num_kv_heads * d;
    let group = h.num_heads / h.num_kv_heads;
    let row = |r: u32| &arena[r as usize * width..(r as usize + 1) * width];
    // scores[head][j]
    let mut scores = vec![0f32; h.num_heads * n];
    for (j, &r) in s.k_rows.iter().enumerate() {
        let k = row(r);
        for head in 0..h.num_heads {
            let kh = &k[(head / group) * d..][..d];
            let qh = &q[head * d..][..d];
            let dot: f32 = qh.iter().zip(kh).map(|(a, b)| a * b).sum();
            scores[head * n + j] = dot * h.scale;
        }
    }
    for head in 0..h.num_heads {
        let sc = &mut scores[head * n..(head + 1) * n];
        let max = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f32;
        for x in sc.iter_mut() {
            *x = (*x - max).exp();
            sum += *x;
        }
        let inv = 1.0 / sum;
        for x in sc.iter_mut() {
            *x *= inv;
        }
    }
    for (j, &r) in s.v_rows.iter().enumerate() {
        let v = row(r);
        for head in 0..h.num_heads {
            let p = scores[head * n + j];
            let vh = &v[(head / group) * d..][..d];
            for (o, x) in out[head * d..(head + 1) * d].iter_mut().zip(vh) {
                *o += p * x;
            }
        }
    }
}
