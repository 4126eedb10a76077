// The relayed broadcast into registered outputs (`Algo::Relay`): the split into outputs'
// broadcast (algo/splitout.cuh) with a ready flag per chunk instead of a barrier over every peer
// between chunks. Each block's piece of a chunk splits into n-1 parts of whole 16-byte vectors;
// part j belongs to the j-th non-root (rank j, or j + 1 past the root). Every rank's output is
// registered (`peer_out`), at the same place of its window.
//   open     one barrier: every peer has entered the call (its output is free)
//   root     chunk by chunk, writes part j straight into the j-th non-root's output and flags
//            it (step open + 1 + c), never waiting: chunk c + 1 leaves while the non-roots
//            forward chunk c
//   non-root chunk by chunk, waits for the root's flag, forwards its part from its own output
//            into the other non-roots' outputs; after the last chunk it flags the other
//            non-roots (step open + chunks) and waits for their flags (everything written into
//            its output has landed)
// Nothing is written twice and no scratch is used, so no flag needs an answer; the next call's
// opening barrier keeps a rank that finished early (the root) from writing into a peer that has
// not. A peer's flag may already hold its next call's opening step (it signals that before
// waiting): in checking mode every word up to this call's last step is compared (`last` of
// wait_one), and a later one left to the next call's barrier (docs/performance.md, "The relayed
// broadcast").
#pragma once
#include "../copy.cuh"
#include "../entry.cuh"
#include "../steps.cuh"

// Block b's part of chunk c: elements [lo, lo + n) of the call, parts of `sub` elements.
struct RelayChunk {
    u64 lo, n, sub;
};

template <typename T> __device__ __forceinline__ RelayChunk relay_chunk(const CollArgs& a, u64 c) {
    const u64 span = a.piece * (u64)gridDim.x;
    const u64 lo0 = c * span + (u64)blockIdx.x * a.piece;
    const u64 lo = lo0 < a.count ? lo0 : a.count;
    const u64 n = (lo + a.piece < a.count ? lo + a.piece : a.count) - lo;
    const u64 vecs = 16 / sizeof(T);
    const int N = a.nranks;
    return RelayChunk{lo, n, ((n + N - 2) / (N - 1) + vecs - 1) / vecs * vecs};
}

template <typename T>
__device__ void run_relay(const CollArgs& a) {
    if (a.op != OP_BROADCAST) return;  // never planned
    const int N = a.nranks, me = a.rank, root = a.root;
    const u64 E = sizeof(T);
    const T* in = (const T*)a.input;
    T* out = (T*)a.output;
    with_counter(a, [&](u64 base, int* err) {
        const u64 open = base + 1;
        if (barrier(a, open, err)) return;
        const u64 span = a.piece * (u64)gridDim.x;
        const u64 chunks = (a.count + span - 1) / span;
        const int p = threadIdx.x;
        const bool peer = p < N && p != me;
        if (me == root) {
            for (u64 c = 0; c < chunks; ++c) {
                const RelayChunk k = relay_chunk<T>(a, c);
                for (int j = 0; j < N - 1; ++j) {
                    u64 jlo, jhi;
                    part_of(j, k.sub, k.n, jlo, jhi);
                    copy_bytes(a.peer_out[nonroot_rank(j, root)] + (k.lo + jlo) * E, (const unsigned char*)(in + k.lo + jlo), (jhi - jlo) * E);
                }
                if ((const T*)out != in) copy_bytes((unsigned char*)(out + k.lo), (const unsigned char*)(in + k.lo), k.n * E);
                signal_peers(a, open + 1 + c);
            }
        } else {
            const u64 mine = nonroot_index(me, root), last = open + chunks;
            for (u64 c = 0; c < chunks; ++c) {
                const u64 step = open + 1 + c;
                if (p == root) {
                    if (const int e = wait_one(a, root, step, (int)(step & 1), last)) *err = e;
                }
                __syncthreads();
                if (*err) return;
                const RelayChunk k = relay_chunk<T>(a, c);
                unsigned char* dsts[MAX_RANKS];
                u64 mlo, mhi;
                part_of(mine, k.sub, k.n, mlo, mhi);
                int nd = 0;
                for (int q = 0; q < N; ++q)
                    if (q != me && q != root) dsts[nd++] = a.peer_out[q] + (k.lo + mlo) * E;
                copy_bytes_multi(dsts, nd, (const unsigned char*)(out + k.lo + mlo), (mhi - mlo) * E);
            }
            __syncthreads();  // the block's forwards happen before thread p's release fence
            const bool other = peer && p != root;
            if (chunks > 0 && other) signal_one(a, p, last, (int)(last & 1));
            if (chunks > 0 && other) {
                if (const int e = wait_one(a, p, last, (int)(last & 1), last)) *err = e;
            }
            __syncthreads();
            if (*err) return;
        }
        end_steps(a, open + chunks);
    });
}

COLL_ENTRY(relay, run_relay)
