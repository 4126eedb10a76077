// Broadcast and reduce on more than two ranks with the data split among the non-roots
// (`Algo::Split`), so that every GPU's links carry the data about once instead of the root's
// carrying it n-1 times. Each block's piece splits into n-1 parts of whole 16-byte vectors;
// part j belongs to the j-th non-root (rank j, or j + 1 past the root).
//   broadcast  step 1: the root sends each non-root its part; step 2: each non-root writes its
//              part out and forwards it to the other non-roots
//   reduce     step 1: every rank sends part j to its owner; step 2: each owner reduces its part
//              over every rank, in rank order, straight into the root's scratch; the root copies
// (docs/performance.md, "Two-shot and the split broadcast and reduce").
#pragma once
#include "../copy.cuh"
#include "../entry.cuh"
#include "../reduce.cuh"
#include "../steps.cuh"

template <typename T>
__device__ void run_split(const CollArgs& a) {
    if (a.op != OP_BROADCAST && a.op != OP_REDUCE) return;  // never planned
    const int N = a.nranks, me = a.rank;
    const u64 E = sizeof(T);
    const T* in = (const T*)a.input;
    T* out = (T*)a.output;
    const Slots slot(a);
    run_stepped(a, [&](u64 lo, u64 n, u64& step, int* err) -> int {
        unsigned char* dsts[MAX_RANKS];
        const T* srcs[MAX_RANKS];
        const u64 vecs = 16 / E;
        const u64 sub = ((n + N - 2) / (N - 1) + vecs - 1) / vecs * vecs;
        const int par1 = (int)((step + 1) & 1), par2 = (int)((step + 2) & 1);
        if (a.op == OP_BROADCAST) {
            if (me == a.root) {
                for (int j = 0; j < N - 1; ++j) {
                    const int q = nonroot_rank(j, a.root);
                    u64 jlo, jhi;
                    part_of(j, sub, n, jlo, jhi);
                    copy_bytes(slot(q, par1, me) + jlo * E, (const unsigned char*)(in + lo + jlo), (jhi - jlo) * E);
                }
            }
            signal_peers(a, ++step);  // the root's own copy runs while its signal travels
            if (me == a.root) copy_bytes((unsigned char*)(out + lo), (const unsigned char*)(in + lo), n * E);
            if (wait_peers(a, step, err)) return 1;
            if (me != a.root) {
                const int j = nonroot_index(me, a.root);
                u64 mlo, mhi;
                part_of(j, sub, n, mlo, mhi);
                int nd = 0;
                dsts[nd++] = (unsigned char*)(out + lo + mlo);
                for (int q = 0; q < N; ++q)
                    if (q != me && q != a.root) dsts[nd++] = slot(q, par2, me) + mlo * E;
                copy_bytes_multi(dsts, nd, slot(me, par1, a.root) + mlo * E, (mhi - mlo) * E);
            }
            if (barrier(a, ++step, err)) return 1;
            if (me != a.root) {
                for (int q = 0; q < N; ++q) {
                    if (q == me || q == a.root) continue;
                    const int j = nonroot_index(q, a.root);
                    u64 qlo, qhi;
                    part_of(j, sub, n, qlo, qhi);
                    copy_bytes((unsigned char*)(out + lo + qlo), slot(me, par2, q) + qlo * E, (qhi - qlo) * E);
                }
            }
            return 0;
        }
        for (int j = 0; j < N - 1; ++j) {
            const int q = nonroot_rank(j, a.root);
            if (q == me) continue;
            u64 jlo, jhi;
            part_of(j, sub, n, jlo, jhi);
            copy_bytes(slot(q, par1, me) + jlo * E, (const unsigned char*)(in + lo + jlo), (jhi - jlo) * E);
        }
        if (barrier(a, ++step, err)) return 1;
        if (me != a.root) {
            const int j = nonroot_index(me, a.root);
            u64 mlo, mhi;
            part_of(j, sub, n, mlo, mhi);
            for (int r = 0; r < N; ++r)
                srcs[r] = r == me ? in + lo + mlo : (const T*)(slot(me, par1, r) + mlo * E);
            reduce_into<T>((T*)(slot(a.root, par2, me) + mlo * E), dsts, 0, srcs, N, mhi - mlo, a.redop, N);
        }
        if (barrier(a, ++step, err)) return 1;
        if (me == a.root) {
            for (int q = 0; q < N; ++q) {
                if (q == me) continue;
                const int j = nonroot_index(q, a.root);
                u64 qlo, qhi;
                part_of(j, sub, n, qlo, qhi);
                copy_bytes((unsigned char*)(out + lo + qlo), slot(me, par2, q) + qlo * E, (qhi - qlo) * E);
            }
        }
        return 0;
    });
}

COLL_ENTRY(split, run_split)
