// Paged decode attention on tensor cores, fed by cp.async: same arguments, split plan and
// workspace convention as decode.cu's paged_decode_fused (decode_reduce merges its splits).
//
// CTA = (sequence, kv head, split of `part` keys), DM_WARPS warps. The split's keys go in
// tiles of 16; warp w takes tiles w, w + DM_WARPS, ... Each warp runs its own pipeline of
// DM_STAGES tiles in shared memory: the next tile's K and V rows (16 bytes a cp.async, keys
// past the split zero-filled) are in flight while the current one is used, and the bytes in
// flight cost no registers. Scores are one m16n8k16 MMA row per query head (the kv head's G
// heads are rows 0..G-1 of a 16-row A operand, the rest zeros; the MMA's spare rows cost
// nothing next to the loads): S = Q K^T over the tile (ldmatrix of K rows), an online softmax
// per row in registers, O += P V (ldmatrix.trans of V rows). Rows are padded by 16 bytes so
// ldmatrix reads no bank twice. The warps' states are merged through shared memory by
// decode.cu's decode_write_merged; the split's keys come from its decode_split_keys (this file is compiled after decode.cu, in one module).

#define DM_WARPS 2
#define DM_THREADS (DM_WARPS * 32)
#define DM_STAGES 2
#define DM_TK 16
// Most query heads per kv head (rows of the MMA's A operand that hold a query).
#define DM_MAX_G 8

template <typename T, int D>
__device__ __forceinline__ void paged_decode_mma_impl(
    const T* __restrict__ q, const T* __restrict__ kv, T* __restrict__ out,
    float* __restrict__ ws_acc, float* __restrict__ ws_ml, const u32* __restrict__ seqs,
    const u32* __restrict__ tables, u32 num_heads, u32 kv_heads, u32 num_layers,
    u32 block_size, u32 layer, float scale_log2, u32 window, u32 num_splits, u32 part) {
    constexpr int P = D + 8;       // row pitch in elements (16 bytes of padding)
    constexpr int CPR = D / 8;     // 16-byte chunks per row
    constexpr int PER_LANE = DM_TK * CPR / 32;  // chunks of K (and of V) a lane copies per tile
    constexpr int KPL = 32 / CPR;  // keys apart between a lane's chunks
    __shared__ __align__(16) u16 tile[DM_WARPS][DM_STAGES][2][DM_TK][P];
    __shared__ float red_o[DM_WARPS][DM_MAX_G][D];
    __shared__ float red_m[DM_WARPS][DM_MAX_G];
    __shared__ float red_l[DM_WARPS][DM_MAX_G];
    __shared__ u32 rows[DEC2_TABLE];

    const u32 si = blockIdx.x, kh = blockIdx.y, split = blockIdx.z;
    const u32 G = num_heads / kv_heads;
    const u32 q_row = seqs[4 * si], tstart = seqs[4 * si + 2];
    const u32 tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const u32 g = lane >> 2, t4 = lane & 3;
    const size_t qw = (size_t)num_heads * D, kvw = (size_t)kv_heads * D;
    const size_t ws = ((size_t)si * num_heads + (size_t)kh * G) * num_splits + split;
    T* const out_heads = out + (size_t)q_row * qw + (size_t)kh * G * D;
    u32 kb, ke;
    if (!decode_split_keys<T, D>(seqs, si, split, window, num_splits, part, G, DM_THREADS,
                                 out_heads, ws_ml, ws, kb, ke))
        return;

    // The split's block rows in shared memory, as decode.cu stages them (written out in each
    // kernel: through a shared function the one-pass kernel's main loop compiled differently).
    const u32 b0 = kb / block_size, nblk = (ke - 1) / block_size - b0 + 1;
    const bool in_smem = nblk <= DEC2_TABLE;
    if (in_smem) {
        for (u32 i = tid; i < nblk; i += DM_THREADS)
            rows[i] = (tables[tstart + b0 + i] * num_layers + layer) * 2 * block_size;
    }
    __syncthreads();

    const u32 ntiles = (ke - kb + DM_TK - 1) / DM_TK;
    const T* kv_head = kv + (size_t)kh * D;
    // Starts the copies of tile t into stage s: lane copies chunk (lane % CPR) of keys
    // lane / CPR + c * KPL; a key's row is found from the tile's first block by stepping.
    auto issue = [&](u32 t, int s) {
        const u32 jb = kb + t * DM_TK;
        const u32 bi0 = jb / block_size, o0 = jb % block_size;
        const u32 piece = lane % CPR;
#pragma unroll
        for (int c = 0; c < PER_LANE; ++c) {
            const u32 k = lane / CPR + c * KPL;
            const u32 j = jb + k;
            u32 o = o0 + k, bi = bi0;
            while (o >= block_size) {
                o -= block_size;
                ++bi;
            }
            const bool ok = j < ke;
            size_t row = 0;
            if (ok)
                row = (in_smem ? (size_t)rows[bi - b0]
                               : ((size_t)tables[tstart + bi] * num_layers + layer) * 2 *
                                     block_size) +
                      o;
            const T* src = kv_head + row * kvw + piece * 8;
            cp_async16(smem_addr(&tile[warp][s][0][k][piece * 8]), src, ok ? 16 : 0);
            cp_async16(smem_addr(&tile[warp][s][1][k][piece * 8]), src + block_size * kvw,
                       ok ? 16 : 0);
        }
    };

    // The query rows as A fragments (row g: head g of the group when g < G; rows 8..15 and
    // g >= G are zeros).
    u32 qa[D / 16][4];
    {
        const T* qr = q + (size_t)q_row * qw + (size_t)(kh * G + g) * D;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            qa[kk][0] = g < G ? *(const u32*)(qr + kk * 16 + 2 * t4) : 0u;
            qa[kk][1] = 0u;
            qa[kk][2] = g < G ? *(const u32*)(qr + kk * 16 + 8 + 2 * t4) : 0u;
            qa[kk][3] = 0u;
        }
    }
    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m0 = NEG_INF, l0 = 0.0f;

    // ldmatrix lane roles: matrix mi = lane / 8, its row lane % 8.
    const u32 mi = lane >> 3, mr = lane & 7;
    // K (non-transposed): matrices (keys 0-7, dims lo), (keys 0-7, dims hi), (keys 8-15, lo),
    // (keys 8-15, hi) of a 16-dim step: the B fragments of score columns 0-7 and 8-15.
    const u32 k_key = (mi >> 1) * 8 + mr, k_dim = (mi & 1) * 8;
    // V (transposed): matrices (keys 0-7, dims lo), (keys 8-15, lo), (keys 0-7, hi), (keys
    // 8-15, hi) of a 16-dim step: the B fragments of output columns lo and hi.
    const u32 v_key = (mi & 1) * 8 + mr, v_dim = (mi >> 1) * 8;

    if (warp < ntiles) issue(warp, 0);
    cp_async_commit();
    int s = 0;
    for (u32 t = warp; t < ntiles; t += DM_WARPS) {
        __syncwarp();  // every lane is done reading the stage the next copies overwrite
        if (t + DM_WARPS < ntiles) issue(t + DM_WARPS, s ^ 1);
        cp_async_commit();
        cp_async_wait<1>();  // this lane's copies of tile t have landed
        __syncwarp();        // and every other lane's

        float sc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
        const u32 kbase = smem_addr(&tile[warp][s][0][k_key][k_dim]);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            u32 b[4];
            ldsm_x4(b, kbase + kk * 32);
            mma16816<T>(sc[0], qa[kk], b);
            mma16816<T>(sc[1], qa[kk], b + 2);
        }
        const u32 jb = kb + t * DM_TK;
        float mx = NEG_INF;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const bool ok = jb + nt * 8 + 2 * t4 + e < ke;
                sc[nt][e] = ok ? sc[nt][e] * scale_log2 : NEG_INF;
                mx = fmaxf(mx, sc[nt][e]);
            }
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float n0 = fmaxf(m0, mx);
        const float base0 = n0 == NEG_INF ? 0.0f : n0;
        const float a0 = exp2f(m0 - base0);
        m0 = n0;
        l0 *= a0;
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
            o[dt][0] *= a0;
            o[dt][1] *= a0;
        }
        u32 pa[4];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
            const float p0 = exp2f(sc[nt][0] - base0), p1 = exp2f(sc[nt][1] - base0);
            l0 += p0 + p1;
            pa[2 * nt] = pack2<T>(p0, p1);
            pa[2 * nt + 1] = 0u;  // rows 8..15: no query
        }
        const u32 vbase = smem_addr(&tile[warp][s][1][v_key][v_dim]);
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
            u32 b[4];
            ldsm_x4_t(b, vbase + dp * 32);
            mma16816<T>(o[2 * dp], pa, b);
            mma16816<T>(o[2 * dp + 1], pa, b + 2);
        }
        s ^= 1;
    }
    cp_async_wait<0>();

    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    if (g < G) {
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
            red_o[warp][g][dt * 8 + 2 * t4] = o[dt][0];
            red_o[warp][g][dt * 8 + 2 * t4 + 1] = o[dt][1];
        }
        if (t4 == 0) {
            red_m[warp][g] = m0;
            red_l[warp][g] = l0;
        }
    }
    __syncthreads();
    decode_write_merged<T, D, DM_WARPS>(&red_o[0][0][0], &red_m[0][0], &red_l[0][0], DM_MAX_G,
                                        G, DM_THREADS, out_heads, ws_acc, ws_ml, ws,
                                        num_splits);
}

#define DECODE_MMA(T, NAME, D)                                                                 \
    extern "C" __global__ void __launch_bounds__(DM_THREADS) paged_decode_mma_##NAME##_d##D(   \
        const T* q, const T* kv, T* out, float* ws_acc, float* ws_ml, const u32* seqs,        \
        const u32* tables, u32 num_heads, u32 kv_heads, u32 num_layers, u32 block_size,       \
        u32 layer, float scale_log2, u32 window, u32 num_splits, u32 part) {                   \
        pdl_enter();                                                                           \
        paged_decode_mma_impl<T, D>(q, kv, out, ws_acc, ws_ml, seqs, tables, num_heads,        \
                                    kv_heads, num_layers, block_size, layer, scale_log2,       \
                                    window, num_splits, part);                                 \
    }

DECODE_MMA(bf16_t, bf16, 64)
DECODE_MMA(bf16_t, bf16, 128)
DECODE_MMA(f16_t, f16, 64)
DECODE_MMA(f16_t, f16, 128)
