// The residual stream's fused element-wise work.
// add_rmsnorm: x += y (rounded to T, in place; y may be null for the first layer), then
//   out = rmsnorm(x) * w computed in f32 and rounded once. Grid: tokens; block: 256 threads.
// embed_rows: out[t] = table[ids[t]] (rows of `hidden` elements, hidden a multiple of 8).
//   Grid: tokens; block: 128 threads.
// silu_mul: out[t, i] = silu(gu[t, i]) * gu[t, I + i] over the fused gate/up projection,
//   rounding silu to T first (as the unfused ops do).
template <typename T>
__device__ __forceinline__ void add_rmsnorm_impl(T* __restrict__ x, const T* __restrict__ y,
                                                 const T* __restrict__ w, T* __restrict__ out,
                                                 u32 hidden, float eps) {
    __shared__ float scratch[32];
    T* xr = x + (size_t)blockIdx.x * hidden;
    const T* yr = y == nullptr ? nullptr : y + (size_t)blockIdx.x * hidden;
    T* orow = out + (size_t)blockIdx.x * hidden;
    // common.cuh's helper: the same bits as gemv_norm's prologue.
    add_rmsnorm_row<T>(
        xr, yr, w, hidden, eps, scratch,
        [&](u32 i, T r) {
            if (yr != nullptr) xr[i] = r;
        },
        [&](u32 i) { return to_f(xr[i]); }, [&](u32 i, float v) { orow[i] = from_f<T>(v); });
}

template <typename T>
__device__ __forceinline__ void silu_mul_impl(const T* __restrict__ gu, T* __restrict__ out,
                                              u32 tokens, u32 inter) {
    const size_t n = (size_t)tokens * inter;
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < n;
         k += (size_t)gridDim.x * blockDim.x) {
        const size_t t = k / inter, i = k % inter;
        const float g = to_f(gu[t * 2 * inter + i]);
        const float u = to_f(gu[t * 2 * inter + inter + i]);
        const float s = to_f(from_f<T>(g / (1.0f + __expf(-g))));
        out[k] = from_f<T>(s * u);
    }
}

template <typename T>
__device__ __forceinline__ void embed_rows_impl(const T* __restrict__ table,
                                                const u32* __restrict__ ids,
                                                T* __restrict__ out, u32 hidden) {
    const uint4* src = (const uint4*)(table + (size_t)ids[blockIdx.x] * hidden);
    uint4* dst = (uint4*)(out + (size_t)blockIdx.x * hidden);
    for (u32 i = threadIdx.x; i < hidden * sizeof(T) / 16; i += blockDim.x) dst[i] = src[i];
}

#define NORM_ACT(T, NAME)                                                                      \
    extern "C" __global__ void add_rmsnorm_##NAME(T* x, const T* y, const T* w, T* out,       \
                                                  u32 hidden, float eps) {                     \
        pdl_enter();                                                                           \
        add_rmsnorm_impl<T>(x, y, w, out, hidden, eps);                                        \
    }                                                                                          \
    extern "C" __global__ void silu_mul_##NAME(const T* gu, T* out, u32 tokens, u32 inter) {   \
        pdl_enter();                                                                           \
        silu_mul_impl<T>(gu, out, tokens, inter);                                              \
    }                                                                                          \
    extern "C" __global__ void embed_rows_##NAME(const T* table, const u32* ids, T* out,      \
                                                 u32 hidden) {                                 \
        pdl_enter();                                                                           \
        embed_rows_impl<T>(table, ids, out, hidden);                                           \
    }

NORM_ACT(bf16_t, bf16)
NORM_ACT(f16_t, f16)
NORM_ACT(float, f32)
