// The pipelined one-shot all-reduce (`Algo::Pipe`): one-shot through the scratch (every rank
// pushes its input into every peer's scratch and reduces what arrived, in rank order), with
// each block's push and reduction overlapped (docs/performance.md, "The pipelined one-shot
// all-reduce").
// The plan gives one chunk (count <= grid * piece): block b's piece is cut into S = piece / sub
// sub-pieces, rounded up (the same S on every block and rank). Warps [0, PIPE_PUSH_WARPS) push
// sub-piece s into every peer's slot and give each peer the flag base + s + 1 (a named barrier
// among them, then a release fence by the thread of that peer); the other warps reduce
// sub-piece s once every peer's flag has reached base + s + 1 and (in place, where the
// reduction overwrites the input they read) this block's pushers are past s. So the push of
// sub-piece s + 1 crosses the link while sub-piece s is reduced. The pushers never wait for a
// peer, so the ranks cannot wait on each other in a cycle; nor do they stop when a reducer
// fails (the peers' calls then end normally, and the failure reaches them through the abort
// flag or their next call). In checking mode every flag of a call carries the signature in
// the slot of the call's parity (see signal_one).
//
// Scratch reuse: every sub-piece of a call goes into the parity half (base + 1) & 1, and the
// counter moves on by S rounded up to odd, so the next call's first step writes the other half.
// That half was last read by the peer in a kernel before this one (its reducers can still be
// reading this call's half when its last flag arrives, so base.cuh's argument, which
// takes a peer's flag for "done reading", does not hold for these flags). The peer ran that
// earlier kernel to its end before its pushers gave this call's first flag (kernels on a stream
// end in order; griddepcontrol.wait), and this block waited for that flag. The call after next
// writes this half again only after a flag of the next call, so after the peer's whole kernel
// for this one.
#pragma once
#include "../copy.cuh"
#include "../entry.cuh"
#include "../reduce.cuh"
#include "../steps.cuh"

template <typename T>
__device__ void run_pipe(const CollArgs& a, u64 base, int* err) {
    const int b = blockIdx.x, N = a.nranks, me = a.rank;
    const u64 E = sizeof(T);
    constexpr unsigned P = PIPE_PUSH_WARPS * 32;
    const unsigned tid = threadIdx.x;
    const Slots slot(a);
    // Never planned (the planner's shape: THREADS threads, a piece within the stride); the peers'
    // waits will say so.
    if (a.op != OP_ALLREDUCE || a.sub == 0 || blockDim.x <= P || (blockDim.x & 31) || a.piece * E > a.stride) return;
    const u64 S = (a.piece + a.sub - 1) / a.sub;
    const int par = (int)((base + 1) & 1);
    const bool in_place = a.input == a.output;
    const u64 lo0 = (u64)b * a.piece;
    const u64 lo = lo0 < a.count ? lo0 : a.count;
    const u64 n = (lo + a.piece < a.count ? lo + a.piece : a.count) - lo;
    const T* in = (const T*)a.input + lo;
    T* out = (T*)a.output + lo;
    __shared__ volatile unsigned pushed;  // sub-pieces this block's pushers have read
    if (tid == 0) pushed = 0;
    __syncthreads();
    if (tid < P) {
        unsigned char* dsts[MAX_RANKS];
        for (u64 s = 0; s < S; ++s) {
            u64 slo, shi;
            part_of(s, a.sub, n, slo, shi);
            for (int q = 0; q < N; ++q) dsts[q] = q == me ? 0 : slot(q, par, me) + slo * E;
            copy_bytes_multi<Threads<0, P>>(dsts, N, (const unsigned char*)(in + slo), (shi - slo) * E);
            // The pushes before the fence. (barrier.sync, not bar.sync: the threads of a warp
            // need not arrive together.)
            asm volatile("barrier.sync 1, %0;" ::"r"(P) : "memory");
            if (tid < (unsigned)N && tid != (unsigned)me) signal_one(a, (int)tid, base + s + 1, par);
            if (tid == P - 1) {
                // The pushers' loads of sub-piece s (done: barrier 1) before the word that lets
                // an in-place reduction overwrite them.
                __threadfence_block();
                pushed = (unsigned)(s + 1);
            }
        }
    } else {
        const unsigned rt = tid - P, R = blockDim.x - P;
        const T* srcs[MAX_RANKS];
        for (u64 s = 0; s < S; ++s) {
            int e = 0;
            if (rt < (unsigned)N && rt != (unsigned)me) {
                e = wait_one(a, (int)rt, base + s + 1, par, base + (S | 1));
                if (e) *err = e;  // read only after the final __syncthreads
            }
            if (in_place && rt == R - 1) {
                // No time limit: the pushers wait for nothing but their own barrier, so this
                // ends within a sub-piece's copy.
                while (pushed < s + 1) {
                }
                __threadfence_block();
            }
            // Whether any reducer failed, decided inside the barrier: a shared word read after
            // it could already hold the next sub-piece's failure for some threads and not
            // others, and a thread that left the loop alone would leave the rest at this
            // barrier for good.
            int any;
            asm volatile(
                "{ .reg .pred f, q;\n"
                "  setp.ne.s32 f, %1, 0;\n"
                "  barrier.red.or.pred q, 2, %2, f;\n"
                "  selp.s32 %0, 1, 0, q; }"
                : "=r"(any)
                : "r"(e), "r"(R)
                : "memory");
            if (any) break;
            u64 slo, shi;
            part_of(s, a.sub, n, slo, shi);
            for (int r = 0; r < N; ++r) srcs[r] = r == me ? in + slo : (const T*)(slot(me, par, r) + slo * E);
            reduce_into<T, Threads<P, 0>>(out + slo, nullptr, 0, srcs, N, shi - slo, a.redop, N);
        }
    }
    __syncthreads();
    if (tid == 0 && !*err) a.sync[me][COUNTERS_OFF + b] = base + (S | 1);
}

template <typename T> __device__ void entry_pipe(const CollArgs& a) {
    with_counter(a, [&](u64 base, int* err) { run_pipe<T>(a, base, err); });
}

COLL_ENTRY(pipe, entry_pipe)
