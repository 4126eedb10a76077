// The limits of every wait between ranks, the step signals and barriers, and piece arithmetic.
#pragma once
#include "base.cuh"

// The limits of every wait (wait_ge, ll_wait_all, the send/recv waits), checked once every 1024
// rounds of its poll: the failure word and the clock (both on this GPU), and the host's abort
// flag (pinned memory: a read across PCIe) by each waiting thread at most once every
// HOST_POLL_NS * S, where S = min(gridDim.x, HOST_POLL_SPREAD), the blocks' first reads
// staggered HOST_POLL_NS apart, so that a grid whose blocks all wait reads it about
// max(1, gridDim.x / HOST_POLL_SPREAD) times every HOST_POLL_NS. (Every waiting block reading
// it once every 1024 polls cost the copy-engine all-reduce ~100-170 us a call at 1 GiB:
// docs/performance.md, "Who reads the abort flag".) An abort, or a failure on another GPU of this process (which arrives
// through the same flag), reaches every waiting thread within HOST_POLL_NS * HOST_POLL_SPREAD
// (6.4 ms) plus 1024 polls; at the time limit the flag is read once more, so that a wait
// aborted late reports the abort, not a time-out.
struct Limits {
    u64 deadline = 0, host_due = 0;
    unsigned spins = 0;
    // 0 while the wait may go on; otherwise the failure code that ends it. `a` (CollArgs or
    // P2pArgs) gives the abort flag and the time limit; `fail` is this GPU's failure word.
    template <typename Args>
    __device__ __forceinline__ int check(const Args& a, volatile u64* fail) {
        if ((++spins & 1023u) != 0) return 0;
        if (*fail) return F_ELSEWHERE;
        const u64 t = now_ns();
        const unsigned spread = gridDim.x < HOST_POLL_SPREAD ? gridDim.x : HOST_POLL_SPREAD;
        if (deadline == 0) {
            deadline = t + a.timeout_ns;
            host_due = t + HOST_POLL_NS * (u64)(blockIdx.x % spread + 1);
        } else if (t > deadline) {
            return *a.abort_flag ? F_ABORT : F_TIMEOUT;
        }
        if (t >= host_due) {
            if (*a.abort_flag) return F_ABORT;
            host_due = t + HOST_POLL_NS * (u64)spread;
        }
        return 0;
    }
};

// A step signal's word: the step in its low STEP_BITS bits and, in checking mode, 16 bits of the
// call's signature above them (sig16; 0 without), so that a waiter compares the signature with
// the word it polled, at no extra load.
#define STEP_BITS 48
#define STEP_MASK ((1ull << STEP_BITS) - 1ull)
__device__ __forceinline__ u64 sig16(const CollArgs& a) {
    return a.check ? (a.sig * 0x9e3779b97f4a7c15ull) >> 48 : 0ull;
}

// Waits until the step of *flag (its low STEP_BITS bits) reaches `want`, and gives the word it
// saw in *seen (where given). The flag (local memory) is polled every round.
__device__ int wait_ge(const CollArgs& a, volatile u64* flag, u64 want, u64* seen = nullptr) {
    Limits lim;
    volatile u64* fail = a.sync[a.rank] + FAIL_OFF;
    u64 w;
    while (((w = *flag) & STEP_MASK) < want) {
        if (const int e = lim.check(a, fail)) return e;
    }
    if (seen) *seen = w;
    return 0;
}

// One peer's half of a step: signal_one gives peer p this block's step (after a release fence,
// so that the block's pushes that happened before it are visible first); wait_one waits for
// peer p's signal of `step` and acquires its pushes. wait_one returns the failure (recorded,
// unless it happened elsewhere) or 0. In checking mode 16 bits of the signature travel in the
// signal's word (sig16), compared where the word holds exactly the step waited for: a peer that
// is further on had compared this rank's word of that step with its own (every stepped
// algorithm signals step s + 1 only after its wait for s, which saw this rank's word of s, as
// this rank is still waiting there), so the calls agree. The pipelined one-shot's pushers signal
// without waiting, so it gives `last`, its call's last step: a word up to it belongs to the
// peer's call of the same counter and is compared too. The whole signature, for the error, is
// stored before the same fence into the slot of parity `par`: the step's parity for the stepped
// algorithms (a peer gives step s + 2 only after this rank gave s + 1, so the two slots are
// enough); one slot for a whole pipelined call.
__device__ __forceinline__ void signal_one(const CollArgs& a, int p, u64 step, int par) {
    const int b = blockIdx.x;
    if (a.check) a.sync[p][SIGS_OFF + (par * MAX_BLOCKS + b) * MAX_RANKS + a.rank] = a.sig;
    fence_sys();
    ((volatile u64*)a.sync[p])[FLAGS_OFF + b * MAX_RANKS + a.rank] = step | (sig16(a) << STEP_BITS);
}

__device__ __forceinline__ int wait_one(const CollArgs& a, int p, u64 step, int par, u64 last = 0) {
    const int b = blockIdx.x;
    volatile u64* mine = a.sync[a.rank];
    u64 seen = 0;
    int e = wait_ge(a, mine + FLAGS_OFF + b * MAX_RANKS + p, step, &seen);
    fence_sys();  // acquire: the peer's pushes are visible after its signal
    u64 peer_sig = 0;
    if (a.check && !e) {
        const u64 at = seen & STEP_MASK;
        if ((at == step || at <= last) && (seen >> STEP_BITS) != sig16(a)) e = F_MISMATCH;
    }
    if (e == F_MISMATCH) peer_sig = mine[SIGS_OFF + (par * MAX_BLOCKS + b) * MAX_RANKS + p];
    if (e && e != F_ELSEWHERE) record_failure(a, e, p, peer_sig);
    return e;
}

// The step barrier of one block with every peer (see base.cuh), in two halves so that a
// block can do local work while its signal travels: signal_peers, then wait_peers. Thread
// p < nranks handles peer p.
__device__ void signal_peers(const CollArgs& a, u64 step) {
    __syncthreads();  // the block's pushes happen before thread p's release fence
    const int p = threadIdx.x;
    if (p < a.nranks && p != a.rank) signal_one(a, p, step, (int)(step & 1));
}

// Returns nonzero (for every thread) if the collective must stop.
__device__ int wait_peers(const CollArgs& a, u64 step, int* err) {
    const int p = threadIdx.x;
    if (p < a.nranks && p != a.rank) {
        if (const int e = wait_one(a, p, step, (int)(step & 1))) *err = e;
    }
    __syncthreads();
    return *err;
}

__device__ int barrier(const CollArgs& a, u64 step, int* err) {
    signal_peers(a, step);
    return wait_peers(a, step, err);
}

// Elements [lo, hi) of part j, `sub` elements each, of a piece of n elements (empty past its end).
__device__ __forceinline__ void part_of(u64 j, u64 sub, u64 n, u64& lo, u64& hi) {
    lo = j * sub < n ? j * sub : n;
    hi = lo + sub < n ? lo + sub : n;
}

// The split broadcast and reduce: rank of the j-th non-root, and the index of non-root q.
__device__ __forceinline__ int nonroot_rank(int j, int root) { return j < root ? j : j + 1; }
__device__ __forceinline__ int nonroot_index(int q, int root) { return q < root ? q : q - 1; }

