// All-reduce around a ring through the scratch (`Algo::Ring`): reduce-scatter then all-gather
// between neighbours me -> me + 1, one part per rank, 2(n-1) steps, 2(n-1)/n of the data per
// rank. Part p starts at rank p + 1 and travels the ring, each rank adding its own input; rank
// p gets the full sum of part p after n-1 hops (the order of the additions is fixed per part,
// so every rank gets the same bits), then passes the result on for n-1 more hops.
#pragma once
#include "../copy.cuh"
#include "../entry.cuh"
#include "../reduce.cuh"
#include "../steps.cuh"

template <typename T>
__device__ void run_ring(const CollArgs& a) {
    if (a.op != OP_ALLREDUCE) return;  // never planned
    SCRATCH_NAMES(T, a);
    run_stepped(a, [&](u64 lo, u64 n, u64& step, int* err) -> int {
        unsigned char* dsts[MAX_RANKS];
        const T* srcs[MAX_RANKS];
        const u64 sub = vector_parts<T>(n, N);
        const int next = (me + 1) % N, prev = (me + N - 1) % N;
        for (int s = 0; s < 2 * (N - 1); ++s) {
            const int par = (int)((step + 1) & 1), ppar = (int)(step & 1);
            // The part this rank sends in step s, and the one it received in step s-1.
            const int send_part = ((me - 1 - s) % N + 2 * N) % N;
            u64 plo, phi;
            part_of(send_part, sub, n, plo, phi);
            unsigned char* to = slot(next, par, me) + plo * E;
            if (s == 0) {
                copy_bytes(to, (const unsigned char*)(in + lo + plo), (phi - plo) * E);
            } else if (s < N - 1) {
                // The average divides once, at the end: the hops before it sum.
                srcs[0] = (const T*)(slot(me, ppar, prev) + plo * E);
                srcs[1] = in + lo + plo;
                dsts[0] = to;
                reduce_into<T>((T*)to, dsts, 0, srcs, 2, phi - plo, a.redop == R_AVG ? R_SUM : a.redop, N);
            } else if (s == N - 1) {
                // Last reduction: this rank finishes part `send_part` (its own index + 1
                // ... wraps to me), writes it out and starts passing it on.
                srcs[0] = (const T*)(slot(me, ppar, prev) + plo * E);
                srcs[1] = in + lo + plo;
                dsts[0] = to;
                reduce_into<T>(out + lo + plo, dsts, 1, srcs, 2, phi - plo, a.redop, N);
            } else {
                copy_bytes(to, slot(me, ppar, prev) + plo * E, (phi - plo) * E);
                copy_bytes((unsigned char*)(out + lo + plo), slot(me, ppar, prev) + plo * E, (phi - plo) * E);
            }
            if (barrier(a, ++step, err)) return 1;
        }
        // The last part arrived in the final step: store it.
        const int ppar = (int)(step & 1);
        const int part = ((me - 1 - 2 * (N - 1)) % N + 2 * N) % N;
        u64 plo, phi;
        part_of(part, sub, n, plo, phi);
        copy_bytes((unsigned char*)(out + lo + plo), slot(me, ppar, prev) + plo * E, (phi - plo) * E);
        return 0;
    });
}

COLL_ENTRY(ring, run_ring)
