// The relayed broadcast and reduce into registered outputs (`Algo::Relay`): the split into
// outputs (algo/splitout.cuh) with a ready flag per chunk instead of a barrier over every peer
// between chunks. Each block's piece of a chunk splits into n-1 parts of whole 16-byte vectors;
// part j belongs to the j-th non-root (rank j, or j + 1 past the root). Every rank's output is
// registered (`peer_out`), at the same place of its window. Chunk c's flags are step base + 1 + c
// (broadcast: open + 1 + c), the call's last step `last` that of the last chunk.
// Broadcast:
//   open     one barrier: every peer has entered the call (its output is free)
//   root     chunk by chunk, writes part j straight into the j-th non-root's output and flags
//            it, never waiting: chunk c + 1 leaves while the non-roots forward chunk c
//   non-root chunk by chunk, waits for the root's flag, forwards its part from its own output
//            into the other non-roots' outputs; after the last chunk it flags the other
//            non-roots and waits for their flags (everything written into its output has
//            landed)
//   Nothing is written twice and no scratch is used, so no flag needs an answer; the next
//   call's opening barrier keeps a rank that finished early (the root) from writing into a
//   peer that has not.
// Reduce (no opening barrier: the root's output is written only after the root's own flag of
// the call):
//   every rank, chunk by chunk, pushes part j of its input into the j-th non-root's scratch
//   (parity of the chunk's step) and flags it; the root first waits, from chunk 2, for each
//   non-root's flag of chunk c - 2 (that slot's last reader is done)
//   non-root after its pushes, waits for every rank's flag of the chunk, reduces its part
//            over every rank (rank order) straight into the root's output and flags the root
//   root     at the end, waits for every non-root's last flag (its output is whole)
//   A non-root needs no answer before it writes a slot again: its wait for chunk c + 1 saw each
//   non-root's flag of c + 1, given after that non-root reduced chunk c. For the same reason
//   the argument of base.cuh holds for the next call's first step, which writes the parity of
//   chunk `chunks - 2`: every rank ended having waited for each peer's flag of the last chunk,
//   given after the peer's reads of that parity (the root's wait is for the last reads).
// A peer's flag may already hold a later chunk's step, or its next call's first (a peer signals
// that before waiting): in checking mode every word up to `last` is compared (wait_one), and a
// later one left to the next call (docs/performance.md, "The relayed broadcast and reduce").
#pragma once
#include "../copy.cuh"
#include "../entry.cuh"
#include "../reduce.cuh"
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
__device__ void relay_reduce(const CollArgs& a) {
    SCRATCH_NAMES(T, a);
    (void)out;  // the root's output is written through `peer_out`, from every non-root
    const int root = a.root;
    with_counter(a, [&](u64 base, int* err) {
        const u64 span = a.piece * (u64)gridDim.x;
        const u64 chunks = (a.count + span - 1) / span, last = base + chunks;
        const int p = threadIdx.x;
        const bool peer = p < N && p != me;
        for (u64 c = 0; c < chunks; ++c) {
            const u64 step = base + 1 + c;
            const int par = (int)(step & 1);
            if (me == root && c >= 2) {
                // Chunk c - 2, the last use of this parity's slots, reduced by every non-root.
                if (peer) {
                    if (const int e = wait_one(a, p, step - 2, par, last)) *err = e;
                }
                __syncthreads();
                if (*err) return;
            }
            const RelayChunk k = relay_chunk<T>(a, c);
            for (int j = 0; j < N - 1; ++j) {
                const int q = nonroot_rank(j, root);
                if (q == me) continue;
                u64 jlo, jhi;
                part_of(j, k.sub, k.n, jlo, jhi);
                copy_bytes(slot(q, par, me) + jlo * E, (const unsigned char*)(in + k.lo + jlo), (jhi - jlo) * E);
            }
            __syncthreads();  // the block's pushes happen before thread p's release fence
            if (peer && p != root) signal_one(a, p, step, par);
            if (me == root) continue;
            if (peer) {
                if (const int e = wait_one(a, p, step, par, last)) *err = e;
            }
            __syncthreads();
            if (*err) return;
            const T* srcs[MAX_RANKS];
            u64 mlo, mhi;
            part_of(nonroot_index(me, root), k.sub, k.n, mlo, mhi);
            for (int r = 0; r < N; ++r)
                srcs[r] = r == me ? in + k.lo + mlo : (const T*)(slot(me, par, r) + mlo * E);
            reduce_into<T>((T*)(a.peer_out[root] + (k.lo + mlo) * E), nullptr, 0, srcs, N, mhi - mlo, a.redop, N);
            __syncthreads();  // the block's reduced part happens before the release fence
            if (p == root) signal_one(a, root, step, par);
        }
        if (me == root && chunks > 0) {
            if (peer) {
                if (const int e = wait_one(a, p, last, (int)(last & 1), last)) *err = e;
            }
            __syncthreads();
            if (*err) return;
        }
        end_steps(a, last);
    });
}

template <typename T>
__device__ void run_relay(const CollArgs& a) {
    if (a.op == OP_REDUCE) {
        relay_reduce<T>(a);
        return;
    }
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
