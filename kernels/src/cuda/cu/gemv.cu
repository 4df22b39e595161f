// Matrix-vector products for small batches (decode): y[m, n] = sum_k x[m, k] * w[n, k] for
// m = M <= 8 rows, w row-major (n, k) as a Linear weight. Memory-bound on w: cuBLAS's GEMM
// tiles leave most SMs idle at m = 1 (e.g. 32 CTAs for a 4096-wide output).
// M = 1 (gemv_rows): one warp per output column (grid-stride), 16-byte loads of w (8 elements
// per lane), two chunks in flight per lane (four measured no faster, docs/BENCHMARKS_GPU.md "CUDA
// graphs"); the row of x comes from L1/L2 (every warp reads it).
// M >= 2 (gemv_cols): one warp per C consecutive output columns. With one column a warp, a
// lane loaded M 16-byte chunks of x (one per row) for each 16-byte chunk of w, x traffic from
// L1/L2 M times the weight traffic (8x at M = 8: 9.6 ms a step at batch 8 on the H200). A warp
// now streams GEMV_WARP_ROWS = C * Out::R rows of w (2: C = 2 for gemv, 1 for gemv_silu) and
// each chunk of x it loads, converted to floats once, serves all of them: x traffic
// M / (C * R) of the weight traffic. w is read past L1 (L1::no_allocate), which is left to x.
// The host sizes the grid by n (a warp per column), so n / C warps find work; each keeps 3
// chunks of each of its rows in flight. Measured on the H200 (docs/BENCHMARKS_GPU.md, "Launch
// overlap and fusions"): 2 rows a warp beat 4 at M = 2 and 4 (5.07 vs 5.18 ms a decode step at
// batch 2, where cuBLAS takes 5.35); at M = 8 both lose to cuBLAS (8.0 and 7.3 vs 5.5 ms:
// the FMAs and conversions, not HBM, bound the kernel), so only 2-row steps use it by default.
// Every dot product adds its terms in the same order on either path (a lane's k-chunks in
// increasing order, 8 products each, then warp_sum), in fp32: gemv_cols's results are those
// of gemv_rows for the same M.
// k must be a multiple of 8. Grid: any; block: 256 threads. gemv_silu: the gate/up
// projection's silu_mul in the epilogue (each warp reads the gate and the up row of its
// columns), so the activation is written once and the silu_mul kernel is gone.
// `prefetch`: bytes of each of the warp's first rows of w (M >= 2: those of all of its first
// C columns, as many bytes in all as M = 1's) asked into L2 before pdl_enter, so that under
// programmatic dependent launch the weights stream while the kernel before this one finishes
// (0: none).
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
// c + off), each warp taking Out::R rows of w for one output column: gemv at M = 1 and
// gemv_norm. Every dot product adds its terms in the same order whatever Out is.
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

// 16 bytes of w, read once: through the non-coherent path, not allocated in L1 (x's).
__device__ __forceinline__ uint4 load_stream16(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// 8 values of T as loaded (16 bytes) to floats, bitwise to_f's; bf16 by one integer op each
// (the low half shifted up, the high half masked) rather than an extract and a shift.
__device__ __forceinline__ void to_f8(const uint4& v, float* f, bf16_t) {
    const u32 p[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = __uint_as_float(p[i] << 16);
        f[2 * i + 1] = __uint_as_float(p[i] & 0xffff0000u);
    }
}
__device__ __forceinline__ void to_f8(const uint4& v, float* f, f16_t) {
    const u32 p[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = to_f(f16_t{(u16)(p[i] & 0xffffu)});
        f[2 * i + 1] = to_f(f16_t{(u16)(p[i] >> 16)});
    }
}

// The products of a lane's 8 elements from c of J rows of w (as floats) with those of the M
// rows of x into acc: each row of x's chunk is loaded and converted once for the J rows.
template <typename T, int M, int J>
__device__ __forceinline__ void gemv_fma(const T* __restrict__ x, u32 k, u32 c,
                                         const float (&wf)[J][8], float (&acc)[J][M]) {
#pragma unroll
    for (int r = 0; r < M; ++r) {
        float xf[8];
        to_f8(*(const uint4*)(x + (size_t)r * k + c), xf, T{});
#pragma unroll
        for (int j = 0; j < J; ++j)
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[j][r] += wf[j][e] * xf[e];
    }
}

// The GEMV for M >= 2 rows of x, each warp taking C consecutive output columns from col0
// (J = C * R rows of w: row j is the (j % R)-th of column col0 + j / R, the columns past n
// clamped to n - 1 and not stored). A lane's chunks of the J rows stream through D buffers,
// each refilled D chunks ahead as soon as it is converted, so D * J 16-byte loads are in
// flight while a chunk is computed; the __syncwarp after the refill keeps ptxas from sinking
// it below the chunk's FMAs (it did, to where the buffer was needed next). The warp walks
// groups of D chunks that all its lanes have, then the rest (at most D, already loaded; the
// last one partial where k is not a multiple of 256); a refill past a lane's row is
// clamped to the row's last chunk and never used.
template <typename T, int M, int C, typename Out>
__device__ __forceinline__ void gemv_cols(const T* __restrict__ x, const T* __restrict__ w,
                                          const Out& out, u32 k) {
    constexpr int R = Out::R, J = C * R, D = 3;
    const u32 lane = threadIdx.x & 31;
    const u32 warps = (gridDim.x * blockDim.x) >> 5;
    const u32 n = out.cols();
    for (u32 col0 = ((blockIdx.x * blockDim.x + threadIdx.x) >> 5) * C; col0 < n;
         col0 += warps * C) {
        const T* wr[J];
#pragma unroll
        for (int i = 0; i < C; ++i) {
            const u32 col = min(col0 + i, n - 1);
#pragma unroll
            for (int j = 0; j < R; ++j) wr[i * R + j] = w + out.row(col, j) * k;
        }
        float acc[J][M];
#pragma unroll
        for (int j = 0; j < J; ++j)
#pragma unroll
            for (int r = 0; r < M; ++r) acc[j][r] = 0.0f;
        if (k >= 8) {  // (k = 0: nothing to load, and k - 8 would wrap)
            uint4 buf[D][J];  // buf[d]: the lane's chunk i + d of each row
#pragma unroll
            for (int d = 0; d < D; ++d) {
                const u32 e = min(lane * 8 + d * 256, k - 8);
#pragma unroll
                for (int j = 0; j < J; ++j) buf[d][j] = load_stream16(wr[j] + e);
            }
            u32 i = 0;
            for (; i + D <= k / 256; i += D) {
#pragma unroll
                for (int d = 0; d < D; ++d) {
                    const u32 c = lane * 8 + (i + d) * 256;
                    float wf[J][8];
#pragma unroll
                    for (int j = 0; j < J; ++j) to_f8(buf[d][j], wf[j], T{});
                    const u32 e = min(c + D * 256, k - 8);
#pragma unroll
                    for (int j = 0; j < J; ++j) buf[d][j] = load_stream16(wr[j] + e);
                    __syncwarp();
                    gemv_fma<T, M, J>(x, k, c, wf, acc);
                }
            }
#pragma unroll
            for (int d = 0; d < D; ++d) {
                const u32 c = lane * 8 + (i + d) * 256;
                if (c < k) {
                    float wf[J][8];
#pragma unroll
                    for (int j = 0; j < J; ++j) to_f8(buf[d][j], wf[j], T{});
                    gemv_fma<T, M, J>(x, k, c, wf, acc);
                }
            }
        }
#pragma unroll
        for (int i = 0; i < C; ++i) {
#pragma unroll
            for (int r = 0; r < M; ++r) {
                float v[R];
#pragma unroll
                for (int j = 0; j < R; ++j) v[j] = warp_sum(acc[i * R + j][r]);
                if (lane == 0 && col0 + i < n) out.store(r, col0 + i, v);
            }
        }
    }
}

// Rows of w a warp of gemv_cols streams at once: C = GEMV_WARP_ROWS / Out::R columns.
constexpr int GEMV_WARP_ROWS = 2;

// The rows of w of the warp's first C output columns (C = 1: gemv_rows's one) into L2
// (weights only: before pdl_enter).
template <int C, typename T, typename Out>
__device__ __forceinline__ void gemv_prefetch(const T* __restrict__ w, const Out& out, u32 k,
                                              u32 bytes) {
    const u32 col0 = ((blockIdx.x * blockDim.x + threadIdx.x) >> 5) * C;
    if (bytes == 0 || col0 >= out.cols()) return;
#pragma unroll
    for (int i = 0; i < C; ++i) {
        if (i > 0 && col0 + i >= out.cols()) return;
#pragma unroll
        for (int j = 0; j < Out::R; ++j) {
            prefetch_l2_warp(w + out.row(col0 + i, j) * k, bytes, k * (u32)sizeof(T));
        }
    }
}

template <typename T, int M, typename Out>
__device__ __forceinline__ void gemv_impl(const T* __restrict__ x, const T* __restrict__ w,
                                          const Out& out, u32 k, u32 prefetch) {
    if constexpr (M == 1) {
        gemv_prefetch<1>(w, out, k, prefetch);
        pdl_enter();
        gemv_rows<T, M>(GlobalRows<T>{x, k}, w, out, k);
    } else {
        constexpr int C = GEMV_WARP_ROWS / Out::R;
        gemv_prefetch<C>(w, out, k, prefetch);
        pdl_enter();
        gemv_cols<T, M, C>(x, w, out, k);
    }
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
    gemv_prefetch<1>(w, out, k, prefetch);
    pdl_enter();
    // common.cuh's helper: the same bits as add_rmsnorm.
    add_rmsnorm_row<T>(
        x, y, g, k, eps, scratch,
        [&](u32 i, T r) {
            if (y != nullptr && blockIdx.x == 0) x_out[i] = r;
            xs[i] = to_f(r);
        },
        [&](u32 i) { return xs[i]; }, [&](u32 i, float v) { xs[i] = to_f(from_f<T>(v)); });
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
