// The relayed broadcast, reduce and all-reduce into registered outputs (`Algo::Relay`): the
// split into outputs (algo/splitout.cuh) and the push all-reduce (algo/push.cuh) with a ready
// flag per chunk instead of a barrier over every peer between chunks. Every rank's output is
// registered (`peer_out`), at the same place of its window. In a broadcast or reduce each
// block's piece of a chunk splits into n-1 parts of whole 16-byte vectors, part j the j-th
// non-root's (rank j, or j + 1 past the root), and chunk c's flags are step base + 1 + c
// (broadcast: open + 1 + c; the reduce's flags to the root one more).
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
//   (the parity of step base + 1 + c) and flags it
//   non-root first flags the root that it has entered the call; after its pushes of a chunk,
//            waits for every rank's flag of the chunk, reduces its part over every rank (rank
//            order) straight into the root's output and flags the root
//   root     before chunk c >= 1 waits for each non-root's flag that the chunk's slots are
//            free: chunk 1's parity is the previous call's last step's (the non-root has
//            entered), chunk c's from 2 that of chunk c - 2 (reduced); at the end, for every
//            non-root's last chunk reduced (its output is whole)
//   A non-root needs no such wait: its pushes of chunk c + 1 follow its wait for chunk c, which
//   saw each non-root's flag of c, given in this call after that non-root reduced chunk c - 1.
//   The counter ends at base + chunks + 2 (the root's flags run to base + chunks + 1), the
//   parity of the last chunk's slots, so that the next call's first step writes the parity of
//   chunk `chunks - 2`: every rank ended having waited for each peer's flag of the last chunk,
//   given after the peer's reads of that parity (base.cuh; the root waited for the last reads).
// All-reduce (two-shot's moves with no barrier; any world size):
//   every rank, chunk by chunk, pushes part q of its input into rank q's scratch (the parity of
//   step base + 1 + c) and flags it (pushed: step base + 1 + 2c), waits for every peer's pushed
//   flag of the chunk, reduces its own part over every rank (rank order) into its output and
//   straight into every peer's output, and flags each peer (written: base + 2 + 2c); at the end
//   it waits for every peer's last written flag (its output is whole, every read done)
//   No wait for slots: a rank's pushes of chunk c + 2 follow its wait for chunk c + 1, which
//   saw each peer's pushed flag of c + 1, given after that peer's written flag of c (its reads
//   of chunk c done). The first writes into a peer's output follow that peer's first flag of
//   the call. In place, a peer writes part q of this rank's output after this rank's pushed
//   flag of the chunk, given after it read the chunk's parts.
// A peer's flag may already hold a later chunk's step, or its next call's first (a peer signals
// that before waiting): in checking mode every word up to the call's last step is compared
// (wait_one's `last`), and a later one left to the next call (docs/performance.md, "The
// relayed collectives").
#pragma once
#include "../copy.cuh"
#include "../entry.cuh"
#include "../reduce.cuh"
#include "../steps.cuh"

// Block b's piece of chunk c: elements [lo, lo + n) of the call (chunk_piece), split into
// `parts` parts of `sub` elements: one a non-root (broadcast, reduce), one a rank (all-reduce).
struct RelayChunk {
    u64 lo, n, sub;
};

template <typename T> __device__ __forceinline__ RelayChunk relay_chunk(const CollArgs& a, u64 c, int parts) {
    RelayChunk k;
    chunk_piece(a, c, k.lo, k.n);
    k.sub = vector_parts<T>(k.n, parts);
    return k;
}

template <typename T>
__device__ void relay_reduce(const CollArgs& a) {
    SCRATCH_NAMES(T, a);
    (void)out;  // the root's output is written through `peer_out`, from every non-root
    const int root = a.root;
    with_counter(a, [&](u64 base, int* err) {
        // Chunk c's pushes are flagged base + 1 + c (their slots' parity); a non-root's flags
        // to the root are base + 1 (entered) and base + 2 + c (chunk c reduced). The counter
        // ends at `end`, whose parity is that of the last chunk's slots: the next call's first
        // step writes the other parity (see the file comment).
        const u64 chunks = call_chunks(a), end = base + chunks + 2;
        const int p = threadIdx.x;
        const bool peer = p < N && p != me;
        if (me != root && chunks > 0) {
            if (p == root) signal_one(a, root, base + 1, (int)((base + 1) & 1));
        }
        for (u64 c = 0; c < chunks; ++c) {
            const u64 step = base + 1 + c;
            const int par = (int)(step & 1);
            if (me == root && c >= 1) {
                // This parity's slots free on every non-root: chunk 1's are the previous call's
                // last (the non-root has entered this call), chunk c's from 2 chunk c - 2's
                // (reduced).
                if (peer) {
                    if (const int e = wait_one(a, p, base + c, (int)((base + c) & 1), end)) *err = e;
                }
                __syncthreads();
                if (*err) return;
            }
            const RelayChunk k = relay_chunk<T>(a, c, N - 1);
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
                if (const int e = wait_one(a, p, step, par, end)) *err = e;
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
            if (p == root) signal_one(a, root, step + 1, (int)((step + 1) & 1));
        }
        if (me == root && chunks > 0) {
            // Every non-root's last chunk reduced: the output is whole.
            const u64 done = base + 1 + chunks;
            if (peer) {
                if (const int e = wait_one(a, p, done, (int)(done & 1), end)) *err = e;
            }
            __syncthreads();
            if (*err) return;
        }
        end_steps(a, end);
    });
}

template <typename T>
__device__ void relay_all_reduce(const CollArgs& a) {
    SCRATCH_NAMES(T, a);
    with_counter(a, [&](u64 base, int* err) {
        const u64 chunks = call_chunks(a), end = base + 2 * chunks;
        const int p = threadIdx.x;
        const bool peer = p < N && p != me;
        for (u64 c = 0; c < chunks; ++c) {
            const u64 pushed = base + 1 + 2 * c, written = pushed + 1;
            const int par = (int)((base + 1 + c) & 1);
            const RelayChunk k = relay_chunk<T>(a, c, N);
            push_parts<T>(slot, par, me, N, in + k.lo, k.sub, k.n);
            __syncthreads();  // the block's pushes happen before thread p's release fence
            if (peer) signal_one(a, p, pushed, (int)(pushed & 1));
            if (peer) {
                if (const int e = wait_one(a, p, pushed, (int)(pushed & 1), end)) *err = e;
            }
            __syncthreads();
            if (*err) return;
            reduce_own_part<T>(a, slot, par, me, N, in + k.lo, out + k.lo, k.sub, k.n,
                               [&](int q, u64 lo) { return a.peer_out[q] + (k.lo + lo) * E; });
            __syncthreads();  // the block's writes into the outputs happen before the fence
            if (peer) signal_one(a, p, written, (int)(written & 1));
        }
        if (chunks > 0 && peer) {
            if (const int e = wait_one(a, p, end, (int)(end & 1), end)) *err = e;
        }
        __syncthreads();
        if (*err) return;
        end_steps(a, end);
    });
}

template <typename T>
__device__ void run_relay(const CollArgs& a) {
    if (a.op == OP_REDUCE) {
        relay_reduce<T>(a);
        return;
    }
    if (a.op == OP_ALLREDUCE) {
        relay_all_reduce<T>(a);
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
        const u64 chunks = call_chunks(a);
        const int p = threadIdx.x;
        const bool peer = p < N && p != me;
        if (me == root) {
            for (u64 c = 0; c < chunks; ++c) {
                const RelayChunk k = relay_chunk<T>(a, c, N - 1);
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
                const RelayChunk k = relay_chunk<T>(a, c, N - 1);
                unsigned char* dsts[MAX_RANKS];
                u64 mlo, mhi;
                part_of(mine, k.sub, k.n, mlo, mhi);
                int nd = 0;
                for (int q = 0; q < N; ++q)
                    if (q != me && q != root) dsts[nd++] = a.peer_out[q] + (k.lo + mlo) * E;
                copy_bytes_multi(dsts, nd, (const unsigned char*)(out + k.lo + mlo), (mhi - mlo) * E);
            }
            __syncthreads();  // the block's forwards happen before thread p's release fence
            if (chunks > 0 && peer && p != root) {
                signal_one(a, p, last, (int)(last & 1));
                if (const int e = wait_one(a, p, last, (int)(last & 1), last)) *err = e;
            }
            __syncthreads();
            if (*err) return;
        }
        end_steps(a, open + chunks);
    });
}

COLL_ENTRY(relay, run_relay)
