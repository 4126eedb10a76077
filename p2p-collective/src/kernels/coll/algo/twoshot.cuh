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
    SCRATCH_NAMES(T, a);
    run_staged<3>(a, [&](int k, u64 lo, u64 n, u64 whole, int wpar, int rpar) {
        const u64 sub = vector_parts<T>(whole, N);
        if (k == 0) {
            push_parts<T>(slot, wpar, me, N, in + lo, sub, n);
        } else if (k == 1) {
            reduce_own_part<T>(a, slot, rpar, me, N, in + lo, out + lo, sub, n,
                               [&](int q, u64 mlo) { return slot(q, wpar, me) + mlo * E; });
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
