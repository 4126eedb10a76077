// The frame of the kernels that keep a step counter per block (every kernel but LL's and the
// send/recv kernel): the counter and the failure word read at the start, the scratch regions,
// and the chunk loops of the stepped algorithms: chunk by chunk (`run_stepped`), or stage by
// stage with the chunks' steps overlapped (`run_staged`).
#pragma once
#include "copy.cuh"
#include "reduce.cuh"
#include "sync.cuh"

// This block's regions of the ranks' scratch: `slot(r, par, src)` is its region of rank r's
// scratch for parity `par` and source rank `src`. Block b's region starts at b * stride (the
// tuning's largest piece) whatever this call's piece, so it is only ever used by block b, on
// every rank: blocks' counters differ after calls of different grids, and the parity argument
// of base.cuh holds per block. (The world size and block index are read once, into registers:
// read at each use they cost the two-shot kernel more spills.)
struct Slots {
    const CollArgs& a;
    const int n, b;
    __device__ __forceinline__ explicit Slots(const CollArgs& args) : a(args), n(args.nranks), b(blockIdx.x) {}
    __device__ __forceinline__ unsigned char* operator()(int r, int par, int src) const {
        return a.scratch[r] + ((u64)par * n + src) * a.slot_bytes + (u64)b * a.stride;
    }
};

// The names every algorithm over the scratch works under, declared first in its body: the
// world `N`, this rank `me`, `E` bytes an element, the typed buffers `in` and `out`, and this
// block's scratch regions `slot`.
#define SCRATCH_NAMES(T, a)                  \
    const int N = (a).nranks, me = (a).rank; \
    const u64 E = sizeof(T);                 \
    const T* in = (const T*)(a).input;       \
    T* out = (T*)(a).output;                 \
    const Slots slot(a)

// Elements in each of `N` parts of `n`, rounded up to whole 16-byte vectors (the last part is the
// shorter one): how the two-shot kinds and the ring split a piece among the ranks.
template <typename T> __device__ __forceinline__ u64 vector_parts(u64 n, int N) {
    constexpr u64 vecs = 16 / sizeof(T);
    return ((n + N - 1) / N + vecs - 1) / vecs * vecs;
}

// The first step of the two-shot kinds, a reduce-scatter by pushes: part q (of `sub` elements)
// of the `n` elements at `src` into rank q's slot of parity `par` from this rank, every peer q.
template <typename T>
__device__ __forceinline__ void push_parts(const Slots& slot, int par, int me, int N, const T* src, u64 sub, u64 n) {
    for (int q = 0; q < N; ++q) {
        u64 qlo, qhi;
        part_of(q, sub, n, qlo, qhi);
        if (q != me) copy_bytes(slot(q, par, me) + qlo * sizeof(T), (const unsigned char*)(src + qlo), (qhi - qlo) * sizeof(T));
    }
}

// The second step of the two-shot kinds: this rank's part of the `n` elements of a piece (its
// input `in`, its output `out`), reduced over its input and what each peer pushed into its slots
// of parity `par`, written to `out` and to `dst(q, lo)` for each peer q, `lo` the part's first
// element.
template <typename T, typename Dst>
__device__ __forceinline__ void reduce_own_part(const CollArgs& a, const Slots& slot, int par, int me, int N, const T* in,
                                                T* out, u64 sub, u64 n, Dst dst) {
    unsigned char* dsts[MAX_RANKS];
    const T* srcs[MAX_RANKS];
    u64 lo, hi;
    part_of(me, sub, n, lo, hi);
    int nd = 0;
    for (int q = 0; q < N; ++q)
        if (q != me) dsts[nd++] = dst(q, lo);
    for (int r = 0; r < N; ++r) srcs[r] = r == me ? in + lo : (const T*)(slot(me, par, r) + lo * sizeof(T));
    reduce_into<T>(out + lo, dsts, nd, srcs, N, hi - lo, a.redop, N);
}

// The chunks of a call: rounds over the data in which block b takes the `piece` elements from
// chunk * grid * piece + b * piece (fewer at the end).
__device__ __forceinline__ u64 call_chunks(const CollArgs& a) {
    const u64 span = a.piece * (u64)gridDim.x;
    return (a.count + span - 1) / span;
}

// This block's piece of chunk c: elements [lo, lo + n) of the call (empty past its end).
__device__ __forceinline__ void chunk_piece(const CollArgs& a, u64 c, u64& lo, u64& n) {
    const u64 lo0 = c * a.piece * (u64)gridDim.x + (u64)blockIdx.x * a.piece;
    lo = lo0 < a.count ? lo0 : a.count;
    n = (lo + a.piece < a.count ? lo + a.piece : a.count) - lo;
}

// body(base, err) for this block, `base` its step counter and `*err` a word the block shares
// (the first failure it meets), unless an earlier call failed: the communicator is then
// unusable, and the kernel drains at once.
template <typename Body> __device__ __forceinline__ void with_counter(const CollArgs& a, Body body) {
    __shared__ int err;
    __shared__ u64 base;
    u64* mine = a.sync[a.rank];
    if (threadIdx.x == 0) {
        err = (int)((volatile u64*)mine)[FAIL_OFF];
        base = mine[COUNTERS_OFF + blockIdx.x];
    }
    __syncthreads();
    if (err) return;
    body(base, &err);
}

// The block's last step becomes its counter (every thread of the block is past its steps).
__device__ __forceinline__ void end_steps(const CollArgs& a, u64 step) {
    __syncthreads();
    if (threadIdx.x == 0) a.sync[a.rank][COUNTERS_OFF + blockIdx.x] = step;
}

// A stepped algorithm through the scratch: `chunks` rounds over the data; in each, block b
// takes the `piece` elements from chunk * grid * piece + b * piece (fewer at the end), and
// chunk(lo, n, step, err) moves them, advancing `step` by the barriers it takes; a nonzero
// return ends the call (a failure, recorded where it happened).
template <typename Chunk> __device__ __forceinline__ void run_stepped(const CollArgs& a, Chunk chunk) {
    with_counter(a, [&](u64 base, int* err) {
        u64 step = base;
        const u64 chunks = call_chunks(a);
        for (u64 c = 0; c < chunks; ++c) {
            u64 lo, n;
            chunk_piece(a, c, lo, n);
            if (chunk(lo, n, step, err)) return;
        }
        end_steps(a, step);
    });
}

// A stepped algorithm of STAGES stages a chunk, with a barrier over every peer between one stage
// and the next. stage(k, lo, n, whole, wpar, rpar) runs stage k of block b's piece of a chunk
// (the n elements at lo): it writes the peers' slots of parity `wpar` and reads this rank's of
// parity `rpar` (what the peers wrote in the step before), and cuts its parts from `whole`
// elements.
//   in turn (`a.overlap` 0): each chunk's stages one after another, STAGES - 1 barriers a
//     chunk; parts cut from the chunk's own n.
//   overlapped: step t runs stage k of chunk t - k for every k, then one barrier, so that chunk
//     c + 1 travels while chunk c is reduced and chunk c - 1 copied out: chunks + STAGES - 2
//     barriers in all. Parts are cut from the whole piece, so that every chunk's part j lies at
//     the same place of a slot; the stages of one step write different parts or slots of
//     different sources (each algorithm says which), and a slot of parity p is written again
//     two barriers later, after every peer has read it.
// (docs/performance.md, "Overlapped steps".)
// With CLOSE, one barrier more after the last stage: what the peers wrote straight into this
// rank's own buffers (its registered output) has landed before the kernel ends. With `open`,
// one barrier before the first stage: every peer has entered the call, so that its registered
// output is free before the first stage writes into it.
template <int STAGES, bool CLOSE = false, typename Stage>
__device__ __forceinline__ void run_staged(const CollArgs& a, Stage stage, bool open = false) {
    with_counter(a, [&](u64 base, int* err) {
        u64 step = base;
        if (open && barrier(a, ++step, err)) return;
        const u64 chunks = call_chunks(a);
        const auto run = [&](int k, u64 c) {
            u64 lo, n;
            chunk_piece(a, c, lo, n);
            stage(k, lo, n, a.overlap ? a.piece : n, (int)((step + 1) & 1), (int)(step & 1));
        };
        if (!a.overlap) {
            for (u64 c = 0; c < chunks; ++c) {
                for (int k = 0; k < STAGES; ++k) {
                    if (k > 0 && barrier(a, ++step, err)) return;
                    run(k, c);
                }
            }
        } else {
            for (u64 t = 0; t + 1 < chunks + STAGES; ++t) {
                if (t > 0 && barrier(a, ++step, err)) return;
                for (int k = 0; k < STAGES; ++k)
                    if (t >= (u64)k && t - k < chunks) run(k, t - k);
            }
        }
        if (CLOSE && barrier(a, ++step, err)) return;
        end_steps(a, step);
    });
}
