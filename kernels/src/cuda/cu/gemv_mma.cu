// Skinny matmuls on tensor cores (decode batches of 2 to 64 rows): y[m, n] = x[m, k] . w[n, k]
// with mma.m16n8k16, w's rows as the MMA's A operand (16 output columns per CTA) and x's rows as
// its B operand (8 batch rows per n-tile, NT tiles: m <= 8 NT; rows past m read as zeros).
// Both operands come straight from global memory in 16-byte loads: lane (g = lane / 4,
// t = lane % 4) reads elements [32 c + 8 t, 32 c + 8 t + 8) of w rows g and g + 8 and of x
// row g of each tile, and the two MMAs of a 32-element chunk take them as k-permuted fragments
// (a dot product does not depend on the order of its k; A and B use the same permutation):
// MMA 1 takes elements 0-3 of each lane's eight, MMA 2 elements 4-7. The CTA's 8 warps split k
// (chunks of 32 elements), each keeps U chunks of w in flight, and the partial sums are added
// in shared memory. Memory-bound on w like gemv.cu, but x's rows are read once per 16 columns
// instead of once per column, and the multiply-adds run on tensor cores.
// Grid: ceil(n / 16); block: 256 threads; k a multiple of 32. `prefetch` as gemv.cu's.
#define GM_WARPS 8

template <typename T, int NT>
__device__ __forceinline__ void gemv_mma_impl(const T* __restrict__ x, const T* __restrict__ w,
                                              T* __restrict__ y, u32 m, u32 n, u32 k,
                                              u32 prefetch) {
    __shared__ float red[GM_WARPS][NT][4][32];
    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const u32 g = lane >> 2, t = lane & 3;
    const u32 col0 = blockIdx.x * 16;
    // Rows past n (a last partial tile) read row n - 1 and are not stored.
    const u32 r0 = min(col0 + g, n - 1), r1 = min(col0 + g + 8, n - 1);
    const u32 chunks = k / 32, per = (chunks + GM_WARPS - 1) / GM_WARPS;
    const u32 c0 = min(warp * per, chunks), c1 = min(c0 + per, chunks);
    const T* w0 = w + (size_t)r0 * k + t * 8;
    const T* w1 = w + (size_t)r1 * k + t * 8;
    if (prefetch > 0 && c0 < c1) {
        // This warp's first weight bytes of its 16 rows: lanes of one g share a row.
        const u32 bytes = min(prefetch, (c1 - c0) * 64u);
        const char* p0 = (const char*)(w + (size_t)r0 * k + c0 * 32);
        const char* p1 = (const char*)(w + (size_t)r1 * k + c0 * 32);
        for (u32 off = t * 128; off < bytes; off += 4 * 128) {
            asm volatile("prefetch.global.L2 [%0];" ::"l"(p0 + off));
            asm volatile("prefetch.global.L2 [%0];" ::"l"(p1 + off));
        }
    }
    pdl_enter();
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
    // One 32-element chunk: both MMAs for every tile.
    auto chunk = [&](const uint4& a0, const uint4& a1, u32 c) {
        const u32 fa[4] = {a0.x, a1.x, a0.y, a1.y};
        const u32 fb[4] = {a0.z, a1.z, a0.w, a1.w};
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const u32 row = j * 8 + g;
            uint4 b;
            b.x = b.y = b.z = b.w = 0u;
            if (row < m) b = *(const uint4*)(x + (size_t)row * k + c * 32 + t * 8);
            const u32 b1[2] = {b.x, b.y}, b2[2] = {b.z, b.w};
            mma16816<T>(acc[j], fa, b1);
            mma16816<T>(acc[j], fb, b2);
        }
    };
    constexpr int U = 4;
    u32 c = c0;
    for (; c + U <= c1; c += U) {
        uint4 a0[U], a1[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            a0[u] = *(const uint4*)(w0 + (size_t)(c + u) * 32);
            a1[u] = *(const uint4*)(w1 + (size_t)(c + u) * 32);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) chunk(a0[u], a1[u], c + u);
    }
    for (; c < c1; ++c) {
        const uint4 a0 = *(const uint4*)(w0 + (size_t)c * 32);
        const uint4 a1 = *(const uint4*)(w1 + (size_t)c * 32);
        chunk(a0, a1, c);
    }
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) red[warp][j][e][lane] = acc[j][e];
    __syncthreads();
    // acc[j][e] of lane (g, t): output column g (+ 8 for e >= 2), batch row 8 j + 2 t + (e & 1).
    for (u32 i = threadIdx.x; i < NT * 128; i += blockDim.x) {
        const u32 j = i >> 7, e = (i >> 5) & 3, ln = i & 31;
        float s = 0.0f;
#pragma unroll
        for (int v = 0; v < GM_WARPS; ++v) s += red[v][j][e][ln];
        const u32 col = col0 + (ln >> 2) + (e >= 2 ? 8 : 0);
        const u32 row = j * 8 + (ln & 3) * 2 + (e & 1);
        if (row < m && col < n) y[(size_t)row * n + col] = from_f<T>(s);
    }
}

#define GEMV_MMA(T, NAME, NT)                                                                  \
    extern "C" __global__ void __launch_bounds__(GM_WARPS * 32) gemv_mma_##NAME##_t##NT(        \
        const T* x, const T* w, T* y, u32 m, u32 n, u32 k, u32 prefetch) {                     \
        gemv_mma_impl<T, NT>(x, w, y, m, n, k, prefetch);                                      \
    }
#define GEMV_MMA_ALL(T, NAME) \
    GEMV_MMA(T, NAME, 1) GEMV_MMA(T, NAME, 2) GEMV_MMA(T, NAME, 4) GEMV_MMA(T, NAME, 8)

GEMV_MMA_ALL(bf16_t, bf16)
GEMV_MMA_ALL(f16_t, f16)
