// Paged prefill attention over the block-first KV arena (layout and exp2 scores as in
// attention.cu's header).
//
// paged_prefill: a tiled FlashAttention-2 kernel on tensor cores (mma.m16n8k16, f32
//   accumulate) for chunks of queries at positions pos..end over keys 0..end, causal (and a
//   sliding window if window > 0). CTA = 64 queries x one head, 4 warps of 16 query rows;
//   key tiles of 64 copied into shared memory by cp.async (a tile's V while its scores are
//   computed, the next tile's K while its values are summed), fragments read by ldmatrix
//   (V through .trans, so it is stored as it is in the arena); online softmax in registers.
//
// The kernel is bound by instruction issue, not by the tensor cores, unless the work beside
// the MMAs is kept small: each thread finds the arena rows of its keys once per tile (K and V
// of a key are block_size rows apart), one tile ahead, so the block-table reads are in flight
// while the tile's scores are computed; only the tiles that cross the diagonal (or a sliding
// window) are masked; the softmax scale is folded into one FMA before ex2.approx.

#define PF_M 64
#define PF_N 64
#define PF_THREADS 128  // 4 warps of 16 query rows

// 2^x by the special-function unit, subnormals flushed (exp2f adds a range fix-up around it);
// 2^-inf = 0.
__device__ __forceinline__ float pf_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

template <typename T, int D>
__device__ __forceinline__ void paged_prefill_impl(
    const T* __restrict__ q, const T* __restrict__ kv, T* __restrict__ out,
    const u32* __restrict__ tiles, const u32* __restrict__ seqs, const u32* __restrict__ tables,
    u32 num_heads, u32 kv_heads, u32 num_layers, u32 block_size, u32 layer, float scale_log2,
    u32 window) {
    constexpr int P = D + 8;    // row pitch in elements (16 bytes of padding: ldmatrix reads
                                // 8 rows without a bank conflict)
    constexpr int CPR = D / 8;  // 16-byte chunks per row
    constexpr int CPT = PF_N * CPR / PF_THREADS;  // chunks a thread copies per tile
    constexpr int KSTEP = PF_THREADS / CPR;       // keys between a thread's chunks
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

    // This thread copies chunk `my_c` of keys k0 + my_key + i * KSTEP (i < CPT) of every tile.
    // Their arena rows (K; V is block_size rows further) come from the block table; a key past
    // the tile's last query is not read (its chunk is zero-filled).
    const u32 my_key = threadIdx.x / CPR, my_c = (threadIdx.x % CPR) * 8;
    const T* kv_base = kv + (size_t)kh * D + my_c;
    const bool pow2 = (block_size & (block_size - 1)) == 0;
    const u32 bs_shift = __ffs(block_size) - 1;
    auto rows_of = [&](u32 k0, u32* rows) {
#pragma unroll
        for (int i = 0; i < CPT; ++i) {
            const u32 j = min(k0 + my_key + i * KSTEP, p_hi);
            const u32 b = pow2 ? j >> bs_shift : j / block_size;
            rows[i] = (tables[tstart + b] * num_layers + layer) * 2 * block_size + (j - b * block_size);
        }
    };
    auto issue = [&](u32 k0, const u32* rows, u32 v) {
        u16* dst = (v ? &Vs[0][0] : &Ks[0][0]) + my_key * P + my_c;
        const u32 voff = v ? block_size : 0;
#pragma unroll
        for (int i = 0; i < CPT; ++i) {
            const bool in = k0 + my_key + i * KSTEP <= p_hi;
            cp_async16(smem_addr(dst + i * KSTEP * P), kv_base + (size_t)(rows[i] + voff) * kvw,
                       in ? 16 : 0);
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
    u32 rows[CPT], next[CPT];
    rows_of(k_first, rows);
    issue(k_first, rows, 0);
    for (u32 k0 = k_first; k0 <= p_hi; k0 += PF_N) {
        const bool more = k0 + PF_N <= p_hi;
        if (more) rows_of(k0 + PF_N, next);
        cp_async_wait<0>();
        __syncthreads();  // K landed for all; every warp is done with the previous V
        issue(k0, rows, 1);

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
        // Only a tile with a key after the tile's first query (the diagonal, and keys past
        // the chunk) or a sliding window has scores to hide.
        if (window > 0 || k0 + PF_N - 1 > p_lo) {
#pragma unroll
            for (int nt = 0; nt < PF_N / 8; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const u32 j = k0 + nt * 8 + 2 * t4 + (e & 1);
                    const u32 p = e < 2 ? p0 : p1;
                    const bool ok = j <= p && j <= p_hi && (window == 0 || j + window > p);
                    if (!ok) sc[nt][e] = NEG_INF;
                }
            }
        }
        float mx0 = NEG_INF, mx1 = NEG_INF;
#pragma unroll
        for (int nt = 0; nt < PF_N / 8; ++nt) {
            mx0 = fmaxf(mx0, fmaxf(sc[nt][0], sc[nt][1]));
            mx1 = fmaxf(mx1, fmaxf(sc[nt][2], sc[nt][3]));
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        // Maxima in the scaled (log2) domain; the scale is positive, so it commutes with max.
        const float n0 = fmaxf(m0, mx0 * scale_log2), n1 = fmaxf(m1, mx1 * scale_log2);
        const float b0 = n0 == NEG_INF ? 0.0f : n0, b1 = n1 == NEG_INF ? 0.0f : n1;
        const float a0 = pf_exp2(m0 - b0), a1 = pf_exp2(m1 - b1);
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
            sc[nt][0] = pf_exp2(fmaf(sc[nt][0], scale_log2, -b0));
            sc[nt][1] = pf_exp2(fmaf(sc[nt][1], scale_log2, -b0));
            sc[nt][2] = pf_exp2(fmaf(sc[nt][2], scale_log2, -b1));
            sc[nt][3] = pf_exp2(fmaf(sc[nt][3], scale_log2, -b1));
            l0 += sc[nt][0] + sc[nt][1];
            l1 += sc[nt][2] + sc[nt][3];
        }

        cp_async_wait<0>();
        __syncthreads();  // V landed for all; every warp is done with K
        if (more) {
#pragma unroll
            for (int i = 0; i < CPT; ++i) rows[i] = next[i];
            issue(k0 + PF_N, rows, 0);
        }
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
#define PREFILL(T, NAME, D)                                                                    \
    extern "C" __global__ void __launch_bounds__(PF_THREADS) paged_prefill_##NAME##_d##D(     \
        const T* q, const T* kv, T* out, const u32* tiles, const u32* seqs, const u32* tables, \
        u32 num_heads, u32 kv_heads, u32 num_layers, u32 block_size, u32 layer,               \
        float scale_log2, u32 window) {                                                        \
        paged_prefill_impl<T, D>(q, kv, out, tiles, seqs, tables, num_heads, kv_heads,         \
                                 num_layers, block_size, layer, scale_log2, window);          \
    }

PREFILL(bf16_t, bf16, 32)
PREFILL(bf16_t, bf16, 64)
PREFILL(bf16_t, bf16, 128)
PREFILL(f16_t, f16, 32)
PREFILL(f16_t, f16, 64)
PREFILL(f16_t, f16, 128)
