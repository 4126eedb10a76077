// Byte copies: vector widths, unaligned and realigned (shifted) copies, one-to-many copies.
#pragma once
#include "base.cuh"

// The widest access, 16, 8, 4, 2 or 1 bytes, at which addresses a and b are aligned alike
// (their low bits equal): a copy between them runs at that width after a head of bytes.
__device__ __forceinline__ unsigned common_width(u64 a, u64 b) {
    const u64 x = a ^ b;
    return (x & 15ull) == 0 ? 16 : (x & 7ull) == 0 ? 8 : (x & 3ull) == 0 ? 4 : (x & 1ull) == 0 ? 2 : 1;
}

// The unsigned type of an access of W bytes (uint4 for 16).
template <unsigned W> struct Word;
template <> struct Word<16> { typedef uint4 T; };
template <> struct Word<8> { typedef uint2 T; };
template <> struct Word<4> { typedef unsigned T; };
template <> struct Word<2> { typedef unsigned short T; };
template <> struct Word<1> { typedef unsigned char T; };

// Where a copy stores: one destination (ToOne), or up to MAX_RANKS with null entries skipped
// (ToMany). `word(off, i, v)` stores the i-th T after byte off; `byte(j, v)` byte j; `low()`
// the destinations' address mod 16 where they all share it, else 16.
struct ToOne {
    unsigned char* d;
    template <typename T> __device__ __forceinline__ void word(u64 off, u64 i, T v) const { ((T*)(d + off))[i] = v; }
    __device__ __forceinline__ void byte(u64 j, unsigned char v) const { d[j] = v; }
    __device__ __forceinline__ unsigned low() const { return (unsigned)((u64)d & 15ull); }
};
struct ToMany {
    unsigned char* const* d;
    int n;
    __device__ __forceinline__ unsigned low() const {
        unsigned l = 16;
        for (int k = 0; k < n; ++k) {
            if (!d[k]) continue;
            const unsigned m = (unsigned)((u64)d[k] & 15ull);
            if (l != 16 && m != l) return 16;
            l = m;
        }
        return l;
    }
    template <typename T> __device__ __forceinline__ void word(u64 off, u64 i, T v) const {
        for (int k = 0; k < n; ++k)
            if (d[k]) ((T*)(d[k] + off))[i] = v;
    }
    __device__ __forceinline__ void byte(u64 j, unsigned char v) const {
        for (int k = 0; k < n; ++k)
            if (d[k]) d[k][j] = v;
    }
};

// Copies n bytes from src to `to` with the threads TH, W bytes an access: single bytes up to
// src's first W-byte boundary, words of W, then the bytes left (W: a width at which src and
// every destination are aligned alike). Sources are read with ld.cg: scratch is written by
// other GPUs, so L1 must not serve it.
template <unsigned W, typename TH, typename To>
__device__ __forceinline__ void copy_at(To to, const unsigned char* src, u64 n) {
    typedef typename Word<W>::T T;
    u64 head = (W - ((u64)src & (W - 1))) & (W - 1);
    head = head < n ? head : n;
    const u64 nw = (n - head) / W;
    for (u64 j = TH::tid(); j < head; j += TH::count()) to.byte(j, __ldcg(src + j));
    const T* s = (const T*)(src + head);
    for (u64 i = TH::tid(); i < nw; i += TH::count()) to.template word<T>(head, i, __ldcg(s + i));
    for (u64 j = head + nw * W + TH::tid(); j < n; j += TH::count()) to.byte(j, __ldcg(src + j));
}

// Bytes [m, m + 16) of the 32 bytes x then y (m in 1..15), as one 16-byte word: whole 32-bit
// words picked by m / 4 (two levels of selects, no indexed registers), then joined by funnel
// shifts of 8 * (m % 4) bits.
__device__ __forceinline__ uint4 shifted_word(uint4 x, uint4 y, unsigned m) {
    const unsigned z[8] = {x.x, x.y, x.z, x.w, y.x, y.y, y.z, y.w};
    unsigned w[6], v[5];
#pragma unroll
    for (int i = 0; i < 6; ++i) w[i] = (m & 8) ? z[i + 2] : z[i];
#pragma unroll
    for (int i = 0; i < 5; ++i) v[i] = (m & 4) ? w[i + 1] : w[i];
    const unsigned r = 8 * (m & 3);
    return make_uint4(__funnelshift_r(v[0], v[1], r), __funnelshift_r(v[1], v[2], r), __funnelshift_r(v[2], v[3], r),
                      __funnelshift_r(v[3], v[4], r));
}

// Bytes from which a copy between ends aligned differently is realigned (copy_shifted) rather
// than run at the widest width both share.
#define SHIFT_MIN_BYTES 256

// A copy whose destinations all lie `low` bytes past a 16-byte boundary and whose source does
// not: single bytes up to the destinations' boundary, then every store a whole 16-byte word,
// made from the two aligned source words it straddles (the second from the next lane by a
// shuffle, so each source word is loaded once; the last lane of a warp loads its own), then
// the bytes left. No load reaches past the source's end; the first may start up to 15 bytes
// before it, inside the same 16-byte block (so the same allocation and page). TH must be whole
// warps; n at least 47.
template <typename TH, typename To>
__device__ __forceinline__ void copy_shifted(To to, unsigned low, const unsigned char* src, u64 n) {
    const u64 head = (16 - low) & 15;
    for (u64 j = TH::tid(); j < head; j += TH::count()) to.byte(j, __ldcg(src + j));
    const unsigned m = (unsigned)((u64)(src + head) & 15ull);  // not 0: the ends differ mod 16
    const uint4* s = (const uint4*)(src + head - m);
    // Word i of the destination takes source words i and i + 1: i + 1 < (m + n - head) / 16.
    const u64 nw = (m + n - head) / 16 - 1;
    const unsigned lane = threadIdx.x & 31;
    for (u64 base = TH::tid() - lane; base < nw; base += TH::count()) {
        const u64 i = base + lane;
        const uint4 x = i <= nw ? __ldcg(s + i) : make_uint4(0, 0, 0, 0);
        uint4 y;
        y.x = __shfl_down_sync(0xffffffffu, x.x, 1);
        y.y = __shfl_down_sync(0xffffffffu, x.y, 1);
        y.z = __shfl_down_sync(0xffffffffu, x.z, 1);
        y.w = __shfl_down_sync(0xffffffffu, x.w, 1);
        if (lane == 31 && i < nw) y = __ldcg(s + i + 1);
        if (i < nw) to.template word<uint4>(head, i, shifted_word(x, y, m));
    }
    for (u64 j = head + nw * 16 + TH::tid(); j < n; j += TH::count()) to.byte(j, __ldcg(src + j));
}

// Whether copy_shifted may run for the threads TH: whole warps (the shuffles need every lane).
template <typename TH> __device__ __forceinline__ bool whole_warps() {
    return ((threadIdx.x - TH::tid()) & 31) == 0 && (TH::count() & 31) == 0;
}

// A copy whose ends are not all 16-byte aligned, out of line: the many callers of the copies
// inline only the path where every end is, so that path and the compile stay as they were.
// With SHIFT (only in the one-shot kernel for parts off a 16-byte boundary: in the others the
// larger callee costs the kernel's register allocation 2-3 % on aligned copies,
// docs/performance.md, "Unaligned copies and reductions"), destinations all aligned alike but
// not like the source go through copy_shifted; otherwise copy_at at the widest width src and
// every destination share (common_width).
template <typename TH, bool SHIFT, typename To>
__device__ __noinline__ void copy_unaligned(To to, unsigned w, const unsigned char* src, u64 n) {
    if (SHIFT && w < 16 && n >= SHIFT_MIN_BYTES && whole_warps<TH>()) {
        const unsigned low = to.low();
        if (low < 16) {
            copy_shifted<TH>(to, low, src, n);
            return;
        }
    }
    switch (w) {
        case 16: copy_at<16, TH>(to, src, n); break;
        case 8: copy_at<8, TH>(to, src, n); break;
        case 4: copy_at<4, TH>(to, src, n); break;
        case 2: copy_at<2, TH>(to, src, n); break;
        default: copy_at<1, TH>(to, src, n); break;
    }
}

// Copies n bytes within the block: 16-byte vectors where both ends are 16-byte aligned, else
// realigned (SHIFT) or at the widest width both share.
template <bool SHIFT = false>
__device__ void copy_bytes(unsigned char* dst, const unsigned char* src, u64 n) {
    if (n == 0 || dst == src) return;
    if (!(aligned16(dst) && aligned16(src))) {
        copy_unaligned<Block, SHIFT>(ToOne{dst}, common_width((u64)dst, (u64)src), src, n);
        return;
    }
    const u64 nv = n >> 4;
    uint4* d = (uint4*)dst;
    const uint4* s = (const uint4*)src;
    for (u64 i = threadIdx.x; i < nv; i += blockDim.x) d[i] = __ldcg(s + i);
    for (u64 j = (nv << 4) + threadIdx.x; j < n; j += blockDim.x) dst[j] = __ldcg(src + j);
}

// Copies n bytes to up to MAX_RANKS destinations (null entries skipped), reading once, with
// the threads TH: 16-byte vectors where every end is 16-byte aligned, else realigned (SHIFT,
// destinations aligned alike) or at the widest width all share.
template <typename TH = Block, bool SHIFT = false>
__device__ void copy_bytes_multi(unsigned char* const* dsts, int ndst, const unsigned char* src, u64 n) {
    if (n == 0) return;
    bool vec = aligned16(src);
    for (int k = 0; k < ndst; ++k) vec = vec && (dsts[k] == 0 || aligned16(dsts[k]));
    if (!vec) {
        unsigned w = 16;
        for (int k = 0; k < ndst; ++k) {
            const unsigned c = dsts[k] ? common_width((u64)dsts[k], (u64)src) : 16;
            w = c < w ? c : w;
        }
        copy_unaligned<TH, SHIFT>(ToMany{dsts, ndst}, w, src, n);
        return;
    }
    const u64 nv = n >> 4;
    const uint4* s = (const uint4*)src;
    for (u64 i = TH::tid(); i < nv; i += TH::count()) {
        const uint4 v = __ldcg(s + i);
        for (int k = 0; k < ndst; ++k)
            if (dsts[k]) ((uint4*)dsts[k])[i] = v;
    }
    for (u64 j = (nv << 4) + TH::tid(); j < n; j += TH::count()) {
        const unsigned char v = __ldcg(src + j);
        for (int k = 0; k < ndst; ++k)
            if (dsts[k]) dsts[k][j] = v;
    }
}

