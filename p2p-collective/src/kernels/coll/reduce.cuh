// Element loads past L1, 16-byte vectors and their accumulators, and the reductions of many
// elements in rank order (reduce_into), for every path that reduces through the SMs.
#pragma once
#include "redop.cuh"

// One element, read past L1 as copy_bytes reads (the scratch is written by other GPUs): by
// its bits, as an unsigned integer of its size.
template <typename T> __device__ __forceinline__ T ld_cg(const T* p) {
    static_assert(sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8, "element size");
    T v;
    if (sizeof(T) == 1) {
        const unsigned char u = __ldcg((const unsigned char*)p);
        memcpy(&v, &u, 1);
    } else if (sizeof(T) == 2) {
        const unsigned short u = __ldcg((const unsigned short*)p);
        memcpy(&v, &u, 2);
    } else if (sizeof(T) == 4) {
        const unsigned u = __ldcg((const unsigned*)p);
        memcpy(&v, &u, 4);
    } else {
        const unsigned long long u = __ldcg((const unsigned long long*)p);
        memcpy(&v, &u, 8);
    }
    return v;
}

template <typename T> union Vec {
    uint4 u;
    T t[16 / sizeof(T)];
};

// A 16-byte vector to and from its accumulators. f16 and bf16 convert two elements per
// instruction where the ISA allows (cvt.rn.{f16,bf16}x2.f32, sm_80+): these loops are on the
// bandwidth path of every 16-bit reduction.
template <typename T> struct Pack {
    typedef typename Ty<T>::acc A;
    static __device__ __forceinline__ void up(uint4 u, A* acc) {
        Vec<T> v;
        v.u = u;
#pragma unroll
        for (int e = 0; e < 16 / (int)sizeof(T); ++e) acc[e] = Ty<T>::up(v.t[e]);
    }
    static __device__ __forceinline__ uint4 down(const A* acc) {
        Vec<T> v;
#pragma unroll
        for (int e = 0; e < 16 / (int)sizeof(T); ++e) v.t[e] = Ty<T>::down(acc[e]);
        return v.u;
    }
};

// Element 2k is the low half of word k (little endian); cvt.rn.*x2.f32 d, a, b puts a in the
// upper half and b in the lower.
__device__ __forceinline__ unsigned pack2_bf16(float lo, float hi) {
    unsigned d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}
__device__ __forceinline__ unsigned pack2_f16(float lo, float hi) {
    unsigned d;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

template <> struct Pack<bhalf_t> {
    static __device__ __forceinline__ void up(uint4 u, float* acc) {
        const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            acc[2 * k] = __uint_as_float(w[k] << 16);
            acc[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
        }
    }
    static __device__ __forceinline__ uint4 down(const float* acc) {
        return make_uint4(pack2_bf16(acc[0], acc[1]), pack2_bf16(acc[2], acc[3]), pack2_bf16(acc[4], acc[5]),
                          pack2_bf16(acc[6], acc[7]));
    }
};

template <> struct Pack<half_t> {
    static __device__ __forceinline__ void up(uint4 u, float* acc) {
        Vec<half_t> v;
        v.u = u;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] = Ty<half_t>::up(v.t[e]);
    }
    static __device__ __forceinline__ uint4 down(const float* acc) {
        return make_uint4(pack2_f16(acc[0], acc[1]), pack2_f16(acc[2], acc[3]), pack2_f16(acc[4], acc[5]),
                          pack2_f16(acc[6], acc[7]));
    }
};

// Two 16-bit sources summed or multiplied: one packed fma per two elements. For two operands
// this is bit-for-bit the f32-then-round result (the f32 sum or product of two f16/bf16 values
// is exact or, where not, so far from a rounding boundary of the 16-bit type that both round
// the same way), so results do not depend on the path. fma.rn.{f16,bf16}x2: sm_53/sm_80+.
template <typename T, typename Func> struct Pair {
    static const bool ok = false;
    static __device__ __forceinline__ unsigned apply(unsigned x, unsigned) { return x; }
};
#define PAIR(T, Func, PTX, B, C)                                                                 \
    template <> struct Pair<T, Func> {                                                            \
        static const bool ok = true;                                                              \
        static __device__ __forceinline__ unsigned apply(unsigned x, unsigned y) {               \
            unsigned d;                                                                           \
            asm(PTX " %0, %1, %2, %3;" : "=r"(d) : "r"(x), "r"(B), "r"(C));                       \
            return d;                                                                             \
        }                                                                                         \
    };
// sum: x * 1 + y; product: x * y + (-0), which keeps the sign of a zero product.
PAIR(bhalf_t, FuncSum, "fma.rn.bf16x2", 0x3f803f80u, y)
PAIR(bhalf_t, FuncProd, "fma.rn.bf16x2", y, 0x80008000u)
PAIR(half_t, FuncSum, "fma.rn.f16x2", 0x3c003c00u, y)
PAIR(half_t, FuncProd, "fma.rn.f16x2", y, 0x80008000u)
#undef PAIR

// The vector loop of reduce_into for one reduction, known at compile time so that the loop
// body holds no branch on it.
template <typename T, typename Func, typename TH>
__device__ void reduce_vecs(uint4* out, unsigned char* const* extra, int nextra, const T* const* srcs, int nsrc,
                            u64 nv, int nranks) {
    typedef typename Ty<T>::acc A;
    const int E = 16 / sizeof(T);
    if (Pair<T, Func>::ok && nsrc == 2) {
        for (u64 i = TH::tid(); i < nv; i += TH::count()) {
            const uint4 x = __ldcg((const uint4*)srcs[0] + i);
            const uint4 y = __ldcg((const uint4*)srcs[1] + i);
            const uint4 v = make_uint4(Pair<T, Func>::apply(x.x, y.x), Pair<T, Func>::apply(x.y, y.y),
                                       Pair<T, Func>::apply(x.z, y.z), Pair<T, Func>::apply(x.w, y.w));
            out[i] = v;
            for (int k = 0; k < nextra; ++k) ((uint4*)extra[k])[i] = v;
        }
        return;
    }
    for (u64 i = TH::tid(); i < nv; i += TH::count()) {
        A acc[16 / sizeof(T)];
        Pack<T>::up(__ldcg((const uint4*)srcs[0] + i), acc);
        for (int k = 1; k < nsrc; ++k) {
            A w[16 / sizeof(T)];
            Pack<T>::up(__ldcg((const uint4*)srcs[k] + i), w);
#pragma unroll
            for (int e = 0; e < E; ++e) acc[e] = Func::apply(acc[e], w[e]);
        }
#pragma unroll
        for (int e = 0; e < E; ++e) acc[e] = Func::finish(acc[e], nranks);
        const uint4 v = Pack<T>::down(acc);
        out[i] = v;
        for (int k = 0; k < nextra; ++k) ((uint4*)extra[k])[i] = v;
    }
}

// out[i] (and every extra destination) = reduce over srcs[0..nsrc) in that order, for n
// elements, by the threads TH. The order is the same on every rank, so every rank gets the
// same bits.
template <typename T, typename TH = Block>
__device__ void reduce_into(T* out, unsigned char* const* extra, int nextra, const T* const* srcs, int nsrc, u64 n,
                            int op, int nranks) {
    typedef typename Ty<T>::acc A;
    const int E = 16 / sizeof(T);
    bool vec = aligned16(out);
    for (int k = 0; k < nsrc; ++k) vec = vec && aligned16(srcs[k]);
    for (int k = 0; k < nextra; ++k) vec = vec && aligned16(extra[k]);
    u64 head = 0;
    if (vec) {
        const u64 nv = n / E;
        uint4* o = (uint4*)out;
        with_redop(op, [&](auto func) {
            reduce_vecs<T, decltype(func), TH>(o, extra, nextra, srcs, nsrc, nv, nranks);
        });
        head = nv * E;
    }
    for (u64 j = head + TH::tid(); j < n; j += TH::count()) {
        A acc = Ty<T>::up(ld_cg(srcs[0] + j));
        for (int k = 1; k < nsrc; ++k) acc = combine<A>(op, acc, Ty<T>::up(ld_cg(srcs[k] + j)));
        const T r = Ty<T>::down(finish<A>(op, acc, nranks));
        out[j] = r;
        for (int k = 0; k < nextra; ++k) ((T*)extra[k])[j] = r;
    }
}

