// The gate that graph timing puts in front of the replays on every rank's stream: one thread
// spins on a flag in pinned host memory until the host sets it, so that every graph is already
// queued when the timed work starts, and the host's cost of launching the graphs stays out of
// the figure. The wait has a deadline, so a host that never opens the gate cannot hang a stream.

__device__ __forceinline__ unsigned long long p2p_gate_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Arguments: GateArgs (bench_abi.h).
extern "C" __global__ void p2p_gate(GateArgs a) {
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    const unsigned long long deadline = p2p_gate_now() + a.timeout_ns;
    while (*a.open == 0) {
        if (p2p_gate_now() > deadline) {
            *a.timed_out = 1;
            return;
        }
        __nanosleep(500);
    }
}
