// Paged prefill attention for long chunks (prefill.cu's kernel, wider CTAs; layout and exp2
// scores as in attention.cu's header; pf_exp2 from prefill.cu, compiled before it).
//
// paged_prefill_wide: the same tiled FlashAttention-2 computation in CTAs of PFW_M queries x
//   one head: PFW_WARPS warps of PFW_MT 16-row m-tiles each (4 x 2: 128 queries,
//   FlashAttention-2's shape on Hopper). The CTA's queries and key tiles of PFW_N are copied
//   into shared memory by cp.async (a tile's V while its scores are computed, the next tile's
//   K while its values are summed), fragments read by ldmatrix; online softmax in registers.
//   Each K and V fragment read from shared memory feeds PFW_MT MMAs, and each key tile copied
//   from the arena serves PFW_M queries: 1.12x prefill.cu's rate on chunks of 16,384 queries
//   (H100). But a CTA walks all its chunk's keys with twice the queries, so a small chunk deep
//   in a context (a few CTAs per head, the GPU not full) takes about twice prefill.cu's time:
//   the host runs this kernel only for steps with a chunk of PREFILL_WIDE_MIN_TOKENS or more
//   (kernels/src/attention_plan.rs).
//
// As in prefill.cu, each thread finds the arena rows of its keys once per tile, one tile ahead;
// only the tiles that cross a warp's diagonal (or a sliding window) are masked, and a warp
// skips the tiles wholly after its last query.
//
// Shared memory is dynamic: (PFW_M + 2 * PFW_N) rows of head_dim + 8 elements (52,224 bytes at
// head_dim 128), which the host sets as the function's limit (prefill_wide_shared_bytes; the
// defaults below are PREFILL_WIDE_TILE, PREFILL_THREADS and PREFILL_WIDE_KEY_TILE there).

#ifndef PFW_WARPS
#define PFW_WARPS 4
#endif
#ifndef PFW_MT
#define PFW_MT 2
#endif
#ifndef PFW_N
#define PFW_N 32
#endif
#ifndef PFW_MIN_CTAS
#define PFW_MIN_CTAS 2  // CTAs resident per SM the registers are budgeted for
#endif
#define PFW_M (PFW_WARPS * 16 * PFW_MT)
#define PFW_THREADS (PFW_WARPS * 32)

template <typename T, int D>
__device__ __forceinline__ void paged_prefill_wide_impl(
    const T* __restrict__ q, const T* __restrict__ kv, T* __restrict__ out,
    const u32* __restrict__ tiles, const u32* __restrict__ seqs, const u32* __restrict__ tables,
    u32 num_heads, u32 kv_heads, u32 num_layers, u32 block_size, u32 layer, float scale_log2,
    u32 window) {
    constexpr int P = D + 8;    // row pitch in elements (16 bytes of padding: ldmatrix reads
                                // 8 rows without a bank conflict)
    constexpr int CPR = D / 8;  // 16-byte chunks per row
    constexpr int CPT = PFW_N * CPR / PFW_THREADS;  // chunks a thread copies per key tile
    constexpr int QPT = PFW_M * CPR / PFW_THREADS;  // chunks a thread copies of the queries
    constexpr int KSTEP = PFW_THREADS / CPR;       // rows between a thread's chunks
    static_assert(PFW_THREADS % CPR == 0 && CPT >= 1, "a key tile splits evenly over threads");
    extern __shared__ __align__(16) u16 pfw_smem[];
    u16(*Qs)[P] = reinterpret_cast<u16(*)[P]>(pfw_smem);
    u16(*Ks)[P] = reinterpret_cast<u16(*)[P]>(pfw_smem + PFW_M * P);
    u16(*Vs)[P] = reinterpret_cast<u16(*)[P]>(pfw_smem + (PFW_M + PFW_N) * P);

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
    const u32 wrow = warp * 16 * PFW_MT;  // the warp's first row in the CTA

    const u32 p_lo = pos + q0;
    const u32 p_hi = pos + min(q0 + PFW_M, n) - 1;
    const u32 k_lo = (window > 0 && p_lo + 1 > window) ? p_lo + 1 - window : 0;
    // The warp's first and last query (a warp wholly past the chunk has p_hi_w < p_lo_w).
    const u32 p_lo_w = p_lo + wrow, p_hi_w = min(p_lo_w + 16 * PFW_MT - 1, p_hi);

    // This thread copies chunk `my_c` of rows my_row + i * KSTEP: of the queries once, of
    // keys k0 + my_row + i * KSTEP (i < CPT) of every tile. The keys' arena rows (K; V is
    // block_size rows further) come from the block table; a key past the tile's last query is
    // not read (its chunk is zero-filled); a query row past the chunk reads the last one.
    const u32 my_row = threadIdx.x / CPR, my_c = (threadIdx.x % CPR) * 8;
    {
        const T* q_h = q + (size_t)h * D + my_c;
#pragma unroll
        for (int i = 0; i < QPT; ++i) {
            const u32 r = my_row + i * KSTEP;
            cp_async16(smem_addr(&Qs[r][my_c]), q_h + (size_t)(q_off + min(q0 + r, n - 1)) * qw, 16);
        }
    }
    const T* kv_base = kv + (size_t)kh * D + my_c;
    const bool pow2 = (block_size & (block_size - 1)) == 0;
    const u32 bs_shift = __ffs(block_size) - 1;
    auto rows_of = [&](u32 k0, u32* rows) {
#pragma unroll
        for (int i = 0; i < CPT; ++i) {
            const u32 j = min(k0 + my_row + i * KSTEP, p_hi);
            const u32 b = pow2 ? j >> bs_shift : j / block_size;
            rows[i] = (tables[tstart + b] * num_layers + layer) * 2 * block_size + (j - b * block_size);
        }
    };
    auto issue = [&](u32 k0, const u32* rows, u32 v) {
        u16* dst = (v ? &Vs[0][0] : &Ks[0][0]) + my_row * P + my_c;
        const u32 voff = v ? block_size : 0;
#pragma unroll
        for (int i = 0; i < CPT; ++i) {
            const bool in = k0 + my_row + i * KSTEP <= p_hi;
            cp_async16(smem_addr(dst + i * KSTEP * P), kv_base + (size_t)(rows[i] + voff) * kvw,
                       in ? 16 : 0);
        }
        cp_async_commit();
    };
    // ldmatrix lane roles: matrix mi = lane / 8, its row lane % 8. Q: matrices (rows 0-7,
    // dims lo), (rows 8-15, lo), (rows 0-7, hi), (rows 8-15, hi) of a 16 x 16 step: an A
    // fragment. K: (keys 0-7, dims lo), (keys 0-7, hi), (keys 8-15, lo), (keys 8-15, hi):
    // the B fragments of two 8-key score columns. V (transposed): (keys 0-7, dims lo), (keys
    // 8-15, lo), (keys 0-7, hi), (keys 8-15, hi): the B fragments of two 8-dim output columns.
    const u32 mi = lane >> 3, mr = lane & 7;
    const u32 qaddr = smem_addr(&Qs[wrow + (mi & 1) * 8 + mr][(mi >> 1) * 8]);
    const u32 kaddr = smem_addr(&Ks[(mi >> 1) * 8 + mr][(mi & 1) * 8]);
    const u32 vaddr = smem_addr(&Vs[(mi & 1) * 8 + mr][(mi >> 1) * 8]);

    float o[PFW_MT][D / 8][4];
    float m[PFW_MT][2], l[PFW_MT][2];
#pragma unroll
    for (int mt = 0; mt < PFW_MT; ++mt) {
#pragma unroll
        for (int i = 0; i < D / 8; ++i) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.0f;
        m[mt][0] = m[mt][1] = NEG_INF;
        l[mt][0] = l[mt][1] = 0.0f;
    }

    // K of the next tile loads during this tile's P V, V of this tile during its Q K^T.
    const u32 k_first = (k_lo / PFW_N) * PFW_N;
    u32 rows[CPT], next[CPT];
    rows_of(k_first, rows);
    issue(k_first, rows, 0);  // commits the queries' copies with the first K
    for (u32 k0 = k_first; k0 <= p_hi; k0 += PFW_N) {
        const bool more = k0 + PFW_N <= p_hi;
        // The warp has a query at or after the tile's first key (and, with a window, before
        // its last key plus the window): else every score of the tile is hidden from it.
        const bool live = k0 <= p_hi_w && (window == 0 || k0 + PFW_N - 1 + window > p_lo_w);
        if (more) rows_of(k0 + PFW_N, next);
        cp_async_wait<0>();
        __syncthreads();  // K landed for all; every warp is done with the previous V
        issue(k0, rows, 1);

        float sc[PFW_MT][PFW_N / 8][4];
        if (live) {
#pragma unroll
            for (int mt = 0; mt < PFW_MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < PFW_N / 8; ++nt)
                    sc[mt][nt][0] = sc[mt][nt][1] = sc[mt][nt][2] = sc[mt][nt][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                u32 qa[PFW_MT][4];
#pragma unroll
                for (int mt = 0; mt < PFW_MT; ++mt) ldsm_x4(qa[mt], qaddr + (mt * 16 * P + kk * 16) * 2);
#pragma unroll
                for (int np = 0; np < PFW_N / 16; ++np) {
                    u32 b[4];
                    ldsm_x4(b, kaddr + (np * 16 * P + kk * 16) * 2);
#pragma unroll
                    for (int mt = 0; mt < PFW_MT; ++mt) {
                        mma16816<T>(sc[mt][2 * np], qa[mt], b);
                        mma16816<T>(sc[mt][2 * np + 1], qa[mt], b + 2);
                    }
                }
            }
            // Only a tile with a key after the warp's first query (the diagonal, and keys
            // past the chunk) or a sliding window has scores to hide.
            if (window > 0 || k0 + PFW_N - 1 > p_lo_w) {
#pragma unroll
                for (int mt = 0; mt < PFW_MT; ++mt) {
                    const u32 p0 = p_lo_w + mt * 16 + g, p1 = p0 + 8;
#pragma unroll
                    for (int nt = 0; nt < PFW_N / 8; ++nt) {
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            const u32 j = k0 + nt * 8 + 2 * t4 + (e & 1);
                            const u32 p = e < 2 ? p0 : p1;
                            const bool ok = j <= p && j <= p_hi && (window == 0 || j + window > p);
                            if (!ok) sc[mt][nt][e] = NEG_INF;
                        }
                    }
                }
            }
#pragma unroll
            for (int mt = 0; mt < PFW_MT; ++mt) {
                float mx0 = NEG_INF, mx1 = NEG_INF;
#pragma unroll
                for (int nt = 0; nt < PFW_N / 8; ++nt) {
                    mx0 = fmaxf(mx0, fmaxf(sc[mt][nt][0], sc[mt][nt][1]));
                    mx1 = fmaxf(mx1, fmaxf(sc[mt][nt][2], sc[mt][nt][3]));
                }
                mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
                mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
                mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
                mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
                // Maxima in the scaled (log2) domain; the scale is positive, so it commutes
                // with max.
                const float n0 = fmaxf(m[mt][0], mx0 * scale_log2);
                const float n1 = fmaxf(m[mt][1], mx1 * scale_log2);
                const float b0 = n0 == NEG_INF ? 0.0f : n0, b1 = n1 == NEG_INF ? 0.0f : n1;
                const float a0 = pf_exp2(m[mt][0] - b0), a1 = pf_exp2(m[mt][1] - b1);
                m[mt][0] = n0;
                m[mt][1] = n1;
                l[mt][0] *= a0;
                l[mt][1] *= a1;
#pragma unroll
                for (int dt = 0; dt < D / 8; ++dt) {
                    o[mt][dt][0] *= a0;
                    o[mt][dt][1] *= a0;
                    o[mt][dt][2] *= a1;
                    o[mt][dt][3] *= a1;
                }
#pragma unroll
                for (int nt = 0; nt < PFW_N / 8; ++nt) {
                    sc[mt][nt][0] = pf_exp2(fmaf(sc[mt][nt][0], scale_log2, -b0));
                    sc[mt][nt][1] = pf_exp2(fmaf(sc[mt][nt][1], scale_log2, -b0));
                    sc[mt][nt][2] = pf_exp2(fmaf(sc[mt][nt][2], scale_log2, -b1));
                    sc[mt][nt][3] = pf_exp2(fmaf(sc[mt][nt][3], scale_log2, -b1));
                    l[mt][0] += sc[mt][nt][0] + sc[mt][nt][1];
                    l[mt][1] += sc[mt][nt][2] + sc[mt][nt][3];
                }
            }
        }

        cp_async_wait<0>();
        __syncthreads();  // V landed for all; every warp is done with K
        if (more) {
#pragma unroll
            for (int i = 0; i < CPT; ++i) rows[i] = next[i];
            issue(k0 + PFW_N, rows, 0);
        }
        if (live) {
#pragma unroll
            for (int kt = 0; kt < PFW_N / 16; ++kt) {
                u32 pa[PFW_MT][4];
#pragma unroll
                for (int mt = 0; mt < PFW_MT; ++mt) {
                    pa[mt][0] = pack2<T>(sc[mt][2 * kt][0], sc[mt][2 * kt][1]);
                    pa[mt][1] = pack2<T>(sc[mt][2 * kt][2], sc[mt][2 * kt][3]);
                    pa[mt][2] = pack2<T>(sc[mt][2 * kt + 1][0], sc[mt][2 * kt + 1][1]);
                    pa[mt][3] = pack2<T>(sc[mt][2 * kt + 1][2], sc[mt][2 * kt + 1][3]);
                }
#pragma unroll
                for (int dp = 0; dp < D / 16; ++dp) {
                    u32 b[4];
                    ldsm_x4_t(b, vaddr + (kt * 16 * P + dp * 16) * 2);
#pragma unroll
                    for (int mt = 0; mt < PFW_MT; ++mt) {
                        mma16816<T>(o[mt][2 * dp], pa[mt], b);
                        mma16816<T>(o[mt][2 * dp + 1], pa[mt], b + 2);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int mt = 0; mt < PFW_MT; ++mt) {
        float l0 = l[mt][0], l1 = l[mt][1];
        l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
        l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
        const float i0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, i1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
        const u32 r0 = q0 + wrow + mt * 16 + g, r1 = r0 + 8;
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
            const size_t col = (size_t)h * D + dt * 8 + 2 * t4;
            if (r0 < n) *(u32*)(out + (size_t)(q_off + r0) * qw + col) = pack2<T>(o[mt][dt][0] * i0, o[mt][dt][1] * i0);
            if (r1 < n) *(u32*)(out + (size_t)(q_off + r1) * qw + col) = pack2<T>(o[mt][dt][2] * i1, o[mt][dt][3] * i1);
        }
    }
}
#define PREFILL_WIDE(T, NAME, D)                                                               \
    extern "C" __global__ void __launch_bounds__(PFW_THREADS, PFW_MIN_CTAS)                   \
        paged_prefill_wide_##NAME##_d##D(const T* q, const T* kv, T* out, const u32* tiles,   \
                                         const u32* seqs, const u32* tables, u32 num_heads,    \
                                         u32 kv_heads, u32 num_layers, u32 block_size,         \
                                         u32 layer, float scale_log2, u32 window) {            \
        paged_prefill_wide_impl<T, D>(q, kv, out, tiles, seqs, tables, num_heads, kv_heads,    \
                                      num_layers, block_size, layer, scale_log2, window);      \
    }

PREFILL_WIDE(bf16_t, bf16, 32)
PREFILL_WIDE(bf16_t, bf16, 64)
PREFILL_WIDE(bf16_t, bf16, 128)
PREFILL_WIDE(f16_t, f16, 32)
PREFILL_WIDE(f16_t, f16, 64)
PREFILL_WIDE(f16_t, f16, 128)
