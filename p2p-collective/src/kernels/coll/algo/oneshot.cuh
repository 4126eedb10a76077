// One-shot through the scratch (`Algo::OneShot` with the simple protocol), every collective:
// in one step per chunk each rank pushes its data into the scratch of every rank that needs it,
// then each combines what arrived.
//   all-reduce      pushes its piece to every peer;        reduces every rank's, in rank order
//   reduce          non-roots push to the root;            the root reduces every rank's
//   broadcast       the root pushes to every peer;         every rank copies the root's
//   all-gather      pushes its part to every peer;         copies rank r's into output part r
//   reduce-scatter  pushes part q to rank q;               reduces its own part over every rank
//   all-to-all      pushes part q to rank q;               copies rank r's into output part r
// Local copies (the own part, the root's own output) run while the step's signal travels.
// All-gather, reduce-scatter and all-to-all from `Tuning::overlap_min_bytes`, aligned, overlap
// their chunks' steps instead (`run_oneshot_overlapped`, below).
//
// Three entry points: `oneshot`, `oneshot_overlapped` (below), and `oneshot_unaligned` for
// all-gather, reduce-scatter and all-to-all where a rank's part or a buffer lies off a 16-byte
// boundary (3 ranks of a power-of-two count, say), whose copies realign their words (copy.cuh,
// copy_shifted). The realigning copies are kept out of the first: there they cost aligned copies
// 2-3 % (docs/performance.md, "Unaligned copies and reductions").
#pragma once
#include "../copy.cuh"
#include "../entry.cuh"
#include "../reduce.cuh"
#include "../steps.cuh"

template <typename T, bool SH>
__device__ void run_oneshot(const CollArgs& a) {
    SCRATCH_NAMES(T, a);
    run_stepped(a, [&](u64 lo, u64 n, u64& step, int* err) -> int {
        unsigned char* dsts[MAX_RANKS];
        const T* srcs[MAX_RANKS];
        const int par = (int)((step + 1) & 1);
        switch (a.op) {
            case OP_ALLREDUCE: {
                if constexpr (SH) {
                    return 1;  // never planned
                } else {
                    for (int q = 0; q < N; ++q) dsts[q] = q == me ? 0 : slot(q, par, me);
                    copy_bytes_multi(dsts, N, (const unsigned char*)(in + lo), n * E);
                    if (barrier(a, ++step, err)) return 1;
                    for (int r = 0; r < N; ++r) srcs[r] = r == me ? in + lo : (const T*)slot(me, par, r);
                    reduce_into<T>(out + lo, dsts, 0, srcs, N, n, a.redop, N);
                    return 0;
                }
            }
            case OP_REDUCE: {
                if constexpr (SH) {
                    return 1;  // never planned
                } else {
                    if (me != a.root) copy_bytes(slot(a.root, par, me), (const unsigned char*)(in + lo), n * E);
                    if (barrier(a, ++step, err)) return 1;
                    if (me == a.root) {
                        for (int r = 0; r < N; ++r) srcs[r] = r == me ? in + lo : (const T*)slot(me, par, r);
                        reduce_into<T>(out + lo, dsts, 0, srcs, N, n, a.redop, N);
                    }
                    return 0;
                }
            }
            case OP_BROADCAST: {
                if constexpr (SH) {
                    return 1;  // never planned
                } else {
                    if (me == a.root) {
                        for (int q = 0; q < N; ++q) dsts[q] = q == me ? 0 : slot(q, par, me);
                        copy_bytes_multi(dsts, N, (const unsigned char*)(in + lo), n * E);
                    }
                    // The root's own copy runs while its signal travels.
                    signal_peers(a, ++step);
                    if (me == a.root) copy_bytes((unsigned char*)(out + lo), (const unsigned char*)(in + lo), n * E);
                    if (wait_peers(a, step, err)) return 1;
                    if (me != a.root) copy_bytes((unsigned char*)(out + lo), slot(me, par, a.root), n * E);
                    return 0;
                }
            }
            case OP_ALLGATHER: {
                for (int q = 0; q < N; ++q) dsts[q] = q == me ? 0 : slot(q, par, me);
                copy_bytes_multi<Block, SH>(dsts, N, (const unsigned char*)(in + lo), n * E);
                signal_peers(a, ++step);  // the own part is copied while the signal travels
                if (!a.own_done) copy_bytes<SH>((unsigned char*)(out + (u64)me * a.count + lo), (const unsigned char*)(in + lo), n * E);
                if (wait_peers(a, step, err)) return 1;
                for (int r = 0; r < N; ++r)
                    if (r != me) copy_bytes<SH>((unsigned char*)(out + (u64)r * a.count + lo), slot(me, par, r), n * E);
                return 0;
            }
            case OP_REDUCESCATTER: {
                // So that the reduction reads and writes 16-byte vectors, not an element at a
                // time, the unaligned kernel (the host runs the other where every part is on a
                // boundary) uses this rank's own slot, which no peer writes: an own part off a
                // 16-byte boundary is staged there, and an output off the boundary (in place it
                // is the own part) is reduced there and then copied out realigned
                // (docs/performance.md, "Unaligned copies and reductions").
                const T* own = in + (u64)me * a.count + lo;
                T* const own_slot = (T*)slot(me, par, me);
                const bool stage = SH && !aligned16(own);
                const bool via = SH && !aligned16(out + lo);
                for (int q = 0; q < N; ++q)
                    if (q != me || stage) copy_bytes<SH>(slot(q, par, me), (const unsigned char*)(in + (u64)q * a.count + lo), n * E);
                if (barrier(a, ++step, err)) return 1;
                for (int r = 0; r < N; ++r) srcs[r] = r == me && !stage ? own : (const T*)slot(me, par, r);
                reduce_into<T>(via ? own_slot : out + lo, dsts, 0, srcs, N, n, a.redop, N);
                if (via) {
                    __syncthreads();  // the copy's threads read what other threads reduced
                    copy_bytes<SH>((unsigned char*)(out + lo), (const unsigned char*)own_slot, n * E);
                }
                return 0;
            }
            case OP_ALLTOALL: {
                for (int q = 0; q < N; ++q)
                    if (q != me) copy_bytes<SH>(slot(q, par, me), (const unsigned char*)(in + (u64)q * a.count + lo), n * E);
                signal_peers(a, ++step);  // the own part is copied while the signal travels
                if (!a.own_done)
                    copy_bytes<SH>((unsigned char*)(out + (u64)me * a.count + lo), (const unsigned char*)(in + (u64)me * a.count + lo), n * E);
                if (wait_peers(a, step, err)) return 1;
                for (int r = 0; r < N; ++r)
                    if (r != me) copy_bytes<SH>((unsigned char*)(out + (u64)r * a.count + lo), slot(me, par, r), n * E);
                return 0;
            }
            default:
                return 1;
        }
    });
}

// All-gather, reduce-scatter and all-to-all with their chunks' steps overlapped (`a.overlap`,
// every part and buffer on a 16-byte boundary; entry `oneshot_overlapped`): two stages a chunk
// through run_staged (steps.cuh): 0 pushes this rank's parts into the peers' scratch, 1 combines
// what arrived and copies the own part, so that chunk c + 1 travels while chunk c is copied out
// or reduced; one barrier a step. The two stages of a step use the slots of the two parities.
// In place, the pushes of chunk c + 1 read the input where no copy of chunk c writes.
// (docs/performance.md, "Overlapped steps".)
template <typename T>
__device__ void run_oneshot_overlapped(const CollArgs& a) {
    if (a.op != OP_ALLGATHER && a.op != OP_REDUCESCATTER && a.op != OP_ALLTOALL) return;  // never planned
    SCRATCH_NAMES(T, a);
    run_staged<2>(a, [&](int k, u64 lo, u64 n, u64, int wpar, int rpar) {
        unsigned char* dsts[MAX_RANKS];
        const T* srcs[MAX_RANKS];
        if (k == 0 && a.op == OP_ALLGATHER) {
            for (int q = 0; q < N; ++q) dsts[q] = q == me ? 0 : slot(q, wpar, me);
            copy_bytes_multi(dsts, N, (const unsigned char*)(in + lo), n * E);
        } else if (k == 0) {
            // Part q to rank q.
            for (int q = 0; q < N; ++q)
                if (q != me) copy_bytes(slot(q, wpar, me), (const unsigned char*)(in + (u64)q * a.count + lo), n * E);
        } else if (a.op == OP_REDUCESCATTER) {
            for (int r = 0; r < N; ++r) srcs[r] = r == me ? in + (u64)me * a.count + lo : (const T*)slot(me, rpar, r);
            reduce_into<T>(out + lo, dsts, 0, srcs, N, n, a.redop, N);
        } else {
            // The own part (unless the copy engine copies it), then the peers' parts.
            const T* own = a.op == OP_ALLGATHER ? in + lo : in + (u64)me * a.count + lo;
            if (!a.own_done) copy_bytes((unsigned char*)(out + (u64)me * a.count + lo), (const unsigned char*)own, n * E);
            for (int r = 0; r < N; ++r)
                if (r != me) copy_bytes((unsigned char*)(out + (u64)r * a.count + lo), slot(me, rpar, r), n * E);
        }
    });
}

template <typename T> __device__ void entry_oneshot(const CollArgs& a) { run_oneshot<T, false>(a); }
template <typename T> __device__ void entry_oneshot_unaligned(const CollArgs& a) { run_oneshot<T, true>(a); }

COLL_ENTRY(oneshot, entry_oneshot)
COLL_ENTRY(oneshot_unaligned, entry_oneshot_unaligned)
COLL_ENTRY(oneshot_overlapped, run_oneshot_overlapped)
