// VARIANT for scripts/gpu/kernels.sh (VARIANTS=base,tree,prefill-async): a candidate
// replacement of kernels/src/cuda/cu/attention.cu whose prefill kernel loads K/V tiles by
// cp.async (a tile's V during its scores, the next tile's K during its values) and reads MMA
// fragments by ldmatrix (V through .trans instead of a scalar transpose into shared memory),
// heaviest causal tiles first. Written 2026-12-02 and compiled with nvcc 13.0 for sm_90 (232
// registers, no spills, 34,816 bytes of shared memory; with __launch_bounds__(128, 3): 168
// registers, 72 bytes spilled), but NOT yet run on a GPU: it replaces the shipped kernel only
// after the attention check (engine/tests/gpu_model_path.rs) passes with it and the bench
// shows it faster side by side. The decode kernels below are the shipped ones.
// Paged attention over the block-first KV arena. The arena is rows of width kv_heads * D; the
// K row of token offset o of layer l in block b is ((b * num_layers + l) * 2) * block_size + o,
// its V row block_size further. Sequences address their keys through a flat table of block
// ids. Scores use exp2: scale_log2 = log2(e) / sqrt(D).
//
// paged_prefill: a tiled FlashAttention-2 kernel on tensor cores (mma.m16n8k16, f32
//   accumulate) for chunks of queries at positions pos..end over keys 0..end, causal (and a
//   sliding window if window > 0). CTA = 64 queries x one head, 4 warps of 16 query rows;
//   key tiles of 64 copied into shared memory by cp.async (a tile's V while its scores are
//   computed, the next tile's K while its values are summed), fragments read by ldmatrix
//   (V through .trans, so it is stored as it is in the arena); online softmax in registers.
// paged_decode: one query per sequence, split over the context (flash-decoding): CTA =
//   (sequence, kv head, split of `part` <= DEC_PART keys; the host picks `part` so the grid
//   fills the GPU) serving the kv head's G query heads; groups of
//   8 lanes score one key, then D/8 lanes accumulate V over a key (16-byte loads, several in
//   flight per lane); partial results of several splits are merged by decode_reduce.

#define PF_M 64
#define PF_N 64
#define PF_THREADS 128  // 4 warps of 16 query rows
#define DEC_PART 256
#define DEC_WARPS 4
#define MAX_G 8

template <typename T, int D>
__device__ __forceinline__ void paged_prefill_impl(
    const T* __restrict__ q, const T* __restrict__ kv, T* __restrict__ out,
    const u32* __restrict__ tiles, const u32* __restrict__ seqs, const u32* __restrict__ tables,
    u32 num_heads, u32 kv_heads, u32 num_layers, u32 block_size, u32 layer, float scale_log2,
    u32 window) {
    constexpr int P = D + 8;    // row pitch in elements (16 bytes of padding: ldmatrix reads
                                // 8 rows without a bank conflict)
    constexpr int CPR = D / 8;  // 16-byte chunks per row
    __shared__ __align__(16) u16 Ks[PF_N][P];
    __shared__ __align__(16) u16 Vs[PF_N][P];

    // The last tiles of a sequence see the most keys: start them first (less tail).
    const u32 tile = gridDim.x - 1 - blockIdx.x, h = blockIdx.y;
    const u32 s = tiles[2 * tile], q0 = tiles[2 * tile + 1];
    const u32 q_off = seqs[4 * s], pos = seqs[4 * s + 1], end = seqs[4 * s + 2];
    const u32 tstart = seqs[4 * s + 3];
    const u32 n = end - pos;
    const u32 kh = h / (num_heads / kv_heads);
    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const u32 g = lane >> 2, t4 = lane & 3;
    const size_t qw = (size_t)num_heads * D, kvw = (size_t)kv_heads * D;

    const u32 r0 = q0 + warp * 16 + g, r1 = r0 + 8;
    u32 qa[D / 16][4];
    {
        const T* q_r0 = q + (size_t)(q_off + min(r0, n - 1)) * qw + (size_t)h * D;
        const T* q_r1 = q + (size_t)(q_off + min(r1, n - 1)) * qw + (size_t)h * D;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            qa[kk][0] = *(const u32*)(q_r0 + kk * 16 + 2 * t4);
            qa[kk][1] = *(const u32*)(q_r1 + kk * 16 + 2 * t4);
            qa[kk][2] = *(const u32*)(q_r0 + kk * 16 + 8 + 2 * t4);
            qa[kk][3] = *(const u32*)(q_r1 + kk * 16 + 8 + 2 * t4);
        }
    }
    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;

    const u32 p_lo = pos + q0;
    const u32 p_hi = pos + min(q0 + PF_M, n) - 1;
    const u32 k_lo = (window > 0 && p_lo + 1 > window) ? p_lo + 1 - window : 0;
    const u32 p0 = pos + r0, p1 = pos + r1;

    // Starts the copies of the K (v = 0) or V (v = 1) rows of keys k0..k0 + PF_N into shared
    // memory; keys past the tile's last query are zero-filled (nothing read).
    auto issue = [&](u32 k0, u32 v) {
        u16* dst = v ? &Vs[0][0] : &Ks[0][0];
#pragma unroll
        for (int it = 0; it < PF_N * CPR / PF_THREADS; ++it) {
            const u32 i = it * PF_THREADS + threadIdx.x;
            const u32 key = i / CPR, c = (i % CPR) * 8, j = k0 + key;
            const T* src = kv;
            if (j <= p_hi) {
                const size_t blk = tables[tstart + j / block_size];
                const size_t row = (blk * num_layers + layer) * 2 * block_size +
                                   (v ? block_size : 0) + j % block_size;
                src = kv + row * kvw + (size_t)kh * D + c;
            }
            cp_async16(smem_addr(dst + key * P + c), src, j <= p_hi ? 16 : 0);
        }
        cp_async_commit();
    };
    // ldmatrix lane roles: matrix mi = lane / 8, its row lane % 8. K: matrices (keys 0-7,
    // dims lo), (keys 0-7, hi), (keys 8-15, lo), (keys 8-15, hi) of a 16 x 16 step: the B
    // fragments of two 8-key score columns. V (transposed): (keys 0-7, dims lo), (keys 8-15,
    // lo), (keys 0-7, hi), (keys 8-15, hi): the B fragments of two 8-dim output columns.
    const u32 mi = lane >> 3, mr = lane & 7;
    const u32 kaddr = smem_addr(&Ks[(mi >> 1) * 8 + mr][(mi & 1) * 8]);
    const u32 vaddr = smem_addr(&Vs[(mi & 1) * 8 + mr][(mi >> 1) * 8]);

    // K of the next tile loads during this tile's P V, V of this tile during its Q K^T.
    const u32 k_first = (k_lo / PF_N) * PF_N;
    issue(k_first, 0);
    for (u32 k0 = k_first; k0 <= p_hi; k0 += PF_N) {
        cp_async_wait<0>();
        __syncthreads();  // K landed for all; every warp is done with the previous V
        issue(k0, 1);

        float sc[PF_N / 8][4];
#pragma unroll
        for (int nt = 0; nt < PF_N / 8; ++nt) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
            for (int np = 0; np < PF_N / 16; ++np) {
                u32 b[4];
                ldsm_x4(b, kaddr + (np * 16 * P + kk * 16) * 2);
                mma16816<T>(sc[2 * np], qa[kk], b);
                mma16816<T>(sc[2 * np + 1], qa[kk], b + 2);
            }
        }
        float mx0 = NEG_INF, mx1 = NEG_INF;
#pragma unroll
        for (int nt = 0; nt < PF_N / 8; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const u32 j = k0 + nt * 8 + 2 * t4 + (e & 1);
                const u32 p = e < 2 ? p0 : p1;
                const bool ok = j <= p && j <= p_hi && (window == 0 || j + window > p);
                sc[nt][e] = ok ? sc[nt][e] * scale_log2 : NEG_INF;
            }
            mx0 = fmaxf(mx0, fmaxf(sc[nt][0], sc[nt][1]));
            mx1 = fmaxf(mx1, fmaxf(sc[nt][2], sc[nt][3]));
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
        const float b0 = n0 == NEG_INF ? 0.0f : n0, b1 = n1 == NEG_INF ? 0.0f : n1;
        const float a0 = exp2f(m0 - b0), a1 = exp2f(m1 - b1);
        m0 = n0;
        m1 = n1;
        l0 *= a0;
        l1 *= a1;
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
            o[dt][0] *= a0;
            o[dt][1] *= a0;
            o[dt][2] *= a1;
            o[dt][3] *= a1;
        }
#pragma unroll
        for (int nt = 0; nt < PF_N / 8; ++nt) {
            sc[nt][0] = exp2f(sc[nt][0] - b0);
            sc[nt][1] = exp2f(sc[nt][1] - b0);
            sc[nt][2] = exp2f(sc[nt][2] - b1);
            sc[nt][3] = exp2f(sc[nt][3] - b1);
            l0 += sc[nt][0] + sc[nt][1];
            l1 += sc[nt][2] + sc[nt][3];
        }

        cp_async_wait<0>();
        __syncthreads();  // V landed for all; every warp is done with K
        if (k0 + PF_N <= p_hi) issue(k0 + PF_N, 0);
#pragma unroll
        for (int kt = 0; kt < PF_N / 16; ++kt) {
            u32 pa[4];
            pa[0] = pack2<T>(sc[2 * kt][0], sc[2 * kt][1]);
            pa[1] = pack2<T>(sc[2 * kt][2], sc[2 * kt][3]);
            pa[2] = pack2<T>(sc[2 * kt + 1][0], sc[2 * kt + 1][1]);
            pa[3] = pack2<T>(sc[2 * kt + 1][2], sc[2 * kt + 1][3]);
#pragma unroll
            for (int dp = 0; dp < D / 16; ++dp) {
                u32 b[4];
                ldsm_x4_t(b, vaddr + (kt * 16 * P + dp * 16) * 2);
                mma16816<T>(o[2 * dp], pa, b);
                mma16816<T>(o[2 * dp + 1], pa, b + 2);
            }
        }
    }
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float i0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, i1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
        const size_t col = (size_t)h * D + dt * 8 + 2 * t4;
        if (r0 < n) *(u32*)(out + (size_t)(q_off + r0) * qw + col) = pack2<T>(o[dt][0] * i0, o[dt][1] * i0);
        if (r1 < n) *(u32*)(out + (size_t)(q_off + r1) * qw + col) = pack2<T>(o[dt][2] * i1, o[dt][3] * i1);
    }
}

template <typename T, int D>
__device__ __forceinline__ void paged_decode_impl(
    const T* __restrict__ q, const T* __restrict__ kv, T* __restrict__ out,
    float* __restrict__ ws_acc, float* __restrict__ ws_ml, const u32* __restrict__ seqs,
    const u32* __restrict__ tables, u32 num_heads, u32 kv_heads, u32 num_layers,
    u32 block_size, u32 layer, float scale_log2, u32 window, u32 num_splits, u32 part) {
    constexpr int E = D / 8;   // elements per lane when 8 lanes share a key
    __shared__ float qs[MAX_G][E][8];
    __shared__ float logits[MAX_G][DEC_PART];
    __shared__ float red[DEC_WARPS][MAX_G][D];
    __shared__ float stat[MAX_G][2];

    const u32 si = blockIdx.x, kh = blockIdx.y, split = blockIdx.z;
    const u32 G = num_heads / kv_heads;
    const u32 q_row = seqs[4 * si], ctx = seqs[4 * si + 1], tstart = seqs[4 * si + 2];
    const u32 lo = (window > 0 && ctx > window) ? ctx - window : 0;
    const u32 kb = lo + split * part;
    const u32 ke = min(ctx, kb + part);
    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t qw = (size_t)num_heads * D, kvw = (size_t)kv_heads * D;
    const size_t ws = ((size_t)si * num_heads + (size_t)kh * G) * num_splits + split;

    if (kb >= ke) {  // an empty split (shorter context than the longest in the batch)
        if (num_splits > 1) {
            for (u32 i = threadIdx.x; i < G; i += blockDim.x) {
                ws_ml[2 * (ws + (size_t)i * num_splits)] = NEG_INF;
                ws_ml[2 * (ws + (size_t)i * num_splits) + 1] = 0.0f;
            }
        }
        return;
    }
    for (u32 i = threadIdx.x; i < G * D; i += blockDim.x) {
        const u32 gi = i / D, d = i % D;
        qs[gi][d % E][d / E] = to_f(q[(size_t)q_row * qw + (size_t)(kh * G + gi) * D + d]);
    }
    __syncthreads();

    // Scores: 8 lanes per key, 4 keys per warp per pass, U passes' loads issued together.
    constexpr int U = E >= 16 ? 2 : 4;
    const u32 grp = lane >> 3, sub = lane & 7;
    for (u32 base = kb; base < ke; base += DEC_WARPS * 4 * U) {
        float kf[U][E];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const u32 j = base + (u * DEC_WARPS + warp) * 4 + grp;
            if (j < ke) {
                const size_t blk = tables[tstart + j / block_size];
                const size_t row = (blk * num_layers + layer) * 2 * block_size + j % block_size;
                load_f<T, E>(kv + row * kvw + (size_t)kh * D + sub * E, kf[u]);
            } else {
#pragma unroll
                for (int e = 0; e < E; ++e) kf[u][e] = 0.0f;
            }
        }
        for (u32 gi = 0; gi < G; ++gi) {
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const u32 j = base + (u * DEC_WARPS + warp) * 4 + grp;
                float dot = 0.0f;
#pragma unroll
                for (int e = 0; e < E; ++e) dot += qs[gi][e][sub] * kf[u][e];
                dot += __shfl_xor_sync(0xffffffffu, dot, 1);
                dot += __shfl_xor_sync(0xffffffffu, dot, 2);
                dot += __shfl_xor_sync(0xffffffffu, dot, 4);
                if (j < ke && sub == 0) logits[gi][j - kb] = dot * scale_log2;
            }
        }
    }
    __syncthreads();

    // Softmax statistics of this split, one warp per head.
    const u32 nk = ke - kb;
    for (u32 gi = warp; gi < G; gi += DEC_WARPS) {
        float mx = NEG_INF;
        for (u32 i = lane; i < nk; i += 32) mx = fmaxf(mx, logits[gi][i]);
        mx = warp_max(mx);
        float sum = 0.0f;
        for (u32 i = lane; i < nk; i += 32) {
            const float p = exp2f(logits[gi][i] - mx);
            logits[gi][i] = p;
            sum += p;
        }
        sum = warp_sum(sum);
        if (lane == 0) {
            stat[gi][0] = mx;
            stat[gi][1] = sum;
        }
    }
    __syncthreads();

    // Values: L = D / 8 lanes per key (16 bytes each), 32 / L keys per warp per pass, UV
    // passes' loads issued together; then the key slots of a warp are summed by shuffles.
    constexpr int L = D / 8;
    constexpr int UV = 4;
    const u32 slot = lane / L, piece = lane % L;
    float acc[MAX_G][8];
#pragma unroll
    for (int gi = 0; gi < MAX_G; ++gi)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[gi][e] = 0.0f;
    for (u32 base = kb; base < ke; base += DEC_WARPS * (32 / L) * UV) {
        float vf[UV][8];
#pragma unroll
        for (int u = 0; u < UV; ++u) {
            const u32 j = base + (u * DEC_WARPS + warp) * (32 / L) + slot;
            if (j < ke) {
                const size_t blk = tables[tstart + j / block_size];
                const size_t row =
                    (blk * num_layers + layer) * 2 * block_size + block_size + j % block_size;
                load_f<T, 8>(kv + row * kvw + (size_t)kh * D + piece * 8, vf[u]);
            }
        }
#pragma unroll
        for (int u = 0; u < UV; ++u) {
            const u32 j = base + (u * DEC_WARPS + warp) * (32 / L) + slot;
            if (j < ke) {
#pragma unroll
                for (int gi = 0; gi < MAX_G; ++gi) {
                    if (gi < (int)G) {
                        const float p = logits[gi][j - kb];
#pragma unroll
                        for (int e = 0; e < 8; ++e) acc[gi][e] += p * vf[u][e];
                    }
                }
            }
        }
    }
#pragma unroll
    for (int gi = 0; gi < MAX_G; ++gi) {
        if (gi < (int)G) {
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                float v = acc[gi][e];
                for (int o = L; o < 32; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
                if (slot == 0) red[warp][gi][piece * 8 + e] = v;
            }
        }
    }
    __syncthreads();
    for (u32 i = threadIdx.x; i < G * D; i += blockDim.x) {
        const u32 gi = i / D, d = i % D;
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; ++w) v += red[w][gi][d];
        if (num_splits == 1) {
            out[(size_t)q_row * qw + (size_t)(kh * G + gi) * D + d] = from_f<T>(v / stat[gi][1]);
        } else {
            const size_t at = ws + (size_t)gi * num_splits;
            ws_acc[at * D + d] = v;
            if (d == 0) {
                ws_ml[2 * at] = stat[gi][0];
                ws_ml[2 * at + 1] = stat[gi][1];
            }
        }
    }
}

// Merges the splits of paged_decode: grid (sequences, heads), D threads.
template <typename T, int D>
__device__ __forceinline__ void decode_reduce_impl(
    const float* __restrict__ ws_acc, const float* __restrict__ ws_ml, T* __restrict__ out,
    const u32* __restrict__ seqs, u32 num_heads, u32 num_splits) {
    const u32 si = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
    const size_t at = ((size_t)si * num_heads + h) * num_splits;
    float mx = NEG_INF;
    for (u32 s = 0; s < num_splits; ++s) mx = fmaxf(mx, ws_ml[2 * (at + s)]);
    float l = 0.0f, v = 0.0f;
    // Only the splits that hold keys (sum > 0: a split with keys has at least exp2(0) = 1);
    // an empty one (a shorter context than the longest of the step) reads no accumulator.
    for (u32 s = 0; s < num_splits; ++s) {
        const float sum = ws_ml[2 * (at + s) + 1];
        if (sum > 0.0f) {
            const float w = exp2f(ws_ml[2 * (at + s)] - mx);
            l += w * sum;
            v += w * ws_acc[(at + s) * D + d];
        }
    }
    const u32 q_row = seqs[4 * si];
    out[(size_t)q_row * num_heads * D + (size_t)h * D + d] = from_f<T>(l > 0.0f ? v / l : 0.0f);
}

#define ATTENTION(T, NAME, D)                                                                  \
    extern "C" __global__ void __launch_bounds__(PF_THREADS) paged_prefill_##NAME##_d##D(            \
        const T* q, const T* kv, T* out, const u32* tiles, const u32* seqs, const u32* tables, \
        u32 num_heads, u32 kv_heads, u32 num_layers, u32 block_size, u32 layer,               \
        float scale_log2, u32 window) {                                                        \
        paged_prefill_impl<T, D>(q, kv, out, tiles, seqs, tables, num_heads, kv_heads,         \
                                 num_layers, block_size, layer, scale_log2, window);          \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(128) paged_decode_##NAME##_d##D(             \
        const T* q, const T* kv, T* out, float* ws_acc, float* ws_ml, const u32* seqs,        \
        const u32* tables, u32 num_heads, u32 kv_heads, u32 num_layers, u32 block_size,       \
        u32 layer, float scale_log2, u32 window, u32 num_splits, u32 part) {                   \
        paged_decode_impl<T, D>(q, kv, out, ws_acc, ws_ml, seqs, tables, num_heads, kv_heads,  \
                                num_layers, block_size, layer, scale_log2, window,            \
                                num_splits, part);                                             \
    }                                                                                          \
    extern "C" __global__ void decode_reduce_##NAME##_d##D(                                    \
        const float* ws_acc, const float* ws_ml, T* out, const u32* seqs, u32 num_heads,      \
        u32 num_splits) {                                                                      \
        decode_reduce_impl<T, D>(ws_acc, ws_ml, out, seqs, num_heads, num_splits);             \
    }

ATTENTION(bf16_t, bf16, 32)
ATTENTION(bf16_t, bf16, 64)
ATTENTION(bf16_t, bf16, 128)
ATTENTION(f16_t, f16, 32)
ATTENTION(f16_t, f16, 64)
ATTENTION(f16_t, f16, 128)
