// Host side of the send/recv sweep (docs/performance.md, "Send and receive"), appended by
// sweep.sh p2p after the send/recv kernel (`coll/p2p.cuh`, from a copy of the kernels whose
// coll_abi.h holds the variant's P2P_* constants): the
// real `p2p_sendrecv`, driven as `Communicator::send_recv` drives it for a 2-rank ring
// exchange (channel 0 receives from the peer, channel 1 sends to it), in one process with peer
// access. Times many back-to-back launches with events and checks every byte after each size.
// Usage: [ODD=1] [MODE=sendrecv|pull|push] [GRID=N] p2p_sweep LABEL [MAX_MIB]; prints one
// line per size. harness.cuh (CK, open_pair) comes before this file.

// The one-copy bound (MODE=pull or MODE=push): no inbox, no flags; each GPU's GRID blocks copy
// the message straight from the peer's send buffer (pull) or into the peer's receive buffer
// (push), both GPUs at once, with the kernel's own unrolled copy. What a send/recv on
// registered buffers could reach (docs/performance.md, "Send and receive").
extern "C" __global__ void __launch_bounds__(512, 2) sweep_one_copy(unsigned char* dst, const unsigned char* src,
                                                                   u64 bytes) {
    const u64 per = ((bytes + gridDim.x - 1) / gridDim.x + 15) / 16 * 16;
    const u64 lo = (u64)blockIdx.x * per < bytes ? (u64)blockIdx.x * per : bytes;
    const u64 hi = lo + per < bytes ? lo + per : bytes;
    copy_chunk(dst + lo, src + lo, hi - lo);
}

int main(int argc, char** argv) {
    const char* label = argc > 1 ? argv[1] : "?";
    const size_t max_bytes = (size_t)(argc > 2 ? atoi(argv[2]) : 128) << 20;
    GpuPair pair = open_pair();
    cudaStream_t* st = pair.st;
    cudaEvent_t* e0 = pair.e0;
    int* abort_flag = pair.abort_flag;
    u64* sync[2];
    unsigned char *inbox[2], *src[2], *dst[2];
    for (int d = 0; d < 2; ++d) {
        CK(cudaSetDevice(d));
        CK(cudaMalloc(&sync[d], SYNC_BYTES));
        CK(cudaMemset(sync[d], 0, SYNC_BYTES));
        CK(cudaMalloc(&inbox[d], P2P_INBOX_BYTES));
        CK(cudaMalloc(&src[d], max_bytes));
        CK(cudaMalloc(&dst[d], max_bytes));
        std::vector<unsigned char> h(max_bytes);
        for (size_t i = 0; i < max_bytes; ++i) h[i] = (unsigned char)(i * 131 + d * 71 + (i >> 12));
        CK(cudaMemcpy(src[d], h.data(), max_bytes, cudaMemcpyHostToDevice));
    }
    printf("# %s: P2P_BLOCKS %d P2P_SLOTS %d P2P_CHUNK %d P2P_MIN_CHUNK %d P2P_UNROLL %d P2P_PIPE_CHUNK %d P2P_LL_BYTES %d\n",
           label, P2P_BLOCKS, P2P_SLOTS, P2P_CHUNK, P2P_MIN_CHUNK, P2P_UNROLL, P2P_PIPE_CHUNK, P2P_LL_BYTES);
    // MODE: sendrecv (default: the real kernel), pull or push (sweep_one_copy with GRID blocks).
    const char* mode_env = getenv("MODE");
    const int mode = !mode_env || !strcmp(mode_env, "sendrecv") ? 0 : !strcmp(mode_env, "pull") ? 1 : !strcmp(mode_env, "push") ? 2 : -1;
    if (mode < 0) {
        fprintf(stderr, "MODE is sendrecv, pull or push, not %s\n", mode_env);
        return 1;
    }
    const int grid = getenv("GRID") ? atoi(getenv("GRID")) : 64;
    if (mode) printf("# %s: MODE %s GRID %d\n", label, mode_env, grid);
    auto launch = [&](int d, const P2pArgs& args, size_t bytes) {
        if (mode == 0) {
            p2p_sendrecv<<<2 * P2P_BLOCKS, THREADS, 0, st[d]>>>(args);
        } else if (mode == 1) {
            sweep_one_copy<<<grid, THREADS, 0, st[d]>>>(dst[d], src[1 - d], bytes);
        } else {
            sweep_one_copy<<<grid, THREADS, 0, st[d]>>>(dst[1 - d], src[d], bytes);
        }
    };
    int failed = 0;
    // Powers of two from 8 B, and with ODD=1 also an odd size after each (1.5x + 3 bytes).
    const bool odd = getenv("ODD") && atoi(getenv("ODD")) == 1;
    std::vector<size_t> sizes;
    for (size_t b = 8; b <= max_bytes; b *= 2) {
        sizes.push_back(b);
        if (odd && b + b / 2 + 3 <= max_bytes) sizes.push_back(b + b / 2 + 3);
    }
    for (size_t bytes : sizes) {
        P2pArgs a[2];
        for (int d = 0; d < 2; ++d) {
            memset(&a[d], 0, sizeof(P2pArgs));
            const int p = 1 - d;
            // Operation o (and channel o): a receive from the peer's inbox, then a send into it.
            auto op = [&](int o, int kind, const unsigned char* from, unsigned char* to) {
                a[d].kind[o] = kind;
                a[d].src[o] = from;
                a[d].dst[o] = to;
                a[d].peer_sync[o] = sync[p];
                a[d].bytes[o] = bytes;
                a[d].peer[o] = p;
            };
            op(0, P2P_RECV, inbox[d], dst[d]);
            op(1, P2P_SEND, src[d], inbox[p]);
            a[d].chan_first[0] = 0;
            a[d].chan_ops[0] = 1;
            a[d].chan_first[1] = 1;
            a[d].chan_ops[1] = 1;
            a[d].my_sync = sync[d];
            a[d].abort_flag = abort_flag;
            a[d].timeout_ns = 5000000000ull;
            a[d].rank = d;
            a[d].channels = 2;
        }
        long iters = (long)(4e9 / (double)(bytes + (1 << 20)));
        if (iters < 20) iters = 20;
        if (iters > 2000) iters = 2000;
        for (int d = 0; d < 2; ++d) {
            CK(cudaSetDevice(d));
            CK(cudaMemsetAsync(dst[d], 0, bytes, st[d]));
            CK(cudaStreamSynchronize(st[d]));
        }
        for (int w = 0; w < 3; ++w)
            for (int d = 0; d < 2; ++d) {
                CK(cudaSetDevice(d));
                launch(d, a[d], bytes);
            }
        for (int d = 0; d < 2; ++d) {
            CK(cudaSetDevice(d));
            CK(cudaEventRecord(e0[d], st[d]));
        }
        for (long it = 0; it < iters; ++it)
            for (int d = 0; d < 2; ++d) {
                CK(cudaSetDevice(d));
                launch(d, a[d], bytes);
            }
        // Push: rank d wrote the peer's buffer; wait for both before timing stops.
        const float ms = pair_elapsed_ms(pair);
        // Check: the kernel's failure word, then every byte each rank received.
        int wrong = 0;
        for (int d = 0; d < 2; ++d) {
            u64 fail = 0;
            CK(cudaMemcpy(&fail, sync[d] + FAIL_OFF, sizeof(u64), cudaMemcpyDeviceToHost));
            if (fail) {
                fprintf(stderr, "%s: rank %d failed with code %llu at %zu B\n", label, d, fail, bytes);
                wrong = -1;
            }
            std::vector<unsigned char> got(bytes), want(bytes);
            CK(cudaMemcpy(got.data(), dst[d], bytes, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(want.data(), src[1 - d], bytes, cudaMemcpyDeviceToHost));
            if (wrong >= 0)
                for (size_t i = 0; i < bytes; ++i) wrong += got[i] != want[i];
        }
        const double us = 1000.0 * ms / (double)iters;
        printf("%s %zu %.2f %.1f %d\n", label, bytes, us, (double)bytes / us / 1e3, wrong);
        fflush(stdout);
        if (wrong) {
            failed = 1;
            break;
        }
    }
    return failed;
}
