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
    const int N = a.nranks, me = a.rank;
    const u64 E = sizeof(T);
    const T* in = (const T*)a.input;
    T* out = (T*)a.output;
    const Slots slot(a);
    run_staged<2, true>(a, [&](int k, u64 lo, u64 n, u64 whole, int wpar, int rpar) {
        const u64 vecs = 16 / E;
        const u64 sub = ((whole + N - 1) / N + vecs - 1) / vecs * vecs;
        if (k == 0) {
            for (int q = 0; q < N; ++q) {
                u64 qlo, qhi;
                part_of(q, sub, n, qlo, qhi);
                if (q != me) copy_bytes(slot(q, wpar, me) + qlo * E, (const unsigned char*)(in + lo + qlo), (qhi - qlo) * E);
            }
            return;
        }
        unsigned char* dsts[MAX_RANKS];
        const T* srcs[MAX_RANKS];
        u64 mlo, mhi;
        part_of(me, sub, n, mlo, mhi);
        int nd = 0;
        for (int q = 0; q < N; ++q)
            if (q != me) dsts[nd++] = a.peer_out[q] + (lo + mlo) * E;
        for (int r = 0; r < N; ++r)
            srcs[r] = r == me ? in + lo + mlo : (const T*)(slot(me, rpar, r) + mlo * E);
        reduce_into<T>(out + lo + mlo, dsts, nd, srcs, N, mhi - mlo, a.redop, N);
    });
}

COLL_ENTRY(push, run_push)
