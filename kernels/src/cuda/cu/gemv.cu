// Matrix-vector products for small batches (decode): y[m, n] = sum_k x[m, k] * w[n, k] for
// m = M <= 8 rows, w row-major (n, k) as a Linear weight. One warp per output column n
// (grid-stride), 16-byte loads of w (8 elements per lane), two chunks in flight per lane (four
// measured no faster, docs/BENCHMARKS.md "CUDA graphs"); the rows of x come from L1/L2 (every
// warp reads the same x). Memory-bound on w: cuBLAS's GEMM tiles leave most SMs idle at m = 1
// (e.g. 32 CTAs for a 4096-wide output).
// k must be a multiple of 8. Grid: any; block: 256 threads. gemv_silu: the gate/up
// projection's silu_mul in the epilogue (each warp reads the gate and the up row of its
// column), so the activation is written once and the silu_mul kernel is gone.
// `prefetch`: bytes of each of the warp's first rows of w asked into L2 before pdl_enter, so
// that under programmatic dependent launch the weights stream while the kernel before this
// one finishes (0: none).
// The rows of x, read from global memory (L1/L2) as gemv's `x` argument.
template <typename T> struct GlobalRows {
    const T* __restrict__ x;
    u32 k;
    __device__ __forceinline__ void load8(int r, u32 c, int off, float* f) const {
        load_f<T, 8>(x + (size_t)r * k + c + off, f);
    }
};

// One row of x already converted to floats in shared memory (gemv_norm's prologue).
struct SharedRow {
    const float* xs;
    __device__ __forceinline__ void load8(int, u32 c, int off, float* f) const {
#pragma unroll
        for (int e = 0; e < 8; ++e) f[e] = xs[c + off + e];
    }
};

// Where a warp's dot products go. `Plain`: output column `col` is row `col` of w, stored as
// it is (gemv). `SiluMul`: w is the fused gate/up projection (2 inter, k); output column `col`
// (of `inter`) is silu(x . w[col]) * (x . w[inter + col]), each product rounded to T first and
// silu rounded to T (norm_act.cu's silu_mul over gemv's output, bit for bit).
template <typename T> struct Plain {
    static constexpr int R = 1;
    T* __restrict__ y;
    u32 n;
    __device__ __forceinline__ u32 cols() const { return n; }
    __device__ __forceinline__ size_t row(u32 col, int) const { return col; }
    __device__ __forceinline__ void store(int r, u32 col, const float* v) const {
        y[(size_t)r * n + col] = from_f<T>(v[0]);
    }
};

template <typename T> struct SiluMul {
    static constexpr int R = 2;
    T* __restrict__ y;
    u32 inter;
    __device__ __forceinline__ u32 cols() const { return inter; }
    __device__ __forceinline__ size_t row(u32 col, int j) const {
        return (size_t)j * inter + col;
    }
    __device__ __forceinline__ void store(int r, u32 col, const float* v) const {
        const float g = to_f(from_f<T>(v[0]));
        const float u = to_f(from_f<T>(v[1]));
        const float s = to_f(from_f<T>(g / (1.0f + __expf(-g))));
        y[(size_t)r * inter + col] = from_f<T>(s * u);
    }
};

// The GEMV over the M rows that `xr` loads (8 consecutive floats of row r from element
// c + off), each warp taking Out::R rows of w for one output column. Every dot product adds
// its terms in the same order whatever Out is.
template <typename T, int M, typename Rows, typename Out>
__device__ __forceinline__ void gemv_rows(const Rows& xr, const T* __restrict__ w,
                                          const Out& out, u32 k) {
    constexpr int R = Out::R;
    const u32 lane = threadIdx.x & 31;
    const u32 warps = (gridDim.x * blockDim.x) >> 5;
    const u32 n = out.cols();
    for (u32 col = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; col < n; col += warps) {
        const T* wr[R];
#pragma unroll
        for (int j = 0; j < R; ++j) wr[j] = w + out.row(col, j) * k;
        float acc[R][M];
#pragma unroll
        for (int j = 0; j < R; ++j)
#pragma unroll
            for (int r = 0; r < M; ++r) acc[j][r] = 0.0f;
        u32 c = lane * 8;
        // U chunks of 256 elements of each w row per iteration: all of their 16-byte loads
        // are issued before the first is used.
        constexpr int U = 2;
        for (; c + (U - 1) * 256 < k; c += U * 256) {
            uint4 raw[R][U];
#pragma unroll
            for (int j = 0; j < R; ++j)
#pragma unroll
                for (int u = 0; u < U; ++u) raw[j][u] = *(const uint4*)(wr[j] + c + u * 256);
#pragma unroll
            for (int u = 0; u < U; ++u) {
#pragma unroll
                for (int j = 0; j < R; ++j) {
                    const T* we = (const T*)&raw[j][u];
#pragma unroll
                    for (int r = 0; r < M; ++r) {
                        float xf[8];
                        xr.load8(r, c, u * 256, xf);
#pragma unroll
                        for (int e = 0; e < 8; ++e) acc[j][r] += to_f(we[e]) * xf[e];
                    }
                }
            }
        }
        for (; c < k; c += 256) {
#pragma unroll
            for (int j = 0; j < R; ++j) {
                float w0[8];
                load_f<T, 8>(wr[j] + c, w0);
#pragma unroll
                for (int r = 0; r < M; ++r) {
                    float x0[8];
                    xr.load8(r, c, 0, x0);
#pragma unroll
                    for (int e = 0; e < 8; ++e) acc[j][r] += w0[e] * x0[e];
                }
            }
        }
#pragma unroll
        for (int r = 0; r < M; ++r) {
            float v[R];
#pragma unroll
            for (int j = 0; j < R; ++j) v[j] = warp_sum(acc[j][r]);
            if (lane == 0) out.store(r, col, v);
        }
    }
}

// The warp's first output column's rows of w into L2 (weights only: before pdl_enter).
template <typename T, typename Out>
__device__ __forceinline__ void gemv_prefetch(const T* __restrict__ w, const Out& out, u32 k,
                                              u32 bytes) {
    const u32 col = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (bytes == 0 || col >= out.cols()) return;
#pragma unroll
    for (int j = 0; j < Out::R; ++j) {
        prefetch_l2_warp(w + out.row(col, j) * k, bytes, k * (u32)sizeof(T));
    }
}

template <typename T, int M, typename Out>
__device__ __forceinline__ void gemv_impl(const T* __restrict__ x, const T* __restrict__ w,
                                          const Out& out, u32 k, u32 prefetch) {
    gemv_prefetch(w, out, k, prefetch);
    pdl_enter();
    gemv_rows<T, M>(GlobalRows<T>{x, k}, w, out, k);
}

// gemv_norm (one row, CUDA-graph decode at batch 1): add_rmsnorm (norm_act.cu) fused into the
// prologue of the GEMV that consumes its output, so the small kernel between two matmuls is
// gone. Every CTA computes r = x + y (rounded to T) and out = rmsnorm(r) * g (rounded to T)
// into shared memory itself (k floats, dynamic shared memory), with add_rmsnorm's thread
// mapping and reduction for a block of 256 threads, so the GEMV's input, and the result, are
// bitwise those of the two kernels; CTA 0 also writes r to x_out, the residual stream's next
// buffer (not x: other CTAs still read x). y may be null (then r = x, and x_out is not
// written). Grid: any (few CTAs: each one's prologue reads 2k elements); block: 256 threads;
// k a multiple of 8. With SiluMul, the gate/up projection's silu_mul too (gemv_norm_silu).
template <typename T, typename Out>
__device__ __forceinline__ void gemv_norm_impl(const T* __restrict__ x, const T* __restrict__ y,
                                               const T* __restrict__ g, const T* __restrict__ w,
                                               const Out& out, T* __restrict__ x_out, u32 k,
                                               float eps, u32 prefetch) {
    extern __shared__ float xs[];
    __shared__ float scratch[32];
    gemv_prefetch(w, out, k, prefetch);
    pdl_enter();
    float ss = 0.0f;
    for (u32 i = threadIdx.x; i < k; i += blockDim.x) {
        float v = to_f(x[i]);
        if (y != nullptr) {
            const T r = from_f<T>(v + to_f(y[i]));
            if (blockIdx.x == 0) x_out[i] = r;
            v = to_f(r);
        }
        xs[i] = v;
        ss += v * v;
    }
    const float inv = rsqrtf(block_sum(ss, scratch) / (float)k + eps);
    for (u32 i = threadIdx.x; i < k; i += blockDim.x) {
        xs[i] = to_f(from_f<T>(xs[i] * inv * to_f(g[i])));
    }
    __syncthreads();
    // gemv's loop over the row in shared memory: the same products in the same order.
    gemv_rows<T, 1>(SharedRow{xs}, w, out, k);
}

#define GEMV(T, NAME, M)                                                                       \
    extern "C" __global__ void __launch_bounds__(256) gemv_##NAME##_m##M(                       \
        const T* x, const T* w, T* y, u32 n, u32 k, u32 prefetch) {                            \
        gemv_impl<T, M>(x, w, Plain<T>{y, n}, k, prefetch);                                    \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(256) gemv_silu_##NAME##_m##M(                  \
        const T* x, const T* w, T* y, u32 inter, u32 k, u32 prefetch) {                        \
        gemv_impl<T, M>(x, w, SiluMul<T>{y, inter}, k, prefetch);                              \
    }
#define GEMV_ALL(T, NAME) \
    GEMV(T, NAME, 1) GEMV(T, NAME, 2) GEMV(T, NAME, 3) GEMV(T, NAME, 4) \
    GEMV(T, NAME, 5) GEMV(T, NAME, 6) GEMV(T, NAME, 7) GEMV(T, NAME, 8)

#define GEMV_NORM(T, NAME)                                                                     \
    extern "C" __global__ void __launch_bounds__(256) gemv_norm_##NAME(                          \
        const T* x, const T* y, const T* g, const T* w, T* out, T* x_out, u32 n, u32 k,         \
        float eps, u32 prefetch) {                                                             \
        gemv_norm_impl<T>(x, y, g, w, Plain<T>{out, n}, x_out, k, eps, prefetch);              \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(256) gemv_norm_silu_##NAME(                     \
        const T* x, const T* y, const T* g, const T* w, T* out, T* x_out, u32 inter, u32 k,     \
        float eps, u32 prefetch) {                                                             \
        gemv_norm_impl<T>(x, y, g, w, SiluMul<T>{out, inter}, x_out, k, eps, prefetch);        \
    }

GEMV_ALL(bf16_t, bf16)
GEMV_ALL(f16_t, f16)
GEMV_NORM(bf16_t, bf16)
GEMV_NORM(f16_t, f16)
