// The push all-reduce into registered outputs (`Algo::Push`): two-shot's first step, then each
// rank writes its reduced part straight into every rank's output. Each block's piece splits into
// N parts of whole 16-byte vectors; in stage 0 rank q receives part q of every rank's piece in
// its scratch (a reduce-scatter by pushes); in stage 1 it reduces part q over every rank and
// writes the sum into part q of every rank's registered output (`peer_out`); a closing barrier
// tells every rank that its output is whole. Only writes cross between GPUs (the direct
// all-reduce reads its part from every peer), 2(n-1)/n of the data per rank, and no copy out of
// the scratch (docs/performance.md, "The push all-reduce"). The output may be the input (in
// place): rank q reads its input's part me in stage 0 of a chunk, before the barrier after
// which this rank writes it, and never reads part me of its input again.
#pragma once
#include "../copy.cuh"
#include "../entry.cuh"
#include "../reduce.cuh"
#include "../steps.cuh"

template <typename T>
__device__ void run_push(const CollArgs& a) {
    if (a.op != OP_ALLREDUCE) return;  // never planned
    SCRATCH_NAMES(T, a);
    run_staged<2, true>(a, [&](int k, u64 lo, u64 n, u64 whole, int wpar, int rpar) {
        const u64 sub = vector_parts<T>(whole, N);
        if (k == 0) {
            push_parts<T>(slot, wpar, me, N, in + lo, sub, n);
            return;
        }
        reduce_own_part<T>(a, slot, rpar, me, N, in + lo, out + lo, sub, n,
                           [&](int q, u64 mlo) { return a.peer_out[q] + (lo + mlo) * E; });
    });
}

COLL_ENTRY(push, run_push)
