// The doctor's functional P2P test: SM stores into and loads from a peer's memory through its
// mapping, 16 bytes at a time, with a pattern the host can recompute. Arguments: bench_abi.h.

__device__ __forceinline__ uint4 p2p_pattern(unsigned long long i, unsigned seed) {
    unsigned v = seed ^ (unsigned)(i * 2654435761ull);
    return make_uint4(v, v + 1u, v ^ 0x5a5a5a5au, ~v);
}

// dst[i] = pattern(i, seed) for i < n (dst may be a peer's memory: the "write" direction).
extern "C" __global__ void p2p_fill(FillArgs a) {
    uint4* __restrict__ dst = a.dst;
    const unsigned long long n = a.n;
    const unsigned seed = a.seed;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        dst[i] = p2p_pattern(i, seed);
    }
}

// dst[i] = src[i] for i < n (src may be a peer's memory: the "read" direction).
extern "C" __global__ void p2p_copy(CopyArgs a) {
    uint4* __restrict__ dst = a.dst;
    const uint4* __restrict__ src = a.src;
    const unsigned long long n = a.n;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        dst[i] = src[i];
    }
}
