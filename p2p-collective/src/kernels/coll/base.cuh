// The collective kernels: one entry point per algorithm (`algo/`) and protocol (`proto/`) and
// element type, `coll_<type>_<name>` (entry.cuh), each running every collective its file
// carries.
//
// Every rank owns a scratch buffer and a sync area that every peer can write (peer pointers in
// one process, CUDA IPC mappings between processes). A collective is a sequence of steps; in
// each step every block of every rank
//   1. pushes its piece of data into peers' scratch (stores over NVLink are posted: writes beat
//      reads across the link),
//   2. signals every peer by storing its step number into the peer's flag for (block, rank),
//      then waits until every peer's flag for (block, peer) in its own memory reaches that step,
//   3. combines what arrived (a reduction in rank order, or a copy) into its output.
//
// Counters are per block, live in device memory and only grow: block b reads counters[b] when
// it starts and stores the last step it runs (the stepped algorithms when they end; LL as soon
// as every thread of the block has read it). Every kernel that reads the counters first runs
// `griddepcontrol.wait` (or is stream-ordered), so it sees the previous call's stores. Nothing
// the host passes changes from call to call except buffer addresses and sizes, so a call
// captured in a CUDA graph replays correctly. Every rank launches the same grid and the same
// number of steps for a call (both follow from the count alone), so block b's counter agrees
// on every rank.
//
// Scratch is double-buffered by step parity, and each half holds one region per block index,
// used by that block index alone on every rank. Writing into a peer's half for step s is safe
// because this block waited, in step s-1, for the peer's signal of s-1, which the peer gave
// after it finished reading step s-2 (the last use of that half). (The pipelined all-reduce
// keeps the same rule with its own argument: see algo/pipe.cuh.)
//
// No hangs: every wait polls the abort flag (pinned host memory) and the device's failure word,
// and gives up after `timeout_ns`; a kernel that fails sets the abort flag so that the ranks
// sharing it stop too. The first failure is recorded in `status` (failure, the plan's code,
// peer, block, this rank's signature and the peer's), and later kernels return at once.
//
// With `check` on, each signal also carries a 64-bit signature of the call (op, algorithm,
// protocol, type, redop, root, count); a waiter that sees a different one from a peer stops
// with code F_MISMATCH.
//
// This file: element types and accumulators, the clock and fences, the threads that run a
// loop, and the failure record.
#pragma once
#include "../coll_abi.h"

// Timing marks for experiments (scripts/gpu/harness/ll_probe.cuh defines LL_PROBE first);
// nothing in the library's build.
#ifndef LL_PROBE
#define LL_PROBE(i)
#endif

struct half_t { unsigned short x; };
struct bhalf_t { unsigned short x; };

// Storage type -> accumulator type; f16 and bf16 accumulate in f32 and round once.
template <typename T> struct Ty {
    typedef T acc;
    static __device__ __forceinline__ acc up(T x) { return x; }
    static __device__ __forceinline__ T down(acc x) { return x; }
};
template <> struct Ty<half_t> {
    typedef float acc;
    static __device__ __forceinline__ float up(half_t x) {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.x));
        return f;
    }
    static __device__ __forceinline__ half_t down(float f) {
        half_t r;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.x) : "f"(f));
        return r;
    }
};
template <> struct Ty<bhalf_t> {
    typedef float acc;
    static __device__ __forceinline__ float up(bhalf_t x) { return __uint_as_float(((unsigned)x.x) << 16); }
    static __device__ __forceinline__ bhalf_t down(float f) {
        bhalf_t r;
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.x) : "f"(f));
        return r;
    }
};

__device__ __forceinline__ u64 now_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ void fence_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }

__device__ __forceinline__ bool aligned16(const void* p) { return (((u64)p) & 15ull) == 0; }

// The threads of a block that run a loop: [FIRST, FIRST + COUNT), or from FIRST to the block's
// end when COUNT is 0. Template parameters, not arguments: as arguments they cost the
// whole-block loops spills.
template <unsigned FIRST, unsigned COUNT> struct Threads {
    static __device__ __forceinline__ unsigned tid() { return threadIdx.x - FIRST; }
    static __device__ __forceinline__ unsigned count() { return COUNT ? COUNT : blockDim.x - FIRST; }
};
typedef Threads<0, 0> Block;

// The abort flag's value for rank `rank`'s kernel that failed (`code`) waiting for `peer`
// (coll_abi.h).
__device__ __forceinline__ int abort_value(int rank, int peer, int code) {
    const int p = peer >= 0 && peer < MAX_RANKS ? peer + 1 : 0;
    const int r = rank >= 0 && rank < MAX_RANKS ? rank + 1 : 0;
    return ABORT_KERNEL_FAILED | (p << ABORT_PEER_SHIFT) | (r << ABORT_RANK_SHIFT) |
           (code == F_MISMATCH ? ABORT_MISMATCH : 0);
}

__device__ void record_failure(const CollArgs& a, int code, int peer, u64 peer_sig) {
    u64* my = a.sync[a.rank];
    // A time limit stops every rank that shares this flag (one process: all of them) at once;
    // the host's monitor reports it to the other processes. (A mismatch is seen by every rank
    // itself, since each compares every peer's signature.)
    if (code == F_TIMEOUT && *a.abort_flag == 0) *a.abort_flag = abort_value(a.rank, peer, code);
    if (atomicCAS((unsigned long long*)(my + FAIL_OFF), 0ull, (unsigned long long)code) == 0ull) {
        volatile u64* st = my + STATUS_OFF;
        st[1] = (u64)a.code;
        st[2] = (u64)peer;
        st[3] = (u64)blockIdx.x;
        st[4] = a.sig;
        st[5] = peer_sig;
        __threadfence();
        st[0] = (u64)code;
    }
}
