// Two-shot all-reduce through the scratch (`Algo::TwoShot`): each block's piece splits into N
// parts of whole 16-byte vectors; in step 1 rank q receives part q of every rank's piece and
// reduces it (a reduce-scatter), in step 2 it hands the result to every rank (an all-gather):
// 2(n-1)/n of the data per rank in two steps (docs/performance.md, "Two-shot and the split
// broadcast and reduce"). Three stages a chunk (steps.cuh, run_staged): 0 pushes part q to rank q;
// 1 reduces part `me` into the output and pushes it to every peer; 2 copies the peers' parts
// out. Overlapped, stage 0 of chunk c + 1 and stage 1 of chunk c write a peer's slot from this
// rank at parts q and `me`, never the same.
#pragma once
#include "../copy.cuh"
#include "../entry.cuh"
#include "../reduce.cuh"
#include "../steps.cuh"

template <typename T>
__device__ void run_twoshot(const CollArgs& a) {
    if (a.op != OP_ALLREDUCE) return;  // never planned
    const int N = a.nranks, me = a.rank;
    const u64 E = sizeof(T);
    const T* in = (const T*)a.input;
    T* out = (T*)a.output;
    const Slots slot(a);
    run_staged<3>(a, [&](int k, u64 lo, u64 n, u64 whole, int wpar, int rpar) {
        const u64 vecs = 16 / E;
        const u64 sub = ((whole + N - 1) / N + vecs - 1) / vecs * vecs;
        if (k == 0) {
            for (int q = 0; q < N; ++q) {
                u64 qlo, qhi;
                part_of(q, sub, n, qlo, qhi);
                if (q != me) copy_bytes(slot(q, wpar, me) + qlo * E, (const unsigned char*)(in + lo + qlo), (qhi - qlo) * E);
            }
        } else if (k == 1) {
            unsigned char* dsts[MAX_RANKS];
            const T* srcs[MAX_RANKS];
            u64 mlo, mhi;
            part_of(me, sub, n, mlo, mhi);
            int nd = 0;
            for (int q = 0; q < N; ++q)
                if (q != me) dsts[nd++] = slot(q, wpar, me) + mlo * E;
            for (int r = 0; r < N; ++r)
                srcs[r] = r == me ? in + lo + mlo : (const T*)(slot(me, rpar, r) + mlo * E);
            reduce_into<T>(out + lo + mlo, dsts, nd, srcs, N, mhi - mlo, a.redop, N);
        } else {
            for (int q = 0; q < N; ++q) {
                if (q == me) continue;
                u64 qlo, qhi;
                part_of(q, sub, n, qlo, qhi);
                copy_bytes((unsigned char*)(out + lo + qlo), slot(me, rpar, q) + qlo * E, (qhi - qlo) * E);
            }
        }
    });
}

COLL_ENTRY(twoshot, run_twoshot)
