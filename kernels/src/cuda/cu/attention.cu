// Paged attention over the block-first KV arena. The arena is rows of width kv_heads * D; the
// K row of token offset o of layer l in block b is ((b * num_layers + l) * 2) * block_size + o,
// its V row block_size further. Sequences address their keys through a flat table of block
// ids. Scores use exp2: scale_log2 = log2(e) / sqrt(D). The prefill kernel is in prefill.cu.
//
// paged_decode: one query per sequence, split over the context (flash-decoding): CTA =
//   (sequence, kv head, split of `part` <= DEC_PART keys; the host picks `part` so the grid
//   fills the GPU) serving the kv head's G query heads; groups of
//   8 lanes score one key, then D/8 lanes accumulate V over a key (16-byte loads, several in
//   flight per lane); partial results of several splits are merged by decode_reduce.

#define DEC_PART 256
#define DEC_WARPS 4
#define MAX_G 8

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

// Merges the splits of paged_decode: grid (sequences, heads), D threads. The splits' (max,
// sum) pairs and accumulators are loaded REDUCE_BATCH splits at a time before any is used
// (one load after another, the merge of 8 to 16 splits waited for memory 16 to 32 times).
constexpr u32 REDUCE_BATCH = 8;

template <typename T, int D>
__device__ __forceinline__ void decode_reduce_impl(
    const float* __restrict__ ws_acc, const float* __restrict__ ws_ml, T* __restrict__ out,
    const u32* __restrict__ seqs, u32 num_heads, u32 num_splits) {
    const u32 si = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
    const size_t at = ((size_t)si * num_heads + h) * num_splits;
    const float2* ml = (const float2*)(ws_ml + 2 * at);
    float mx = NEG_INF;
    for (u32 s = 0; s < num_splits; ++s) mx = fmaxf(mx, ml[s].x);
    float l = 0.0f, v = 0.0f;
    // Only the splits that hold keys (sum > 0: a split with keys has at least exp2(0) = 1);
    // an empty one (a shorter context than the longest of the step) adds nothing (its
    // accumulator, never written, is read but not used).
    for (u32 base = 0; base < num_splits; base += REDUCE_BATCH) {
        float2 p[REDUCE_BATCH];
        float acc[REDUCE_BATCH];
#pragma unroll
        for (u32 j = 0; j < REDUCE_BATCH; ++j) {
            if (base + j < num_splits) {
                p[j] = ml[base + j];
                acc[j] = ws_acc[(at + base + j) * D + d];
            }
        }
#pragma unroll
        for (u32 j = 0; j < REDUCE_BATCH; ++j) {
            if (base + j < num_splits && p[j].y > 0.0f) {
                const float w = exp2f(p[j].x - mx);
                l += w * p[j].y;
                v += w * acc[j];
            }
        }
    }
    const u32 q_row = seqs[4 * si];
    out[(size_t)q_row * num_heads * D + (size_t)h * D + d] = from_f<T>(l > 0.0f ? v / l : 0.0f);
}

#define ATTENTION(T, NAME, D)                                                                  \
    extern "C" __global__ void __launch_bounds__(128) paged_decode_##NAME##_d##D(             \
        const T* q, const T* kv, T* out, float* ws_acc, float* ws_ml, const u32* seqs,        \
        const u32* tables, u32 num_heads, u32 kv_heads, u32 num_layers, u32 block_size,       \
        u32 layer, float scale_log2, u32 window, u32 num_splits, u32 part) {                   \
        pdl_enter();                                                                           \
        paged_decode_impl<T, D>(q, kv, out, ws_acc, ws_ml, seqs, tables, num_heads, kv_heads,  \
                                num_layers, block_size, layer, scale_log2, window,            \
                                num_splits, part);                                             \
    }                                                                                          \
    extern "C" __global__ void decode_reduce_##NAME##_d##D(                                    \
        const float* ws_acc, const float* ws_ml, T* out, const u32* seqs, u32 num_heads,      \
        u32 num_splits) {                                                                      \
        pdl_enter();                                                                           \
        decode_reduce_impl<T, D>(ws_acc, ws_ml, out, seqs, num_heads, num_splits);             \
    }

ATTENTION(bf16_t, bf16, 32)
ATTENTION(bf16_t, bf16, 64)
ATTENTION(bf16_t, bf16, 128)
ATTENTION(f16_t, f16, 32)
ATTENTION(f16_t, f16, 64)
ATTENTION(f16_t, f16, 128)
