// Paged decode attention in one pass (flash-decoding with online softmax), for the arena and
// the split plan of attention.cu's paged_decode (same arguments, same workspace convention, so
// decode_reduce merges its splits).
//
// CTA = (sequence, kv head, split of `part` keys), 128 threads. R = D / 8 threads own one key
// row (16 bytes each), so the CTA is NG = 128 / R groups; group g takes keys kb + g, kb + g +
// NG, ... in tiles of TK = 4 keys (8 measured slower: more registers, fewer CTAs per SM). Two tiles live in registers: the next tile's K and V loads
// (2 TK 16-byte loads per thread) are in flight while the current one is scored; the split's
// block rows sit in shared memory, so no load waits on a table lookup. Each of the kv head's
// G query heads scores the tile (a dot of 8 elements per thread, summed over the R threads of
// the row by shuffles), updates its running max and sum once per tile and accumulates the
// weighted V rows. The groups' states are merged by shuffles inside a warp and through shared
// memory across warps. G is a template parameter, so queries and accumulators stay in
// registers.

#define DEC2_THREADS 128
// Most blocks of a split whose rows are staged in shared memory (more: read from the table).
#define DEC2_TABLE 64

// The keys [kb, ke) of split `split` of decode sequence `si` (entry `[q_row, context,
// table_start, part]`; `part` 0, a CUDA graph's fixed grid: the keys per split of the
// sequence's entry (the eager plan's for this step, so a short sequence uses its own few
// splits and the CTAs past them exit at once), but never fewer than num_splits parts can
// cover; an entry of 0: the sequence's keys in num_splits equal parts). A split without keys
// (a shorter context than the longest in the batch) writes its empty state (split workspace:
// max -inf, sum 0; one split, a graph bucket's padding row: zeros at `out_heads`) and
// returns false.
template <typename T, int D>
__device__ __forceinline__ bool decode_split_keys(
    const u32* __restrict__ seqs, u32 si, u32 split, u32 window, u32 num_splits, u32 part,
    u32 G, u32 threads, T* __restrict__ out_heads, float* __restrict__ ws_ml, size_t ws,
    u32& kb, u32& ke) {
    const u32 ctx = seqs[4 * si + 1];
    const u32 lo = (window > 0 && ctx > window) ? ctx - window : 0;
    if (part == 0)
        part = max(seqs[4 * si + 3],
                   max(32u, ((ctx - lo + num_splits - 1) / num_splits + 31) / 32 * 32));
    kb = lo + split * part;
    ke = min(ctx, kb + part);
    if (kb < ke) return true;
    const u32 tid = threadIdx.x;
    if (num_splits > 1 && tid < G) {
        ws_ml[2 * (ws + (size_t)tid * num_splits)] = NEG_INF;
        ws_ml[2 * (ws + (size_t)tid * num_splits) + 1] = 0.0f;
    } else if (num_splits == 1) {
        for (u32 i = tid; i < G * D; i += threads) out_heads[i] = from_f<T>(0.0f);
    }
    return false;
}

// Merges the per-warp states of a decode CTA (warp w, head g: max red_m[w * GM + g], sum
// red_l[w * GM + g], accumulators red_acc[(w * GM + g) * D ..]) and writes the result: the
// G heads' rows at `out_heads` when there is one split, else the split workspace at `ws`
// (decode_reduce's layout). Thread i of `threads` owns element i % D of head i / D.
template <typename T, int D, int NW>
__device__ __forceinline__ void decode_write_merged(
    const float* red_acc, const float* red_m, const float* red_l, u32 GM, u32 G, u32 threads,
    T* __restrict__ out_heads, float* __restrict__ ws_acc, float* __restrict__ ws_ml, size_t ws,
    u32 num_splits) {
    for (u32 i = threadIdx.x; i < G * D; i += threads) {
        const u32 g = i / D, d = i % D;
        float mx = NEG_INF;
#pragma unroll
        for (int w = 0; w < NW; ++w) mx = fmaxf(mx, red_m[w * GM + g]);
        float sum = 0.0f, v = 0.0f;
#pragma unroll
        for (int w = 0; w < NW; ++w) {
            const float m = red_m[w * GM + g];
            const float a = m == NEG_INF ? 0.0f : exp2f(m - mx);
            sum += a * red_l[w * GM + g];
            v += a * red_acc[(size_t)(w * GM + g) * D + d];
        }
        if (num_splits == 1) {
            out_heads[(size_t)g * D + d] = from_f<T>(v / sum);
        } else {
            const size_t at = ws + (size_t)g * num_splits;
            ws_acc[at * D + d] = v;
            if (d == 0) {
                ws_ml[2 * at] = mx;
                ws_ml[2 * at + 1] = sum;
            }
        }
    }
}

template <typename T, int D, int G, int TK>
__device__ __forceinline__ void paged_decode_fused_impl(
    const T* __restrict__ q, const T* __restrict__ kv, T* __restrict__ out,
    float* __restrict__ ws_acc, float* __restrict__ ws_ml, const u32* __restrict__ seqs,
    const u32* __restrict__ tables, u32 num_heads, u32 kv_heads, u32 num_layers,
    u32 block_size, u32 layer, float scale_log2, u32 window, u32 num_splits, u32 part) {
    constexpr int R = D / 8;                 // threads per key row
    constexpr int NG = DEC2_THREADS / R;     // key groups per CTA
    constexpr int NW = DEC2_THREADS / 32;    // warps
    __shared__ float red_acc[NW][G][D];
    __shared__ float red_m[NW][G];
    __shared__ float red_l[NW][G];

    const u32 si = blockIdx.x, kh = blockIdx.y, split = blockIdx.z;
    const u32 q_row = seqs[4 * si], tstart = seqs[4 * si + 2];
    const u32 tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const u32 grp = tid / R, piece = tid % R;
    const size_t qw = (size_t)num_heads * D, kvw = (size_t)kv_heads * D;
    const size_t ws = ((size_t)si * num_heads + (size_t)kh * G) * num_splits + split;
    T* const out_heads = out + (size_t)q_row * qw + (size_t)kh * G * D;
    u32 kb, ke;
    if (!decode_split_keys<T, D>(seqs, si, split, window, num_splits, part, G, DEC2_THREADS,
                                 out_heads, ws_ml, ws, kb, ke))
        return;

    // This thread's 8 elements of each query head, pre-scaled so scores are in log2 units.
    float qf[G][8];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        load_f<T, 8>(q + (size_t)q_row * qw + (size_t)(kh * G + g) * D + piece * 8, qf[g]);
#pragma unroll
        for (int e = 0; e < 8; ++e) qf[g][e] *= scale_log2;
    }
    float acc[G][8], m[G], l[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        m[g] = NEG_INF;
        l[g] = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[g][e] = 0.0f;
    }

    // The split's block rows (first K row of each block at this layer) in shared memory, so a
    // key's address costs no dependent global load.
    __shared__ u32 rows[DEC2_TABLE];
    const u32 b0 = kb / block_size, nblk = (ke - 1) / block_size - b0 + 1;
    const bool in_smem = nblk <= DEC2_TABLE;
    if (in_smem) {
        for (u32 i = tid; i < nblk; i += DEC2_THREADS)
            rows[i] = (tables[tstart + b0 + i] * num_layers + layer) * 2 * block_size;
    }
    __syncthreads();

    // Tiles are warp-uniform (every lane runs every iteration, as the shuffles need): group
    // `grp` takes key base + grp + u * NG of each tile; keys past the split score -inf and
    // load nothing. Two tiles in registers: the next one's loads are in flight while the
    // current one is scored.
    const T* kv_head = kv + (size_t)kh * D + piece * 8;
    auto fetch = [&](u32 base, uint4* kr, uint4* vr) {
#pragma unroll
        for (int u = 0; u < TK; ++u) {
            const u32 j = base + grp + u * NG;
            if (j < ke) {
                const u32 bi = j / block_size;
                const size_t row =
                    (in_smem ? (size_t)rows[bi - b0]
                             : ((size_t)tables[tstart + bi] * num_layers + layer) * 2 *
                                   block_size) +
                    j % block_size;
                kr[u] = *(const uint4*)(kv_head + row * kvw);
                vr[u] = *(const uint4*)(kv_head + (row + block_size) * kvw);
            } else {
                kr[u] = make_uint4(0, 0, 0, 0);
                vr[u] = make_uint4(0, 0, 0, 0);
            }
        }
    };
    auto consume = [&](u32 base, const uint4* kr, const uint4* vr) {
#pragma unroll
        for (int g = 0; g < G; ++g) {
            float s[TK];
            float mx = m[g];
#pragma unroll
            for (int u = 0; u < TK; ++u) {
                const T* e = (const T*)&kr[u];
                float dot = 0.0f;
#pragma unroll
                for (int i = 0; i < 8; ++i) dot += qf[g][i] * to_f(e[i]);
#pragma unroll
                for (int o = 1; o < R; o <<= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
                s[u] = base + grp + u * NG < ke ? dot : NEG_INF;
                mx = fmaxf(mx, s[u]);
            }
            // mx = -inf only while this group has seen no key: nothing to add yet.
            const bool none = mx == NEG_INF;
            const float corr = none ? 1.0f : exp2f(m[g] - mx);
            m[g] = mx;
            l[g] *= corr;
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[g][e] *= corr;
#pragma unroll
            for (int u = 0; u < TK; ++u) {
                const float p = none ? 0.0f : exp2f(s[u] - mx);
                l[g] += p;
                const T* e = (const T*)&vr[u];
#pragma unroll
                for (int i = 0; i < 8; ++i) acc[g][i] += p * to_f(e[i]);
            }
        }
    };
    constexpr u32 STEP = NG * TK;
    uint4 ka[TK], va[TK], kb2[TK], vb2[TK];
    fetch(kb, ka, va);
    for (u32 base = kb; base < ke; base += 2 * STEP) {
        fetch(base + STEP, kb2, vb2);
        consume(base, ka, va);
        fetch(base + 2 * STEP, ka, va);
        consume(base + STEP, kb2, vb2);
    }

    // Merge the key groups of a warp (lanes R apart hold the same elements).
#pragma unroll
    for (int o = R; o < 32; o <<= 1) {
#pragma unroll
        for (int g = 0; g < G; ++g) {
            const float mo = __shfl_xor_sync(0xffffffffu, m[g], o);
            const float lo_ = __shfl_xor_sync(0xffffffffu, l[g], o);
            const float mx = fmaxf(m[g], mo);
            // A group that saw no key has m = -inf and l = 0; it must weigh nothing.
            const float a = m[g] == NEG_INF ? 0.0f : exp2f(m[g] - mx);
            const float b = mo == NEG_INF ? 0.0f : exp2f(mo - mx);
            l[g] = l[g] * a + lo_ * b;
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                const float ao = __shfl_xor_sync(0xffffffffu, acc[g][e], o);
                acc[g][e] = acc[g][e] * a + ao * b;
            }
            m[g] = mx;
        }
    }
    if (lane < R) {
#pragma unroll
        for (int g = 0; g < G; ++g) {
#pragma unroll
            for (int e = 0; e < 8; ++e) red_acc[warp][g][piece * 8 + e] = acc[g][e];
            if (lane == 0) {
                red_m[warp][g] = m[g];
                red_l[warp][g] = l[g];
            }
        }
    }
    __syncthreads();
    decode_write_merged<T, D, NW>(&red_acc[0][0][0], &red_m[0][0], &red_l[0][0], G, G,
                                  DEC2_THREADS, out_heads, ws_acc, ws_ml, ws, num_splits);
}

#define DECODE_FUSED(T, NAME, D, G)                                                            \
    extern "C" __global__ void __launch_bounds__(DEC2_THREADS)                                 \
        paged_decode_fused_##NAME##_d##D##_g##G(                                               \
            const T* q, const T* kv, T* out, float* ws_acc, float* ws_ml, const u32* seqs,    \
            const u32* tables, u32 num_heads, u32 kv_heads, u32 num_layers, u32 block_size,   \
            u32 layer, float scale_log2, u32 window, u32 num_splits, u32 part) {               \
        pdl_enter();                                                                           \
        paged_decode_fused_impl<T, D, G, 4>(q, kv, out, ws_acc, ws_ml, seqs, tables,           \
                                            num_heads, kv_heads, num_layers, block_size,       \
                                            layer, scale_log2, window, num_splits, part);      \
    }

#define DECODE_FUSED_G(T, NAME, D)                                                             \
    DECODE_FUSED(T, NAME, D, 1)                                                                \
    DECODE_FUSED(T, NAME, D, 2)                                                                \
    DECODE_FUSED(T, NAME, D, 3)                                                                \
    DECODE_FUSED(T, NAME, D, 4)                                                                \
    DECODE_FUSED(T, NAME, D, 5)                                                                \
    DECODE_FUSED(T, NAME, D, 6)                                                                \
    DECODE_FUSED(T, NAME, D, 7)                                                                \
    DECODE_FUSED(T, NAME, D, 8)

DECODE_FUSED_G(bf16_t, bf16, 64)
DECODE_FUSED_G(bf16_t, bf16, 128)
DECODE_FUSED_G(f16_t, f16, 64)
DECODE_FUSED_G(f16_t, f16, 128)
