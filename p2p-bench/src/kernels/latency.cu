// Small-message latency between two GPUs: a ping-pong of flag stores. Each flag lives in the
// memory of the GPU that waits on it; the other GPU stores into it through the peer mapping.
// One thread per GPU. Every wait has a deadline, so a missing partner ends the kernel instead
// of hanging it.

__device__ __forceinline__ unsigned long long p2p_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Arguments: PingPongArgs (bench_abi.h).
// result[0] = nanoseconds for `iters` round trips after `warmup` untimed ones;
// result[1] = 0 on success, 1 if a wait passed its deadline.
extern "C" __global__ void p2p_pingpong(PingPongArgs a) {
    volatile unsigned* mine = a.mine;
    volatile unsigned* theirs = a.theirs;
    const unsigned warmup = a.warmup, iters = a.iters;
    const int starter = a.starter;
    const unsigned long long timeout_ns = a.timeout_ns;
    unsigned long long* result = a.result;
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    unsigned long long t0 = p2p_now();
    const unsigned total = warmup + iters;
    for (unsigned i = 1; i <= total; ++i) {
        if (i == warmup + 1) {
            t0 = p2p_now();
        }
        if (starter) {
            *theirs = i;
        }
        const unsigned long long deadline = p2p_now() + timeout_ns;
        while (*mine < i) {
            if (p2p_now() > deadline) {
                result[0] = 0;
                result[1] = 1;
                return;
            }
        }
        if (!starter) {
            *theirs = i;
        }
    }
    result[0] = p2p_now() - t0;
    result[1] = 0;
}
