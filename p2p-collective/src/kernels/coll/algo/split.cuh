// Broadcast and reduce on more than two ranks with the data split among the non-roots
// (`Algo::Split`), so that every GPU's links carry the data about once instead of the root's
// carrying it n-1 times. Each block's piece splits into n-1 parts of whole 16-byte vectors;
// part j belongs to the j-th non-root (rank j, or j + 1 past the root).
//   broadcast  step 1: the root sends each non-root its part; step 2: each non-root writes its
//              part out and forwards it to the other non-roots
//   reduce     step 1: every rank sends part j to its owner; step 2: each owner reduces its part
//              over every rank, in rank order, straight into the root's scratch; the root copies
// (docs/performance.md, "Two-shot and the split broadcast and reduce"). Three stages a chunk
// (steps.cuh, run_staged): the two steps above, then the copies out of the scratch; the root's
// copy of its own input runs in the second. Overlapped, the two stages of one step
// that write peers' slots write them from different sources (broadcast: the root's stage 0, a
// non-root's stage 1) or into different ranks (reduce: the owners' in stage 0, the root's in
// stage 1, and the root owns no part).
#pragma once
#include "../copy.cuh"
#include "../entry.cuh"
#include "../reduce.cuh"
#include "../steps.cuh"

template <typename T>
__device__ void run_split(const CollArgs& a) {
    if (a.op != OP_BROADCAST && a.op != OP_REDUCE) return;  // never planned
    SCRATCH_NAMES(T, a);
    const bool root = me == a.root;
    run_staged<3>(a, [&](int k, u64 lo, u64 n, u64 whole, int wpar, int rpar) {
        const u64 vecs = 16 / E;
        const u64 sub = ((whole + N - 2) / (N - 1) + vecs - 1) / vecs * vecs;
        if (a.op == OP_BROADCAST) {
            if (k == 0 && root) {
                for (int j = 0; j < N - 1; ++j) {
                    u64 jlo, jhi;
                    part_of(j, sub, n, jlo, jhi);
                    copy_bytes(slot(nonroot_rank(j, a.root), wpar, me) + jlo * E, (const unsigned char*)(in + lo + jlo), (jhi - jlo) * E);
                }
            } else if (k == 1 && root) {
                copy_bytes((unsigned char*)(out + lo), (const unsigned char*)(in + lo), n * E);
            } else if (k == 1) {
                unsigned char* dsts[MAX_RANKS];
                u64 mlo, mhi;
                part_of(nonroot_index(me, a.root), sub, n, mlo, mhi);
                int nd = 0;
                dsts[nd++] = (unsigned char*)(out + lo + mlo);
                for (int q = 0; q < N; ++q)
                    if (q != me && q != a.root) dsts[nd++] = slot(q, wpar, me) + mlo * E;
                copy_bytes_multi(dsts, nd, slot(me, rpar, a.root) + mlo * E, (mhi - mlo) * E);
            } else if (k == 2 && !root) {
                for (int q = 0; q < N; ++q) {
                    if (q == me || q == a.root) continue;
                    u64 qlo, qhi;
                    part_of(nonroot_index(q, a.root), sub, n, qlo, qhi);
                    copy_bytes((unsigned char*)(out + lo + qlo), slot(me, rpar, q) + qlo * E, (qhi - qlo) * E);
                }
            }
            return;
        }
        if (k == 0) {
            for (int j = 0; j < N - 1; ++j) {
                const int q = nonroot_rank(j, a.root);
                if (q == me) continue;
                u64 jlo, jhi;
                part_of(j, sub, n, jlo, jhi);
                copy_bytes(slot(q, wpar, me) + jlo * E, (const unsigned char*)(in + lo + jlo), (jhi - jlo) * E);
            }
        } else if (k == 1 && !root) {
            unsigned char* dsts[MAX_RANKS];
            const T* srcs[MAX_RANKS];
            u64 mlo, mhi;
            part_of(nonroot_index(me, a.root), sub, n, mlo, mhi);
            for (int r = 0; r < N; ++r)
                srcs[r] = r == me ? in + lo + mlo : (const T*)(slot(me, rpar, r) + mlo * E);
            reduce_into<T>((T*)(slot(a.root, wpar, me) + mlo * E), dsts, 0, srcs, N, mhi - mlo, a.redop, N);
        } else if (k == 2 && root) {
            for (int q = 0; q < N; ++q) {
                if (q == me) continue;
                u64 qlo, qhi;
                part_of(nonroot_index(q, a.root), sub, n, qlo, qhi);
                copy_bytes((unsigned char*)(out + lo + qlo), slot(me, rpar, q) + qlo * E, (qhi - qlo) * E);
            }
        }
    });
}

COLL_ENTRY(split, run_split)
