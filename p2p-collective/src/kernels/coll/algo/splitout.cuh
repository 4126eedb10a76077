// The split broadcast and reduce landing in registered outputs (`Algo::SplitOut`): the split of
// algo/split.cuh with no copy out of the scratch. Each block's piece splits into n-1 parts of
// whole 16-byte vectors; part j belongs to the j-th non-root (rank j, or j + 1 past the root).
// Every rank's output is registered (`peer_out`), at the same place of its window.
//   broadcast  stage 0: the root writes part j straight into the j-th non-root's output (and,
//              out of place, its input into its own output); stage 1: each non-root forwards
//              its part from its own output into the other non-roots' outputs
//   reduce     stage 0: every rank pushes part j of its input into its owner's scratch; stage 1:
//              each owner reduces its part over every rank, in rank order, straight into the
//              root's output
// The broadcast opens with a barrier (every peer has entered the call: its output is free before
// the root's first writes); a closing barrier then tells every rank that the writes into its
// output have landed (docs/performance.md, "The split into outputs"). Two stages a chunk
// (steps.cuh, run_staged).
// Overlapped, stage 0 of chunk c + 1 and stage 1 of chunk c write different chunks of the
// outputs, and only stage 0 writes the scratch (reduce), so nothing written in one step is read
// in it. In place: the broadcast root's input is its output, which nothing else writes; the
// reduce root reads part j of its input in stage 0 of a chunk, before the barrier after which
// the j-th owner writes it, and never reads it again.
#pragma once
#include "../copy.cuh"
#include "../entry.cuh"
#include "../reduce.cuh"
#include "../steps.cuh"

template <typename T>
__device__ void run_splitout(const CollArgs& a) {
    if (a.op != OP_BROADCAST && a.op != OP_REDUCE) return;  // never planned
    SCRATCH_NAMES(T, a);
    const bool root = me == a.root;
    run_staged<2, true>(a, [&](int k, u64 lo, u64 n, u64 whole, int wpar, int rpar) {
        const u64 vecs = 16 / E;
        const u64 sub = ((whole + N - 2) / (N - 1) + vecs - 1) / vecs * vecs;
        if (a.op == OP_BROADCAST) {
            if (k == 0 && root) {
                for (int j = 0; j < N - 1; ++j) {
                    u64 jlo, jhi;
                    part_of(j, sub, n, jlo, jhi);
                    copy_bytes(a.peer_out[nonroot_rank(j, a.root)] + (lo + jlo) * E, (const unsigned char*)(in + lo + jlo), (jhi - jlo) * E);
                }
                if ((const T*)out != in) copy_bytes((unsigned char*)(out + lo), (const unsigned char*)(in + lo), n * E);
            } else if (k == 1 && !root) {
                unsigned char* dsts[MAX_RANKS];
                u64 mlo, mhi;
                part_of(nonroot_index(me, a.root), sub, n, mlo, mhi);
                int nd = 0;
                for (int q = 0; q < N; ++q)
                    if (q != me && q != a.root) dsts[nd++] = a.peer_out[q] + (lo + mlo) * E;
                copy_bytes_multi(dsts, nd, (const unsigned char*)(out + lo + mlo), (mhi - mlo) * E);
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
            reduce_into<T>((T*)(a.peer_out[a.root] + (lo + mlo) * E), dsts, 0, srcs, N, mhi - mlo, a.redop, N);
        }
    }, a.op == OP_BROADCAST);
}

COLL_ENTRY(splitout, run_splitout)
