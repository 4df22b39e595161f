// One step's Q/K/V after the fused QKV projection: adds the projection bias (Qwen2) if any,
// applies rotary embeddings (rotate-half convention, as Llama) to Q and K in f32 from f32
// cos/sin tables (max_positions, D/2), writes Q to its own tensor and K/V straight into their
// slots of the block-first KV arena. Grid (tokens, num_heads + 2 * kv_heads), D/2 threads.
// slots[t] is the arena row of token t's K at layer 0; layer l adds l * 2 * block_size, V
// block_size more. NO_SLOT (a padding row of a CUDA-graph bucket) writes Q only.
#define NO_SLOT 0xffffffffu
template <typename T>
__device__ __forceinline__ void rope_kv_impl(
    const T* __restrict__ qkv, const T* __restrict__ bias, T* __restrict__ q_out,
    T* __restrict__ kv, const float* __restrict__ cos_t, const float* __restrict__ sin_t,
    const u32* __restrict__ positions, const u32* __restrict__ slots, u32 num_heads,
    u32 kv_heads, u32 head_dim, u32 block_size, u32 layer) {
    const u32 t = blockIdx.x, hh = blockIdx.y, i = threadIdx.x, half = head_dim / 2;
    const size_t width = (size_t)(num_heads + 2 * kv_heads) * head_dim;
    const T* src = qkv + (size_t)t * width + (size_t)hh * head_dim;
    float x1 = to_f(src[i]), x2 = to_f(src[i + half]);
    if (bias != nullptr) {
        // The projection's output is rounded to T before the bias is added (as Linear does).
        x1 = to_f(from_f<T>(x1 + to_f(bias[(size_t)hh * head_dim + i])));
        x2 = to_f(from_f<T>(x2 + to_f(bias[(size_t)hh * head_dim + i + half])));
    }
    if (hh >= num_heads && slots[t] == NO_SLOT) return;
    const size_t kvw = (size_t)kv_heads * head_dim;
    const size_t krow = (size_t)slots[t] + (size_t)layer * 2 * block_size;
    if (hh >= num_heads + kv_heads) {  // V: copied
        T* dst = kv + (krow + block_size) * kvw + (size_t)(hh - num_heads - kv_heads) * head_dim;
        dst[i] = from_f<T>(x1);
        dst[i + half] = from_f<T>(x2);
        return;
    }
    const u32 p = positions[t];
    const float c = cos_t[(size_t)p * half + i], s = sin_t[(size_t)p * half + i];
    const T y1 = from_f<T>(x1 * c - x2 * s), y2 = from_f<T>(x2 * c + x1 * s);
    T* dst = hh < num_heads
                 ? q_out + (size_t)t * num_heads * head_dim + (size_t)hh * head_dim
                 : kv + krow * kvw + (size_t)(hh - num_heads) * head_dim;
    dst[i] = y1;
    dst[i + half] = y2;
}

#define ROPE_KV(T, NAME)                                                                      \
    extern "C" __global__ void rope_kv_##NAME(                                                \
        const T* qkv, const T* bias, T* q_out, T* kv, const float* cos_t, const float* sin_t, \
        const u32* positions, const u32* slots, u32 num_heads, u32 kv_heads, u32 head_dim,    \
        u32 block_size, u32 layer) {                                                          \
        pdl_enter();                                                                          \
        rope_kv_impl<T>(qkv, bias, q_out, kv, cos_t, sin_t, positions, slots, num_heads,      \
                        kv_heads, head_dim, block_size, layer);                               \
    }

ROPE_KV(bf16_t, bf16)
ROPE_KV(f16_t, f16)
ROPE_KV(float, f32)
