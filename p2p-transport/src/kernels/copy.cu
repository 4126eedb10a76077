// Bulk copy between any two device addresses (either may be a peer's memory): the SM data path.
// 16-byte vector loads and stores, four in flight per thread, when both pointers are 16-byte
// aligned; a byte loop for the tail and for unaligned pointers.

extern "C" __global__ void p2p_copy_bytes(CopyArgs a) {
    unsigned char* __restrict__ dst = a.dst;
    const unsigned char* __restrict__ src = a.src;
    const unsigned long long n = a.bytes;
    const unsigned long long tid = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    if (((reinterpret_cast<unsigned long long>(dst) | reinterpret_cast<unsigned long long>(src)) & 15ull) == 0) {
        const unsigned long long nv = n >> 4;
        uint4* __restrict__ d = reinterpret_cast<uint4*>(dst);
        const uint4* __restrict__ s = reinterpret_cast<const uint4*>(src);
        unsigned long long i = tid;
        // All four loads are issued before any store, so four 16-byte requests are in flight.
        for (; i + 3 * stride < nv; i += 4 * stride) {
            const uint4 a = s[i];
            const uint4 b = s[i + stride];
            const uint4 c = s[i + 2 * stride];
            const uint4 e = s[i + 3 * stride];
            d[i] = a;
            d[i + stride] = b;
            d[i + 2 * stride] = c;
            d[i + 3 * stride] = e;
        }
        for (; i < nv; i += stride) {
            d[i] = s[i];
        }
        for (unsigned long long j = (nv << 4) + tid; j < n; j += stride) {
            dst[j] = src[j];
        }
    } else {
        for (unsigned long long j = tid; j < n; j += stride) {
            dst[j] = src[j];
        }
    }
}
