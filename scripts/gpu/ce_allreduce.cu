// Copy-engine all-reduce on 2 GPUs (perf-notes §30): can the copy engines carry a large
// all-reduce past the 361 GB/s an SM push reaches (§27)? Appended by ce-allreduce.sh after
// harness.cuh (CK, open_pair); needs the driver API (cuStreamWriteValue32) and 2 GPUs.
//
// One call, out of place, per rank r with peer p:
//   main stream: a barrier (a stream write into the peer, a stream wait on our own word), then
//                for each of K chunks one cuMemcpyAsync of r's input chunk into p's OUTPUT chunk
//                and a stream write of 1 into p's flag for the chunk (after the copy, in stream
//                order);
//   side stream: forked from main after the barrier: a reduce kernel that waits for each
//                chunk's flag (the peer's copy has landed in r's output) and adds r's input into
//                it, then a memset of the flags; joined back into main.
// Variants (argv): SIZE_MIB K GRID COPY_STREAMS ITERS [uni|geo|geo1|lib|libpdl|lib32|copyonly|a2a]
//   COPY_STREAMS 1 or 2: chunks alternate between two copy streams (two copy engines);
//   uni / geo: uniform chunks / halving chunks (n/2, n/4, ...: a small tail to reduce);
//   geo1: halving chunks, each block reducing a contiguous share, one vector a round (the
//         library's first reduce loop);
//   lib / libpdl: the library's own kernel (coll_f32_ce from coll.cu, which ce-allreduce.sh
//         puts in front of this file) on the library's sync-area flags (64-bit words at
//         CE_FLAGS_OFF, CE_CHUNKS chunks whatever K says), launched plainly or with
//         programmatic dependent launch as the library launches it; lib32: lib with the flags
//         written as their low 32-bit word (cuStreamWriteValue32) instead of 64 bits;
//   copyonly: no reduce kernel (the flags are still written): the copy engines' bound;
//   a2a: an all-to-all's data movement instead: half the input to the peer by one copy, the
//        other half copied locally beside it on the side stream (GRID blocks of a copy kernel,
//        or cudaMemcpyAsync with GRID 0), the side stream then waiting for the peer's flag.
// Prints: variant size K grid streams us-per-call busbw(GB/s) wrong
#include <cuda.h>

#define CKD(x)                                                                     \
    do {                                                                           \
        CUresult r_ = (x);                                                         \
        if (r_ != CUDA_SUCCESS) {                                                  \
            const char* s_ = nullptr;                                              \
            cuGetErrorString(r_, &s_);                                             \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, s_ ? s_ : "?"); \
            exit(1);                                                               \
        }                                                                          \
    } while (0)

static const int MAX_K = 256;

// Chunk k of K over n4 float4s: uniform (geo = 0) or halving (geo = 1: n/2, n/4, ..., the last
// chunk the rest), so that the reduction left after the last copy is small.
__host__ __device__ inline void chunk_bounds(int k, int K, size_t n4, int geo, size_t* b, size_t* e) {
    if (geo) {
        *b = n4 - (n4 >> k);
        *e = (k == K - 1) ? n4 : n4 - (n4 >> (k + 1));
    } else {
        const size_t c = (n4 + K - 1) / K;
        *b = min((size_t)k * c, n4);
        *e = min(*b + c, n4);
    }
    // Keep chunk edges on 64 KiB so copies stay large and aligned.
    *b &= ~(size_t)4095;
    if (*e != n4) *e &= ~(size_t)4095;
}

// Thread 0 waits for chunk k's flag (a time limit of about 2 s at the SM clock sets *err
// instead of hanging), then the block goes on together.
__device__ void wait_chunk(const unsigned* flags, int k, int* err) {
    if (threadIdx.x == 0) {
        const long long t0 = clock64();
        while (*(volatile const unsigned*)(flags + k) == 0) {
            if (clock64() - t0 > 4000000000ll) {
                atomicExch(err, 1000 + k);
                break;
            }
        }
        __threadfence();
    }
    __syncthreads();
}

// out[k] += in[k] for every chunk k, each chunk once its flag says the peer's copy landed.
// Kept apart from the library's loop (coll.cu ce_reduce_vecs, the same shape) on purpose: this
// is the baseline (mode geo) that the library's kernel (modes lib*) is measured against.
extern "C" __global__ void __launch_bounds__(512) ce_reduce(float4* out, const float4* in,
                                                            const unsigned* flags, int K,
                                                            int geo, size_t total4, int* err) {
    for (int k = 0; k < K; ++k) {
        wait_chunk(flags, k, err);
        size_t base, end;
        chunk_bounds(k, K, total4, geo, &base, &end);
        const size_t stride = (size_t)gridDim.x * blockDim.x;
        size_t i = base + (size_t)blockIdx.x * blockDim.x + threadIdx.x;
        for (; i + 3 * stride < end; i += 4 * stride) {
            float4 a[4], b[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                a[u] = __ldcg(out + i + u * stride);
                b[u] = __ldcs(in + i + u * stride);
            }
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                float4 c = make_float4(a[u].x + b[u].x, a[u].y + b[u].y, a[u].z + b[u].z,
                                       a[u].w + b[u].w);
                __stcg(out + i + u * stride, c);
            }
        }
        for (; i < end; i += stride) {
            float4 a = __ldcg(out + i), b = __ldcs(in + i);
            __stcg(out + i, make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w));
        }
    }
}

// As ce_reduce, but the way the library's first version did it: block b reduces a contiguous
// share of each chunk, one 16-byte vector per thread per round, no unrolling (mode geo1).
extern "C" __global__ void __launch_bounds__(512) ce_reduce_share(float4* out, const float4* in,
                                                                  const unsigned* flags, int K,
                                                                  int geo, size_t total4, int* err) {
    for (int k = 0; k < K; ++k) {
        wait_chunk(flags, k, err);
        size_t base, end;
        chunk_bounds(k, K, total4, geo, &base, &end);
        const size_t share = (end - base + gridDim.x - 1) / gridDim.x;
        const size_t lo = min(base + blockIdx.x * share, end), hi = min(lo + share, end);
        for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
            float4 a = __ldcg(out + i), b = __ldcg(in + i);
            out[i] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
        }
        __syncthreads();
    }
}

extern "C" __global__ void copy_kernel(float4* dst, const float4* src, size_t n4) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
         i += (size_t)gridDim.x * blockDim.x)
        __stcs(dst + i, __ldcs(src + i));
}

extern "C" __global__ void fill(float* p, size_t n, float base) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = base + (float)(i % 1021);
}

extern "C" __global__ void check(const float* p, size_t n, float want_base, unsigned long long* wrong) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        if (p[i] != want_base + 2.0f * (float)(i % 1021)) atomicAdd(wrong, 1ull);
}

// All-to-all on 2 ranks: rank d's output half j is rank j's input half d; input of rank r at
// index i is 1 + r + i % 1021.
extern "C" __global__ void check_a2a(const float* p, size_t n, int d, unsigned long long* wrong) {
    const size_t h = n / 2;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const int j = i < h ? 0 : 1;
        const size_t src = d * h + (i - j * h);
        if (p[i] != 1.0f + j + (float)(src % 1021)) atomicAdd(wrong, 1ull);
    }
}

struct Rank {
    float *in, *out;
    unsigned* flags;     // MAX_K words the peer's copies set
    unsigned* barrier;   // one word the peer's barrier write sets
    cudaStream_t side, copy2;
    cudaEvent_t fork, join, join2;
    int* err;
};

int main(int argc, char** argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: ce_allreduce SIZE_MIB K GRID COPY_STREAMS ITERS [copyonly]\n");
        return 2;
    }
    const size_t mib = strtoull(argv[1], nullptr, 10);
    const int K = atoi(argv[2]), grid = atoi(argv[3]), nstreams = atoi(argv[4]),
              iters = atoi(argv[5]);
    const char* mode = argc > 6 ? argv[6] : "uni";
    const bool copyonly = strcmp(mode, "copyonly") == 0, a2a = strcmp(mode, "a2a") == 0;
    const bool share = strcmp(mode, "geo1") == 0;
    const bool libk = strncmp(mode, "lib", 3) == 0, pdl = strcmp(mode, "libpdl") == 0;
    const bool w32 = strcmp(mode, "lib32") == 0;
    const int geo = strcmp(mode, "geo") == 0 || share;
    if (K < 1 || K > MAX_K || nstreams < 1 || nstreams > 2) return 2;
    const size_t bytes = mib << 20, n = bytes / 4, n4 = n / 4;
    GpuPair pair = open_pair();
    CKD(cuInit(0));
    Rank rk[2];
    for (int d = 0; d < 2; ++d) {
        CK(cudaSetDevice(d));
        CK(cudaMalloc(&rk[d].in, bytes));
        CK(cudaMalloc(&rk[d].out, bytes));
        CK(cudaMalloc(&rk[d].flags, MAX_K * 4));
        CK(cudaMemset(rk[d].flags, 0, MAX_K * 4));
        CK(cudaMalloc(&rk[d].barrier, 4));
        CK(cudaMemset(rk[d].barrier, 0, 4));
        CK(cudaMalloc(&rk[d].err, 4));
        CK(cudaMemset(rk[d].err, 0, 4));
        CK(cudaStreamCreateWithFlags(&rk[d].side, cudaStreamNonBlocking));
        CK(cudaStreamCreateWithFlags(&rk[d].copy2, cudaStreamNonBlocking));
        CK(cudaEventCreateWithFlags(&rk[d].fork, cudaEventDisableTiming));
        CK(cudaEventCreateWithFlags(&rk[d].join, cudaEventDisableTiming));
        CK(cudaEventCreateWithFlags(&rk[d].join2, cudaEventDisableTiming));
        fill<<<264, 512>>>(rk[d].in, n, 1.0f + d);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
    }
    unsigned char* sync[2];
    for (int d = 0; d < 2; ++d) {
        CK(cudaSetDevice(d));
        CK(cudaMalloc(&sync[d], SYNC_BYTES));
        CK(cudaMemset(sync[d], 0, SYNC_BYTES));
    }
    auto lib_chunk = [&](int k, u64* lo, u64* hi) {
        const u64 align = CE_ALIGN / 4, nn = n;
        *lo = k == 0 ? 0 : (nn - (nn >> k)) / align * align;
        *hi = k == CE_CHUNKS - 1 ? nn : (nn - (nn >> (k + 1))) / align * align;
    };
    unsigned epoch = 0;
    auto call = [&](int d) {
        Rank& me = rk[d];
        Rank& peer = rk[1 - d];
        cudaStream_t m = pair.st[d];
        CK(cudaSetDevice(d));
        CKD(cuStreamWriteValue32((CUstream)m, (CUdeviceptr)peer.barrier, epoch, 0));
        CKD(cuStreamWaitValue32((CUstream)m, (CUdeviceptr)me.barrier, epoch, CU_STREAM_WAIT_VALUE_GEQ));
        CK(cudaEventRecord(me.fork, m));
        CK(cudaStreamWaitEvent(me.side, me.fork, 0));
        if (nstreams == 2) CK(cudaStreamWaitEvent(me.copy2, me.fork, 0));
        if (libk) {
            CollArgs a;
            memset(&a, 0, sizeof a);
            a.input = (const unsigned char*)me.in;
            a.output = (unsigned char*)me.out;
            a.sync[0] = (u64*)sync[0];
            a.sync[1] = (u64*)sync[1];
            a.abort_flag = pair.abort_flag;
            a.count = n;
            a.piece = 1;
            a.timeout_ns = 5000000000ull;
            a.kind = K_ALLREDUCE_CE;
            a.redop = R_SUM;
            a.rank = d;
            a.nranks = 2;
            if (pdl) {
                cudaLaunchConfig_t cfg = {};
                cudaLaunchAttribute at[1];
                at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                at[0].val.programmaticStreamSerializationAllowed = 1;
                cfg.gridDim = dim3(grid);
                cfg.blockDim = dim3(512);
                cfg.stream = me.side;
                cfg.attrs = at;
                cfg.numAttrs = 1;
                CK(cudaLaunchKernelEx(&cfg, coll_f32_ce, a));
            } else {
                coll_f32_ce<<<grid, 512, 0, me.side>>>(a);
                CK(cudaGetLastError());
            }
            CK(cudaMemsetAsync(sync[d] + CE_FLAGS_OFF * 8, 0, CE_CHUNKS * 8, me.side));
            for (int k = 0; k < CE_CHUNKS; ++k) {
                u64 lo, hi;
                lib_chunk(k, &lo, &hi);
                if (hi > lo)
                    CK(cudaMemcpyAsync((char*)peer.out + lo * 4, (const char*)me.in + lo * 4,
                                       (hi - lo) * 4, cudaMemcpyDeviceToDevice, m));
                const CUdeviceptr f = (CUdeviceptr)(sync[1 - d] + (CE_FLAGS_OFF + k) * 8);
                if (w32) {
                    CKD(cuStreamWriteValue32((CUstream)m, f, 1, 0));  // the low word
                } else {
                    CKD(cuStreamWriteValue64((CUstream)m, f, 1, 0));
                }
            }
            CK(cudaEventRecord(me.join, me.side));
            CK(cudaStreamWaitEvent(m, me.join, 0));
            return;
        }
        if (a2a) {
            const size_t half = bytes / 2;
            const char* src = (const char*)me.in;
            char* dst = (char*)me.out;
            if (grid > 0) {
                copy_kernel<<<grid, 512, 0, me.side>>>((float4*)(dst + d * half),
                                                       (const float4*)(src + d * half), half / 16);
                CK(cudaGetLastError());
            } else {
                CK(cudaMemcpyAsync(dst + d * half, src + d * half, half, cudaMemcpyDeviceToDevice,
                                   me.side));
            }
            CKD(cuStreamWaitValue32((CUstream)me.side, (CUdeviceptr)me.flags, 1,
                                    CU_STREAM_WAIT_VALUE_GEQ));
            CK(cudaMemsetAsync(me.flags, 0, 4, me.side));
            CK(cudaMemcpyAsync((char*)peer.out + d * half, src + (1 - d) * half, half,
                               cudaMemcpyDeviceToDevice, m));
            CKD(cuStreamWriteValue32((CUstream)m, (CUdeviceptr)peer.flags, 1, 0));
            CK(cudaEventRecord(me.join, me.side));
            CK(cudaStreamWaitEvent(m, me.join, 0));
            return;
        }
        if (share) {
            ce_reduce_share<<<grid, 512, 0, me.side>>>((float4*)me.out, (const float4*)me.in,
                                                        me.flags, K, geo, n4, me.err);
            CK(cudaGetLastError());
        } else if (!copyonly) {
            ce_reduce<<<grid, 512, 0, me.side>>>((float4*)me.out, (const float4*)me.in, me.flags,
                                                  K, geo, n4, me.err);
            CK(cudaGetLastError());
        } else {
            // Still wait for every flag so the call ends when the peer's copies have landed.
            for (int k = 0; k < K; ++k)
                CKD(cuStreamWaitValue32((CUstream)me.side, (CUdeviceptr)(me.flags + k), 1,
                                        CU_STREAM_WAIT_VALUE_GEQ));
        }
        CK(cudaMemsetAsync(me.flags, 0, K * 4, me.side));
        for (int k = 0; k < K; ++k) {
            size_t b4, e4;
            chunk_bounds(k, K, n4, geo, &b4, &e4);
            const size_t off = b4 * 16;
            if (e4 <= b4) {
                // An empty chunk: still flag it.
                cudaStream_t s = (nstreams == 2 && (k & 1)) ? me.copy2 : m;
                CKD(cuStreamWriteValue32((CUstream)s, (CUdeviceptr)(peer.flags + k), 1, 0));
                continue;
            }
            const size_t len = (e4 - b4) * 16;
            cudaStream_t s = (nstreams == 2 && (k & 1)) ? me.copy2 : m;
            CK(cudaMemcpyAsync((char*)peer.out + off, (const char*)me.in + off, len,
                               cudaMemcpyDeviceToDevice, s));
            CKD(cuStreamWriteValue32((CUstream)s, (CUdeviceptr)(peer.flags + k), 1, 0));
        }
        CK(cudaEventRecord(me.join, me.side));
        CK(cudaStreamWaitEvent(m, me.join, 0));
        if (nstreams == 2) {
            CK(cudaEventRecord(me.join2, me.copy2));
            CK(cudaStreamWaitEvent(m, me.join2, 0));
        }
    };
    // Warm-up and check.
    ++epoch;
    call(0);
    call(1);
    unsigned long long* wrong;
    CK(cudaMallocManaged(&wrong, 8));
    *wrong = 0;
    for (int d = 0; d < 2; ++d) {
        CK(cudaSetDevice(d));
        CK(cudaStreamSynchronize(pair.st[d]));
        if (a2a) {
            check_a2a<<<264, 512, 0, pair.st[d]>>>(rk[d].out, n, d, wrong);
            CK(cudaStreamSynchronize(pair.st[d]));
        } else if (!copyonly) {
            check<<<264, 512, 0, pair.st[d]>>>(rk[d].out, n, 3.0f, wrong);
            CK(cudaStreamSynchronize(pair.st[d]));
        }
        int e = 0;
        CK(cudaMemcpy(&e, rk[d].err, 4, cudaMemcpyDeviceToHost));
        if (e) fprintf(stderr, "rank %d: flag wait timed out (chunk %d)\n", d, e - 1000);
    }
    for (int d = 0; d < 2; ++d) {
        CK(cudaSetDevice(d));
        CK(cudaEventRecord(pair.e0[d], pair.st[d]));
    }
    for (int it = 0; it < iters; ++it) {
        ++epoch;
        call(0);
        call(1);
    }
    const float ms = pair_elapsed_ms(pair) / iters;
    if (a2a) {
        printf("a2a %zu MiB grid=%d %.1f us %.1f GB/s wrong=%llu\n", mib, grid, ms * 1e3,
               bytes / 2 / (ms * 1e-3) / 1e9, *wrong);
        return 0;
    }
    printf("%s %zu MiB K=%d grid=%d streams=%d %.1f us %.1f GB/s wrong=%llu\n",
           mode, mib, K, grid, nstreams, ms * 1e3,
           bytes / (ms * 1e-3) / 1e9, copyonly ? 0ull : *wrong);
    return 0;
}
