//! CUDA C of the crate's kernels, compiled at run time by NVRTC (see `nvrtc`). One source,
//! no per-dtype copies: the kernels move and check bytes.

/// The module's name in the kernel cache.
pub const NAME: &str = "superinfer_blocks";

/// Kernel names in [`SOURCE`].
pub const FILL: &str = "fill_pieces";
pub const VERIFY: &str = "verify_pieces";
pub const COPY_SEGMENTS: &str = "copy_segments";
pub const STREAM_COPY: &str = "stream_copy";

/// Bytes one CTA of `copy_segments` moves per work item; segment sizes are multiples of it.
pub const COPY_TILE_BYTES: u64 = 64 * 1024;
/// Threads per CTA of `copy_segments` (the kernel's indexing assumes it).
pub const COPY_THREADS: u32 = 256;

/// The pattern functions must match `crate::pattern` bit for bit.
pub const SOURCE: &str = r#"
typedef unsigned long long u64;
typedef unsigned int u32;

__device__ __forceinline__ u64 mix64(u64 z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

__device__ __forceinline__ u64 pattern_word(u64 tag, u32 piece, u32 w) {
    return mix64((tag * 0x9E3779B97F4A7C15ull) ^ (((u64)piece << 32) | (u64)w));
}

// Grid (pieces, n): CTA (p, i) writes piece p of block blocks[i] with tag tags[i].
// Piece p of block b starts at base + b * block_stride + p * piece_stride.
// spin_cycles > 0 makes each CTA wait that many SM cycles first (a slow producer for the
// writeback-gating check).
extern "C" __global__ void fill_pieces(u64 base, const u32* blocks, const u64* tags,
                                       u64 block_stride, u64 piece_stride, u32 piece_words,
                                       u64 spin_cycles) {
    if (spin_cycles > 0) {
        long long start = clock64();
        while ((u64)(clock64() - start) < spin_cycles) { }
    }
    u32 piece = blockIdx.x;
    u32 i = blockIdx.y;
    u64 tag = tags[i];
    u64* p = (u64*)(base + (u64)blocks[i] * block_stride + (u64)piece * piece_stride);
    for (u32 w = threadIdx.x; w < piece_words; w += blockDim.x) {
        p[w] = pattern_word(tag, piece, w);
    }
}

// Same grid; adds the number of words that differ from the pattern to *mismatches.
extern "C" __global__ void verify_pieces(u64 base, const u32* blocks, const u64* tags,
                                         u64 block_stride, u64 piece_stride, u32 piece_words,
                                         u64* mismatches) {
    u32 piece = blockIdx.x;
    u32 i = blockIdx.y;
    u64 tag = tags[i];
    const u64* p = (const u64*)(base + (u64)blocks[i] * block_stride + (u64)piece * piece_stride);
    u32 bad = 0;
    for (u32 w = threadIdx.x; w < piece_words; w += blockDim.x) {
        bad += (p[w] != pattern_word(tag, piece, w));
    }
    if (bad) atomicAdd(mismatches, (u64)bad);
}

// Copies n segments of seg_bytes (a multiple of 64 KiB) from srcs[i] to dsts[i]: a persistent
// grid walks 64 KiB tiles; 256 threads move 16 B each per step, four loads in flight.
// Pointers are unified addresses: device memory or device-mapped pinned host memory.
extern "C" __global__ void __launch_bounds__(256) copy_segments(const u64* srcs, const u64* dsts,
                                                                u32 n, u64 seg_bytes) {
    const u64 tile = 65536;
    const u64 tiles_per_seg = seg_bytes / tile;
    const u64 total = (u64)n * tiles_per_seg;
    for (u64 t = blockIdx.x; t < total; t += gridDim.x) {
        u64 s = t / tiles_per_seg;
        u64 off = (t % tiles_per_seg) * tile;
        const uint4* src = (const uint4*)(srcs[s] + off);
        uint4* dst = (uint4*)(dsts[s] + off);
        #pragma unroll
        for (u32 k = 0; k < 16; k += 4) {
            uint4 a = src[threadIdx.x + (k + 0) * 256];
            uint4 b = src[threadIdx.x + (k + 1) * 256];
            uint4 c = src[threadIdx.x + (k + 2) * 256];
            uint4 d = src[threadIdx.x + (k + 3) * 256];
            dst[threadIdx.x + (k + 0) * 256] = a;
            dst[threadIdx.x + (k + 1) * 256] = b;
            dst[threadIdx.x + (k + 2) * 256] = c;
            dst[threadIdx.x + (k + 3) * 256] = d;
        }
    }
}

// A memory-bound load for the interference test: dst[i] = src[i] over n16 16-byte words.
extern "C" __global__ void stream_copy(const uint4* src, uint4* dst, u64 n16) {
    u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += stride) {
        dst[i] = src[i];
    }
}
"#;
