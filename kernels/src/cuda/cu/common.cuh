// Shared by the model kernels: integer types, 16-bit float storage types and conversions
// (no CUDA headers, so NVRTC needs no include path), block reductions, the tensor-core MMA
// m16n8k16 (f32 accumulate), cp.async and ldmatrix through inline PTX.
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

struct bf16_t { u16 x; };
struct f16_t { u16 x; };

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(bf16_t v) { return __uint_as_float(((u32)v.x) << 16); }
__device__ __forceinline__ float to_f(f16_t v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.x));
    return f;
}

template <typename T> __device__ __forceinline__ T from_f(float f);
template <> __device__ __forceinline__ float from_f<float>(float f) { return f; }
template <> __device__ __forceinline__ bf16_t from_f<bf16_t>(float f) {
    u16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return bf16_t{h};
}
template <> __device__ __forceinline__ f16_t from_f<f16_t>(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return f16_t{h};
}

// Two values of a 16-bit type packed in one register, the first in the low half.
template <typename T> __device__ __forceinline__ u32 pack2(float a, float b) {
    return (u32)from_f<T>(a).x | ((u32)from_f<T>(b).x << 16);
}

// D += A * B for one warp: A 16x16 (row-major fragments, 4 registers), B 16x8 (column-major,
// 2 registers), D 16x8 f32 (4 registers). Fragment layouts: PTX ISA, "mma.m16n8k16".
template <typename T> __device__ __forceinline__ void mma16816(float* d, const u32* a, const u32* b);
template <> __device__ __forceinline__ void mma16816<bf16_t>(float* d, const u32* a, const u32* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <> __device__ __forceinline__ void mma16816<f16_t>(float* d, const u32* a, const u32* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Shared-memory address of a generic pointer (for cp.async and ldmatrix).
__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
// 16 bytes global -> shared, asynchronously; `bytes` 0 writes zeros and reads nothing.
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, u32 bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}
__device__ __forceinline__ void ldsm_x4(u32* r, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(u32* r, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

#define NEG_INF __int_as_float(0xff800000)

// Programmatic dependent launch (sm_90 and later; elsewhere, and for a kernel launched without
// the attribute, nothing): waits until the kernel before this one in the stream has finished
// and its writes are visible, then lets the kernel after this one start placing its CTAs (they
// run up to their own pdl_enter while this one works). Every kernel raw.rs launches calls it
// before it reads or writes memory that another kernel writes or reads (only constant data,
// such as weights, may be touched before).
__device__ __forceinline__ void pdl_enter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Asks L2 for the first `bytes` (at most `len`) of `p` (16-byte aligned), 128-byte lines
// spread over the warp's lanes.
__device__ __forceinline__ void prefetch_l2_warp(const void* p, u32 bytes, u32 len) {
    const u32 lim = bytes < len ? bytes : len;
    for (u32 off = (threadIdx.x & 31) * 128; off < lim; off += 32 * 128) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"((const char*)p + off));
    }
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ float block_sum(float v, float* scratch32) {
    v = warp_sum(v);
    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) scratch32[warp] = v;
    __syncthreads();
    float t = lane < nw ? scratch32[lane] : 0.0f;
    return warp_sum(t);
}

// Loads N consecutive 16-bit values as floats (N in 1, 2, 4, 8, 16; p aligned to 2N bytes).
template <typename T, int N> __device__ __forceinline__ void load_f(const T* p, float* f) {
    if constexpr (N >= 8) {
#pragma unroll
        for (int c = 0; c < N / 8; ++c) {
            uint4 v = ((const uint4*)p)[c];
            const T* e = (const T*)&v;
#pragma unroll
            for (int i = 0; i < 8; ++i) f[c * 8 + i] = to_f(e[i]);
        }
    } else if constexpr (N == 4) {
        uint2 v = *(const uint2*)p;
        const T* e = (const T*)&v;
#pragma unroll
        for (int i = 0; i < 4; ++i) f[i] = to_f(e[i]);
    } else if constexpr (N == 2) {
        u32 v = *(const u32*)p;
        const T* e = (const T*)&v;
        f[0] = to_f(e[0]);
        f[1] = to_f(e[1]);
    } else {
        f[0] = to_f(p[0]);
    }
}

// The residual add and RMS norm of one row, shared by norm_act.cu's add_rmsnorm and gemv.cu's
// gemv_norm so that both give the same bits: r = x + y rounded to T (x itself when y is null),
// then out = r * rsqrt(mean(r²) + eps) * g. Thread t takes elements t, t + blockDim.x, … and
// adds their squares in that order; every product is formed as (r * inv) * g.
//
// Loads are issued NORM_BATCH elements per thread at a time before any is used, so a thread
// waits for memory once per batch, not once per element (one element at a time, a norm of one
// to eight rows took 13 us on the H200). A row of at most NORM_BATCH * blockDim.x elements
// (4,096 in 256 threads) is read in one batch, g with it, and kept in registers: one wait in
// all. Longer rows take the loop: r (through keep) and g are read again for the output.
constexpr u32 NORM_BATCH = 16;

// This thread's NORM_BATCH elements from `base` on, blockDim.x apart: x, y (when not null)
// and, with WITH_G, g into gv, all loaded before any is used; then r = x + y rounded to T
// (x itself when y is null), passed to keep(i, r), stored as a float into r[j] and its square
// added to ss.
template <bool WITH_G, typename T, typename Keep>
__device__ __forceinline__ void add_row_batch(const T* __restrict__ x, const T* __restrict__ y,
                                              const T* __restrict__ g, u32 base, u32 k,
                                              T (&gv)[NORM_BATCH], float (&r)[NORM_BATCH],
                                              float& ss, Keep keep) {
    T xv[NORM_BATCH], yv[NORM_BATCH];
#pragma unroll
    for (u32 j = 0; j < NORM_BATCH; ++j) {
        const u32 i = base + j * blockDim.x;
        if (i < k) {
            xv[j] = x[i];
            if (y != nullptr) yv[j] = y[i];
            if (WITH_G) gv[j] = g[i];
        }
    }
#pragma unroll
    for (u32 j = 0; j < NORM_BATCH; ++j) {
        const u32 i = base + j * blockDim.x;
        if (i < k) {
            const T rt = y != nullptr ? from_f<T>(to_f(xv[j]) + to_f(yv[j])) : xv[j];
            keep(i, rt);
            r[j] = to_f(rt);
            ss += r[j] * r[j];
        }
    }
}

// keep(i, r) for each of this thread's elements (add_rmsnorm writes r back to the residual
// stream), then put(i, v) with v = (r * inv) * g as a float (the caller rounds it); get(i)
// returns r as a float again on the loop path (from where keep put it).
template <typename T, typename Keep, typename Get, typename Put>
__device__ __forceinline__ void add_rmsnorm_row(const T* __restrict__ x,
                                                const T* __restrict__ y,
                                                const T* __restrict__ g, u32 k, float eps,
                                                float* scratch32, Keep keep, Get get, Put put) {
    float ss = 0.0f;
    if (k <= NORM_BATCH * blockDim.x) {
        T gv[NORM_BATCH];
        float r[NORM_BATCH];
        add_row_batch<true>(x, y, g, threadIdx.x, k, gv, r, ss, keep);
        const float inv = rsqrtf(block_sum(ss, scratch32) / (float)k + eps);
#pragma unroll
        for (u32 j = 0; j < NORM_BATCH; ++j) {
            const u32 i = threadIdx.x + j * blockDim.x;
            if (i < k) put(i, r[j] * inv * to_f(gv[j]));
        }
        return;
    }
    for (u32 base = threadIdx.x; base < k; base += NORM_BATCH * blockDim.x) {
        T unused[NORM_BATCH];
        float r[NORM_BATCH];
        add_row_batch<false>(x, y, g, base, k, unused, r, ss, keep);
    }
    const float inv = rsqrtf(block_sum(ss, scratch32) / (float)k + eps);
    for (u32 base = threadIdx.x; base < k; base += NORM_BATCH * blockDim.x) {
        float gv[NORM_BATCH], v[NORM_BATCH];
#pragma unroll
        for (u32 j = 0; j < NORM_BATCH; ++j) {
            const u32 i = base + j * blockDim.x;
            if (i < k) {
                gv[j] = to_f(g[i]);
                v[j] = get(i);
            }
        }
#pragma unroll
        for (u32 j = 0; j < NORM_BATCH; ++j) {
            const u32 i = base + j * blockDim.x;
            if (i < k) put(i, v[j] * inv * gv[j]);
        }
    }
}
