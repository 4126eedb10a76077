// The LL protocol (`Proto::Ll`), every collective in one step: every 16-byte store carries 8
// data bytes and the call's 32-bit flag twice, {d0, f, d1, f}, the layout of NCCL's LL protocol
// (lines.cuh): each 8-byte half lands atomically, so a reader that sees both
// flags equal to this call's has both halves of the data. No fence and no separate flag store,
// so a call costs one NVLink crossing. The flag is the block's step number (never 0, which
// fresh scratch holds); a stale line in the same parity half holds the step before last.
// Each thread owns the same units in the push and the reduce loops, so in place is safe; all
// pushes come before any wait, so ranks cannot wait on each other in a cycle.
//
// LL lines live in their own region after the scratch (2 parities x N sources x LL_SLOT_BYTES),
// never written by the other algorithms: user data there could otherwise look like a valid flag.
// Block b owns lines [b * LL_LINES_PER_BLOCK, (b + 1) * LL_LINES_PER_BLOCK) whatever the grid, so
// a line is only ever written with block b's step numbers, which only grow: a line left by an
// earlier call (of any size) does not carry the current flag until the 32-bit flag wraps. That
// takes 2 x (2^32 - 1) of the block's steps (hours of back-to-back calls), and a stale line
// would have to sit unwritten for exactly a multiple of that; not guarded (the point-to-point
// lines are scrubbed, P2P_LL_SCRUB).
#pragma once
#include "../entry.cuh"
#include "../lines.cuh"
#include "../redop.cuh"
#include "../sync.cuh"

__device__ __forceinline__ unsigned char* ll_slot(const CollArgs& a, int r, int par, int src) {
    return a.scratch[r] + 2ull * a.nranks * a.slot_bytes + ((u64)par * a.nranks + src) * LL_SLOT_BYTES;
}

template <typename T> union Vec8 {
    uint2 u;
    T t[8 / sizeof(T)];
};

// Waits until the LL line `line` of every rank in `mask` (bit r: rank r) carries `flag`, and
// gives each one's data in got[r]. Every round loads all the lines still missing before looking
// at any (one load latency a round, not one per peer: with three peers that is ~1 us saved);
// the same limits as wait_ge. A single peer is polled by a loop of its own. On failure `*peer` is a rank still missing.
__device__ int ll_wait_all(const CollArgs& a, int par, u64 line, unsigned flag, unsigned mask,
                           uint2 (&got)[MAX_RANKS], int* peer) {
    Limits lim;
    volatile u64* fail = a.sync[a.rank] + FAIL_OFF;
    if ((mask & (mask - 1u)) == 0u) {
        // One peer (2 ranks, or a rooted collective's non-root): a tight loop of one load and one
        // compare a round, as before the all-peers poll (which measured 0.26 us slower on 2
        // ranks). `got` is written through constant indices so that it stays in registers.
        const int q = __ffs(mask) - 1;
        const unsigned char* p = ll_slot(a, a.rank, par, q) + 16 * line;
        *peer = q;
        while (true) {
            const uint4 v = ll_load(p);
            if (v.y == flag && v.w == flag) {
#pragma unroll
                for (int r = 0; r < MAX_RANKS; ++r)
                    if (r == q) got[r] = make_uint2(v.x, v.z);
                return 0;
            }
            if (const int e = lim.check(a, fail)) return e;
        }
    }
    // Source r's line sits r slots after source 0's: one base pointer and constant offsets
    // (eight 64-bit pointers kept across the loop made ptxas spill).
    const unsigned char* p0 = ll_slot(a, a.rank, par, 0) + 16 * line;
    while (true) {
        uint4 v[MAX_RANKS];
#pragma unroll
        for (int r = 0; r < MAX_RANKS; ++r)
            if (mask & (1u << r)) v[r] = ll_load(p0 + (u64)r * LL_SLOT_BYTES);
#pragma unroll
        for (int r = 0; r < MAX_RANKS; ++r) {
            if ((mask & (1u << r)) && v[r].y == flag && v[r].w == flag) {
                got[r] = make_uint2(v[r].x, v[r].z);
                mask &= ~(1u << r);
            }
        }
        if (mask == 0) return 0;
        *peer = __ffs(mask) - 1;
        if (const int e = lim.check(a, fail)) return e;
    }
}

// Every collective through LL lines, in one step: each rank stores a line per unit into the LL
// slot of every peer (an empty line where the peer needs no data), then waits for every peer's
// line and combines what it needs. `a.count`
// is one source's segment (the whole buffer, or one rank's part for all-gather, reduce-scatter
// and all-to-all); `a.piece` is 8-byte units per block, at most one per thread (the plan keeps
// piece <= the block's threads <= THREADS). What each collective sends and combines:
//   all-reduce      sends its input to every peer;        reduces every rank's, in rank order
//   reduce-scatter  sends part q to rank q;                reduces its own part over every rank
//   reduce          non-roots send their input to the root; the root reduces every rank's
//   all-gather      sends its input to every peer;        copies rank r's to output part r
//   all-to-all      sends part q to rank q;                copies rank r's to output part r
//   broadcast       the root sends its input to every peer; every rank copies the root's
// It runs its own prologue: the input load goes out together with the counter's, instead of
// after it (two load latencies overlapped).
// OP and NR, when given, fix the collective and the world size at compile time (the `ll2`
// entry fixes all-reduce on two ranks; `ll` leaves both to the arguments).
template <typename T, int OP = -1, int NR = 0>
__device__ void run_ll(const CollArgs& a) {
    typedef typename Ty<T>::acc A;
    const int E = 8 / sizeof(T);
    const int N = NR > 0 ? NR : a.nranks, me = a.rank, root = a.root, op = OP >= 0 ? OP : a.op;
    LL_PROBE(0);
    u64* mine = a.sync[me];
    const u64 bytes = a.count * sizeof(T);
    const u64 units = (bytes + 7) / 8;
    const u64 lo = (u64)blockIdx.x * a.piece < units ? (u64)blockIdx.x * a.piece : units;
    const u64 hi = lo + a.piece < units ? lo + a.piece : units;
    const u64 u = lo + threadIdx.x;  // this thread's unit, if u < hi
    const bool has = u < hi && threadIdx.x < a.piece;
    // Parts at multiples of `bytes` are 8-byte aligned only if `bytes` is.
    const bool aligned = ((((u64)a.input) | ((u64)a.output) | bytes) & 7ull) == 0;
    const bool parted_in = op == OP_REDUCESCATTER || op == OP_ALLTOALL;
    const bool reduces = op == OP_ALLREDUCE || op == OP_REDUCESCATTER || op == OP_REDUCE;
    __shared__ int err;
    __shared__ u64 base;
    if (threadIdx.x == 0) {
        err = (int)((volatile u64*)mine)[FAIL_OFF];
        base = mine[COUNTERS_OFF + blockIdx.x];
    }
    // Broadcast and reduce: every rank exchanges a line with every peer both ways (data from
    // the root, or to it; an empty line otherwise), so that no rank can run more than one call
    // ahead of any peer: a root that only sent (broadcast) would overwrite, two calls later,
    // lines a slow non-root has not read yet (seen as a stall under CUDA graph replay), and on
    // more than two ranks a non-root that heard only from the root could go on to push, in
    // the next stepped call, into the scratch half another non-root was still reading (the
    // parity argument of base.cuh needs a line or flag from every peer in every step).
    const bool rooted = op == OP_BROADCAST || op == OP_REDUCE;
    // Whether this rank's input carries data (a broadcast's non-roots have no input).
    const bool has_input = op != OP_BROADCAST || me == root;
    // The collectives without parts send and use the same 8 bytes of the input: load them now.
    const uint2 first = has && !parted_in && has_input ? load8(a.input, u, bytes, aligned) : make_uint2(0, 0);
    __syncthreads();
    LL_PROBE(1);
    if (err) return;  // an earlier call failed: the communicator is unusable, drain at once
    const u64 step = base + 1;
    // The counter moves on now, not after a second barrier at the end (~0.2 us of a 2 us call:
    // docs/performance.md, "All-reduce, LL"): every thread has read `base`, and the next call on this stream reads the
    // counter only after its `griddepcontrol.wait`, which waits for this whole grid (without
    // programmatic dependent launch, stream order does the same). A call that fails leaves it
    // moved on, which nothing reads again: a failure poisons the communicator.
    if (threadIdx.x == 0) mine[COUNTERS_OFF + blockIdx.x] = step;
    const unsigned flag = (unsigned)(step % 0xffffffffull) + 1u;
    const int par = (int)(step & 1);
    // Line of unit u in a slot: inside this block's own lines (LL_LINES_PER_BLOCK of them).
    const u64 line = (u64)blockIdx.x * LL_LINES_PER_BLOCK + threadIdx.x;
    if (has) {
        if (rooted) {
            // Data where the collective sends it (broadcast: from the root; reduce: to it), an
            // empty line everywhere else.
            for (int q = 0; q < N; ++q) {
                if (q == me) continue;
                const bool data = op == OP_BROADCAST ? me == root : q == root;
                ll_store(ll_slot(a, q, par, me) + 16 * line, data ? first : make_uint2(0, 0), flag);
            }
        } else if (parted_in) {
            for (int q = 0; q < N; ++q)
                if (q != me)
                    ll_store(ll_slot(a, q, par, me) + 16 * line, load8(a.input + (u64)q * bytes, u, bytes, aligned), flag);
        } else {
            for (int q = 0; q < N; ++q)
                if (q != me) ll_store(ll_slot(a, q, par, me) + 16 * line, first, flag);
        }
    }
    LL_PROBE(2);
    if (has) {
        // Every collective waits for every peer's line (see `rooted` above).
        const unsigned need = ((1u << N) - 1u) & ~(1u << me);
        uint2 got[MAX_RANKS];
        int peer = 0;
        const int e = need ? ll_wait_all(a, par, line, flag, need, got, &peer) : 0;
        LL_PROBE(3);
        if (e) {
            if (e != F_ELSEWHERE) record_failure(a, e, peer, 0);
        } else {
            // This rank's own 8 bytes, from its input.
            const uint2 own = parted_in ? load8(a.input + (u64)me * bytes, u, bytes, aligned) : first;
            if (op == OP_REDUCE && me != root) {
                // The root's line was its acknowledgement: nothing to write.
            } else if (reduces) {
                A acc[8 / sizeof(T)];
#pragma unroll
                for (int r = 0; r < MAX_RANKS; ++r) {
                    if (r >= N) break;
                    Vec8<T> w;
                    w.u = r == me ? own : got[r];
#pragma unroll
                    for (int k = 0; k < E; ++k)
                        acc[k] = r == 0 ? Ty<T>::up(w.t[k]) : combine<A>(a.redop, acc[k], Ty<T>::up(w.t[k]));
                }
                Vec8<T> o;
#pragma unroll
                for (int k = 0; k < E; ++k) o.t[k] = Ty<T>::down(finish<A>(a.redop, acc[k], N));
                store8(a.output, u, bytes, aligned, o.u);
            } else if (op == OP_BROADCAST) {
                uint2 w = own;
#pragma unroll
                for (int r = 0; r < MAX_RANKS; ++r)
                    if (r == root && r != me) w = got[r];
                store8(a.output, u, bytes, aligned, w);
            } else {
                // All-gather and all-to-all: rank r's segment goes to output part r.
#pragma unroll
                for (int r = 0; r < MAX_RANKS; ++r) {
                    if (r >= N) break;
                    store8(a.output + (u64)r * bytes, u, bytes, aligned, r == me ? own : got[r]);
                }
            }
        }
    }
    LL_PROBE(4);
}

// Two entry points: `ll`, every collective on any world size, and `ll2`, all-reduce on two
// ranks with the collective and the world size compiled in: the smaller code, with its one peer
// and one reduction unrolled, measured 0.45 us faster a call than `ll` at 8 B-4 KiB
// (docs/performance.md, "All-reduce, LL").
template <typename T> __device__ void entry_ll(const CollArgs& a) { run_ll<T>(a); }
template <typename T> __device__ void entry_ll2(const CollArgs& a) { run_ll<T, OP_ALLREDUCE, 2>(a); }

COLL_ENTRY(ll, entry_ll)
COLL_ENTRY(ll2, entry_ll2)
