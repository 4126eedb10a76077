// Point-to-point send/recv through a ring of slots in the receiver's memory. The arguments:
// `SrArgs` and `SrWaitArgs` in transport_abi.h, compiled in front of this file.
//
// Flags are 64-bit sequence numbers, one per slot, never reset: the chunk with global index g
// uses slot g % nslots with sequence number g + 1, so counters keep advancing across calls.
// ready[s] lives in the receiver's memory (the sender stores it, the receiver polls it);
// freed[s] lives in the sender's memory (the receiver stores it, the sender polls it). Each side
// polls only its own memory. Both kernels run with one block per slot, so the successive uses of
// a slot are handled in order by one block on each side.
//
// Every wait has a deadline and watches an abort flag; on either the kernel records why in
// status[0] (SR_TIMED_OUT or SR_ABORTED, transport_abi.h) and the chunk in status[1], and returns.

__device__ __forceinline__ unsigned long long sr_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// The flag is polled every iteration; the abort flag (pinned host memory: a PCIe read) and the
// clock only every 1024, so many polling blocks do not flood the host link or the timer.
__device__ __forceinline__ int sr_wait_ge(volatile unsigned long long* flag, unsigned long long want,
                                          unsigned long long timeout_ns, volatile int* abort_flag) {
    unsigned long long deadline = 0;
    unsigned spins = 0;
    while (*flag < want) {
        if ((++spins & 1023u) == 0) {
            if (*abort_flag) return SR_ABORTED;
            const unsigned long long now = sr_now();
            if (deadline == 0) {
                deadline = now + timeout_ns;
            } else if (now > deadline) {
                return SR_TIMED_OUT;
            }
        }
    }
    return 0;
}

// Release/acquire at system scope, by the one thread that stores or polls a flag. The block
// barrier orders the other threads' copies before it (fences are cumulative in the PTX memory
// model), so no thread but that one needs a fence.
__device__ __forceinline__ void sr_fence() {
    asm volatile("fence.acq_rel.sys;" ::: "memory");
}

__device__ __forceinline__ void sr_fail(int* status, int code, unsigned long long chunk) {
    if (atomicCAS(status, 0, code) == 0) {
        status[1] = (int)chunk;
    }
}

// How a block-wide copy loads its source: plainly; bypassing L1 (`cg`: local memory that another
// GPU wrote); or re-fetched every time (`cv`: a peer's memory, reread each round).
enum SrLoad { SR_PLAIN = 0, SR_CG = 1, SR_CV = 2 };

template <int how, typename T>
__device__ __forceinline__ T sr_load(const T* p) {
    return how == SR_CG ? __ldcg(p) : how == SR_CV ? __ldcv(p) : *p;
}

template <int how>
__device__ __forceinline__ void sr_block_copy(unsigned char* dst, const unsigned char* src, unsigned long long n) {
    if (((reinterpret_cast<unsigned long long>(dst) | reinterpret_cast<unsigned long long>(src)) & 15ull) == 0) {
        const unsigned long long nv = n >> 4;
        uint4* d = reinterpret_cast<uint4*>(dst);
        const uint4* s = reinterpret_cast<const uint4*>(src);
        for (unsigned long long i = threadIdx.x; i < nv; i += blockDim.x) {
            d[i] = sr_load<how>(s + i);
        }
        for (unsigned long long j = (nv << 4) + threadIdx.x; j < n; j += blockDim.x) {
            dst[j] = sr_load<how>(src + j);
        }
    } else {
        for (unsigned long long j = threadIdx.x; j < n; j += blockDim.x) {
            dst[j] = sr_load<how>(src + j);
        }
    }
}

// Chunk k's place in the ring: its slot, its sequence number, and its bytes in the buffer.
struct SrChunk {
    unsigned s;
    unsigned long long seq, off, len;
};

__device__ __forceinline__ SrChunk sr_chunk(const SrArgs& a, unsigned long long k) {
    const unsigned long long g = a.base + k;
    const unsigned long long off = k * a.slot_bytes;
    const unsigned long long left = a.bytes - off;
    return SrChunk{(unsigned)(g % a.nslots), g + 1, off, left < a.slot_bytes ? left : a.slot_bytes};
}

// Thread 0 waits for *flag >= want (want 0: no wait) and the whole block learns the outcome.
// True when the block must stop: thread 0 has recorded why, with chunk k, in the status. A
// connection whose status already holds a failure (this launch's other blocks, or an earlier
// launch) stops at once, as p2p_wait_flag does: a broken connection drains instead of waiting
// a time limit per queued launch.
__device__ __forceinline__ bool sr_block_wait(const SrArgs& a, volatile unsigned long long* flag,
                                              unsigned long long want, unsigned long long k) {
    __shared__ int err;
    if (threadIdx.x == 0) {
        if (((volatile int*)a.status)[0] != 0) {
            err = -1;  // recorded already
        } else {
            err = want ? sr_wait_ge(flag, want, a.timeout_ns, a.abort_flag) : 0;
        }
        sr_fence();
    }
    __syncthreads();
    if (err) {
        if (threadIdx.x == 0 && err > 0) sr_fail(a.status, err, k);
        return true;
    }
    return false;
}

// Once the whole block has copied, thread 0 publishes the chunk: *flag = seq.
__device__ __forceinline__ void sr_block_post(volatile unsigned long long* flag, unsigned long long seq) {
    __syncthreads();
    if (threadIdx.x == 0) {
        sr_fence();
        *flag = seq;
    }
}

__device__ __forceinline__ unsigned long long sr_nchunks(const SrArgs& a) {
    return (a.bytes + a.slot_bytes - 1) / a.slot_bytes;
}

extern "C" __global__ void p2p_send(SrArgs a) {
    const unsigned long long nchunks = sr_nchunks(a);
    for (unsigned long long k = blockIdx.x; k < nchunks; k += gridDim.x) {
        const SrChunk c = sr_chunk(a, k);
        // The slot is free once the receiver has drained its previous use.
        if (sr_block_wait(a, &a.freed[c.s], c.seq > a.nslots ? c.seq - a.nslots : 0, k)) return;
        sr_block_copy<SR_PLAIN>(a.slots + (unsigned long long)c.s * a.slot_bytes, a.buf + c.off, c.len);
        sr_block_post(&a.ready[c.s], c.seq);
    }
}

extern "C" __global__ void p2p_recv(SrArgs a) {
    const unsigned long long nchunks = sr_nchunks(a);
    for (unsigned long long k = blockIdx.x; k < nchunks; k += gridDim.x) {
        const SrChunk c = sr_chunk(a, k);
        if (sr_block_wait(a, &a.ready[c.s], c.seq, k)) return;
        const unsigned char* slot = a.slots + (unsigned long long)c.s * a.slot_bytes;
        if (a.slots_remote) {
            sr_block_copy<SR_CV>(a.buf + c.off, slot, c.len);
        } else {
            sr_block_copy<SR_CG>(a.buf + c.off, slot, c.len);
        }
        sr_block_post(&a.freed[c.s], c.seq);
    }
}

// The copy-engine variant's wait: one thread waits for *flag >= want (same limits as above),
// so the copy queued after it on the stream starts only once the slot is ready or free. After a
// failure every later wait returns at once, so a broken connection drains instead of hanging.
extern "C" __global__ void p2p_wait_flag(SrWaitArgs a) {
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    if (((volatile int*)a.status)[0] != 0) {
        return;
    }
    const int err = sr_wait_ge(a.flag, a.want, a.timeout_ns, a.abort_flag);
    if (err) {
        sr_fail(a.status, err, a.chunk);
    }
    sr_fence();
}
