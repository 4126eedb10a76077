// The direct algorithm on buffers every rank registered (`Algo::Direct`): no scratch and no
// barrier per chunk. A barrier at the start (every peer has entered this call: its input is
// ready and its output free) and one at the end (every write into this rank's output has
// landed, and every peer is done reading its input); in between, each block streams its share
// (docs/performance.md, "Registered buffers (direct)").
//   all-reduce      rank me owns part me (G pieces); block b reads piece b of it from every
//                   rank's input, reduces in rank order, and writes it into every rank's output
//   reduce-scatter  block b reads piece b of part me from every rank's input and reduces it
//   all-gather      block b writes piece b of its input into part me of every rank's output
//   all-to-all      block b writes piece b of its part q into part me of rank q's output
#pragma once
#include "../copy.cuh"
#include "../entry.cuh"
#include "../reduce.cuh"
#include "../steps.cuh"

template <typename T>
__device__ void run_direct(const CollArgs& a, u64 base, int* err) {
    const int N = a.nranks, me = a.rank, b = blockIdx.x;
    const u64 E = sizeof(T);
    u64 step = base;
    if (barrier(a, ++step, err)) return;
    unsigned char* dsts[MAX_RANKS];
    const T* srcs[MAX_RANKS];
    const u64 start = (a.op == OP_ALLREDUCE ? (u64)me * gridDim.x + b : (u64)b) * a.piece;
    const u64 lo = start < a.count ? start : a.count;
    const u64 hi = lo + a.piece < a.count ? lo + a.piece : a.count;
    const u64 seg = a.count * E;  // bytes of one rank's part (not used by all-reduce)
    switch (a.op) {
        case OP_ALLREDUCE: {
            int nd = 0;
            for (int r = 0; r < N; ++r) {
                srcs[r] = (const T*)(r == me ? a.input : a.peer_in[r]) + lo;
                if (r != me) dsts[nd++] = a.peer_out[r] + lo * E;
            }
            reduce_into<T>((T*)a.output + lo, dsts, nd, srcs, N, hi - lo, a.redop, N);
            break;
        }
        case OP_REDUCESCATTER: {
            for (int r = 0; r < N; ++r) srcs[r] = (const T*)((r == me ? a.input : a.peer_in[r]) + (u64)me * seg) + lo;
            reduce_into<T>((T*)a.output + lo, dsts, 0, srcs, N, hi - lo, a.redop, N);
            break;
        }
        case OP_ALLGATHER: {
            for (int q = 0; q < N; ++q) {
                unsigned char* d = (q == me ? a.output : a.peer_out[q]) + (u64)me * seg + lo;
                dsts[q] = d == a.input + lo ? 0 : d;  // in place, the own part is already there
            }
            copy_bytes_multi(dsts, N, a.input + lo, hi - lo);
            break;
        }
        case OP_ALLTOALL: {
            for (int k = 1; k <= N; ++k) {
                const int q = (me + k) % N;  // peers first, staggered, so ranks spread over targets
                copy_bytes((q == me ? a.output : a.peer_out[q]) + (u64)me * seg + lo, a.input + (u64)q * seg + lo, hi - lo);
            }
            break;
        }
        default:
            return;
    }
    if (barrier(a, ++step, err)) return;
    end_steps(a, step);
}

template <typename T> __device__ void entry_direct(const CollArgs& a) {
    with_counter(a, [&](u64 base, int* err) { run_direct<T>(a, base, err); });
}

COLL_ENTRY(direct, entry_direct)

