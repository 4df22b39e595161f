// Sampling on the GPU so only token ids cross to the host: per row of logits, greedy
// (temperature 0: argmax) or exact sampling from softmax(logits / temperature) by the
// Gumbel-max trick, argmax(logits / temperature + Gumbel noise), with the noise from a
// counter-based hash of (seed, counter, token id): reproducible whatever shares the batch.
// params per row: [temperature as f32 bits, seed lo, seed hi, counter]. Grid: rows; 1024
// threads. Ties go to the lowest id.
__device__ __forceinline__ u64 mix64(u64 z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

template <typename T>
__device__ __forceinline__ void sample_rows_impl(const T* __restrict__ logits,
                                                 const u32* __restrict__ params,
                                                 u32* __restrict__ ids, u32 vocab) {
    __shared__ float best_v[32];
    __shared__ u32 best_i[32];
    const u32 row = blockIdx.x;
    const float temp = __uint_as_float(params[4 * row]);
    const u64 seed = (u64)params[4 * row + 1] | ((u64)params[4 * row + 2] << 32);
    const u64 stream = mix64(seed ^ mix64((u64)params[4 * row + 3] + 0x632BE59BD9B4E019ull));
    const T* lr = logits + (size_t)row * vocab;
    float bv = NEG_INF;
    u32 bi = 0xffffffffu;
    // Each thread's logits SAMPLE_BATCH at a time, loaded before any is used (one at a time,
    // the scan of a 128K vocabulary waited for memory 125 times per thread).
    constexpr u32 SAMPLE_BATCH = 8;
    for (u32 base = threadIdx.x; base < vocab; base += SAMPLE_BATCH * blockDim.x) {
        T lv[SAMPLE_BATCH];
#pragma unroll
        for (u32 j = 0; j < SAMPLE_BATCH; ++j) {
            const u32 i = base + j * blockDim.x;
            if (i < vocab) lv[j] = lr[i];
        }
#pragma unroll
        for (u32 j = 0; j < SAMPLE_BATCH; ++j) {
            const u32 i = base + j * blockDim.x;
            if (i >= vocab) break;
            float v = to_f(lv[j]);
            if (v != v) v = NEG_INF;  // NaN never wins
            if (temp > 0.0f && v != NEG_INF) {
                const u64 h = mix64(stream ^ (u64)i);
                const float u = ((float)(h >> 40) + 0.5f) * (1.0f / 16777216.0f);
                v = v / temp - __logf(-__logf(u));
            }
            if (v > bv || (v == bv && i < bi)) {
                bv = v;
                bi = i;
            }
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const u32 oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) {
            bv = ov;
            bi = oi;
        }
    }
    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) {
        best_v[warp] = bv;
        best_i[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        const u32 nw = blockDim.x >> 5;
        bv = lane < nw ? best_v[lane] : NEG_INF;
        bi = lane < nw ? best_i[lane] : 0xffffffffu;
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const u32 oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) {
                bv = ov;
                bi = oi;
            }
        }
        if (lane == 0) ids[row] = bi == 0xffffffffu ? 0 : bi;
    }
}

#define SAMPLE(T, NAME)                                                                        \
    extern "C" __global__ void sample_rows_##NAME(const T* logits, const u32* params,         \
                                                  u32* ids, u32 vocab) {                       \
        pdl_enter();                                                                           \
        sample_rows_impl<T>(logits, params, ids, vocab);                                       \
    }

SAMPLE(bf16_t, bf16)
SAMPLE(f16_t, f16)
SAMPLE(float, f32)
