// LL lines (NCCL's LL layout): every 16-byte store carries 8 data bytes and a 32-bit flag
// twice, {d0, f, d1, f}; each 8-byte half lands atomically, so a reader that sees both flags
// equal to the one it waits for has both halves of the data. Used by the collectives' LL
// protocol (proto/ll.cuh) and by send/recv (p2p.cuh).
#pragma once
#include "base.cuh"

__device__ __forceinline__ void ll_store(unsigned char* p, uint2 d, unsigned flag) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(d.x), "r"(flag), "r"(d.y),
                 "r"(flag)
                 : "memory");
}

__device__ __forceinline__ uint4 ll_load(const unsigned char* p) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}

// Bytes [8u, 8u + 8) of `p` (zero past `bytes`).
__device__ __forceinline__ uint2 load8(const unsigned char* p, u64 u, u64 bytes, bool aligned) {
    if (aligned && 8 * u + 8 <= bytes) return *(const uint2*)(p + 8 * u);
    union { uint2 v; unsigned char c[8]; } w;
    w.v = make_uint2(0, 0);
    for (int i = 0; i < 8; ++i)
        if (8 * u + i < bytes) w.c[i] = p[8 * u + i];
    return w.v;
}

__device__ __forceinline__ void store8(unsigned char* p, u64 u, u64 bytes, bool aligned, uint2 d) {
    if (aligned && 8 * u + 8 <= bytes) {
        *(uint2*)(p + 8 * u) = d;
        return;
    }
    union { uint2 v; unsigned char c[8]; } w;
    w.v = d;
    for (int i = 0; i < 8; ++i)
        if (8 * u + i < bytes) p[8 * u + i] = w.c[i];
}
