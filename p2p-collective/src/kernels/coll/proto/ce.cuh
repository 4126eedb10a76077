// The copy-engine protocol (`Proto::CopyEngine`): the copy engines move the data
// (`cuMemcpyAsync` into the peers' registered outputs, queued by the host); these kernels are
// its barriers, and the reduction of the all-reduce on two ranks
// (docs/performance.md, "Copy engines for all-gather and all-to-all" and "The copy-engine
// all-reduce on two ranks").
#pragma once
#include "../entry.cuh"
#include "../reduce.cuh"
#include "../steps.cuh"

// The barrier kernel around the copies (one block): two barriers with every peer and no data.
// Before the copies, every rank has entered the call (every buffer is free); after them (not
// for the all-reduce, whose reduction waits for each chunk's flag), every copy into this rank's
// output has landed. A failure is recorded under the plan's own code, so it names the
// collective.
template <typename T>
__device__ void entry_ce_barrier(const CollArgs& a) {
    with_counter(a, [&](u64 base, int* err) {
        u64 step = base;
        if (barrier(a, ++step, err)) return;
        if (barrier(a, ++step, err)) return;
        end_steps(a, step);
    });
}

// Elements [lo, hi) of chunk k of a copy-engine all-reduce of n elements of e bytes (see
// CE_FLAGS_OFF in coll_abi.h); the planner's `ce_chunk` (plan/shape.rs) is the same formula.
__device__ __forceinline__ void ce_chunk(int k, u64 n, u64 e, u64& lo, u64& hi) {
    const u64 align = CE_ALIGN / e;
    lo = k == 0 ? 0 : (n - (n >> k)) / align * align;
    hi = k == CE_CHUNKS - 1 ? n : (n - (n >> (k + 1))) / align * align;
}

// op(x, y) of two vectors of T, x from the lower rank: reduce_vecs's arithmetic for two sources.
template <typename T, typename Func>
__device__ __forceinline__ uint4 vec_op(uint4 x, uint4 y) {
    typedef typename Ty<T>::acc A;
    if (Pair<T, Func>::ok) {
        return make_uint4(Pair<T, Func>::apply(x.x, y.x), Pair<T, Func>::apply(x.y, y.y),
                          Pair<T, Func>::apply(x.z, y.z), Pair<T, Func>::apply(x.w, y.w));
    }
    const int E = 16 / sizeof(T);
    A a[16 / sizeof(T)], b[16 / sizeof(T)];
    Pack<T>::up(x, a);
    Pack<T>::up(y, b);
#pragma unroll
    for (int e = 0; e < E; ++e) a[e] = Func::finish(Func::apply(a[e], b[e]), 2);
    return Pack<T>::down(a);
}

// Vectors [lo, hi) of a copy-engine all-reduce chunk over the whole grid, four in flight per
// thread: out = op(rank 0's, rank 1's), this rank's from `in` (read once: streaming), the
// peer's from `out` (landed there by the copy engines: L2, never L1).
template <typename T, typename Func>
__device__ void ce_reduce_vecs(uint4* out, const uint4* in, u64 lo, u64 hi, int me) {
    const u64 stride = (u64)gridDim.x * blockDim.x;
    u64 i = lo + (u64)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < hi; i += 4 * stride) {
        uint4 x[4], y[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            x[u] = __ldcs(in + i + u * stride);
            y[u] = __ldcg(out + i + u * stride);
        }
#pragma unroll
        for (int u = 0; u < 4; ++u)
            __stcg(out + i + u * stride, me == 0 ? vec_op<T, Func>(x[u], y[u]) : vec_op<T, Func>(y[u], x[u]));
    }
    for (; i < hi; i += stride) {
        const uint4 x = __ldcs(in + i), y = __ldcg(out + i);
        __stcg(out + i, me == 0 ? vec_op<T, Func>(x, y) : vec_op<T, Func>(y, x));
    }
}

// The all-reduce by the copy engines, two ranks: this kernel on a stream of its own beside the
// copies (the host's `call/copy_engine.rs`): for each chunk,
// wait until the peer's copy of it has landed in this rank's output (its flag), then reduce
// this rank's input into it, the two sources in rank order, as every other path does. Aligned
// buffers: the whole grid strides over the chunk's vectors, four in flight per thread (one
// vector a round over contiguous block shares measured 125 us slower a call at 256 MiB-1 GiB:
// docs/performance.md, "The copy-engine all-reduce on two ranks"), and block 0 takes the elements past the last whole vector; otherwise block
// b reduces the b-th share with reduce_into. No step counter: the barrier kernel before the
// copies is the call's only step.
template <typename T>
__device__ void run_ce_reduce(const CollArgs& a, int* err) {
    const int me = a.rank, G = gridDim.x, b = blockIdx.x;
    const u64 E = sizeof(T), V = 16 / sizeof(T);
    volatile u64* flags = a.sync[me] + CE_FLAGS_OFF;
    T* out = (T*)a.output;
    const T* in = (const T*)a.input;
    const bool vec = aligned16(out) && aligned16(in);
    for (int k = 0; k < CE_CHUNKS; ++k) {
        if (threadIdx.x == 0) {
            const int e = wait_ge(a, flags + k, 1);
            fence_sys();  // acquire: the copy landed before the peer's stream wrote the flag
            if (e) {
                if (e != F_ELSEWHERE) record_failure(a, e, 1 - me, 0);
                *err = e;
            }
        }
        __syncthreads();
        if (*err) return;
        u64 lo, hi;
        ce_chunk(k, a.count, E, lo, hi);
        if (vec) {
            // lo is a chunk edge (a multiple of CE_ALIGN bytes); hi is one too, or the end.
            const u64 vlo = lo / V, vhi = hi / V;
            uint4* o = (uint4*)out;
            const uint4* x = (const uint4*)in;
            with_redop(a.redop, [&](auto func) { ce_reduce_vecs<T, decltype(func)>(o, x, vlo, vhi, me); });
            if (b == 0) {
                typedef typename Ty<T>::acc A;
                for (u64 j = vhi * V + threadIdx.x; j < hi; j += blockDim.x) {
                    const A mine = Ty<T>::up(in[j]), peer = Ty<T>::up(out[j]);
                    const A r = me == 0 ? combine<A>(a.redop, mine, peer) : combine<A>(a.redop, peer, mine);
                    out[j] = Ty<T>::down(finish<A>(a.redop, r, 2));
                }
            }
        } else {
            const u64 share = ((hi - lo + G - 1) / G + V - 1) / V * V;
            const u64 blo = lo + (u64)b * share < hi ? lo + (u64)b * share : hi;
            const u64 bhi = blo + share < hi ? blo + share : hi;
            const T* srcs[2];
            srcs[me] = in + blo;
            srcs[1 - me] = out + blo;  // the peer's input, copied here
            reduce_into<T>(out + blo, nullptr, 0, srcs, 2, bhi - blo, a.redop, 2);
        }
        __syncthreads();
    }
}

// The reduction kernel has an entry point of its own: in the direct kernel its unrolled loop
// made ptxas spill.
template <typename T> __device__ void entry_ce_reduce(const CollArgs& a) {
    with_counter(a, [&](u64, int* err) { run_ce_reduce<T>(a, err); });
}

COLL_ENTRY(ce_barrier, entry_ce_barrier)
COLL_ENTRY(ce_reduce, entry_ce_reduce)
