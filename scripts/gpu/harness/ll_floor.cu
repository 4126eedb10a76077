// Where a small all-reduce's time goes on 2 GPUs (docs/performance.md, "All-reduce, LL"): appended
// by sweep.sh ll-floor after the LL kernels (`coll/proto/ll.cuh`, the f32 part). Times, per call
// under CUDA graph (100 calls captured per graph on each GPU, both GPUs replaying at once, like
// nccl-tests -G 100):
//   empty      a kernel that only does the PDL handshake (griddepcontrol): the launch floor
//   flag       one thread: reads its step counter, stores one LL line into the peer, polls its
//              own line for the peer's, writes the counter back: the exchange floor
//   flagnoctr  as flag, with the flag a kernel argument instead of a counter (no load before
//              the store): what the counter costs; its graph holds every call (no replays, so
//              no flag repeats)
//   real       the real coll_f32_ll, all-reduce of 8 B, 4 KiB and 64 KiB (checked)
//   realar     run_ll with the collective fixed at compile time (all-reduce), 8 B and 4 KiB
//   realar2    run_ll with the collective and the world size (2) fixed, 8 B and 4 KiB
// each with programmatic dependent launch (pdl) and without (plain). Built with LL_PROBE_ON
// (ll_probe.cuh in front of the kernels), the real kernels also print where thread 0's time went
// between the marks of run_ll (SM cycles and ns at the GPU's clock) and the gap between calls.
// Usage: ll_floor [REPLAYS]; prints `variant launch bytes us-per-call`. harness.cuh (CK,
// open_pair) comes before this file.
struct FloorArgs {
    unsigned char* peer_line;  // this rank's line in the peer's memory
    unsigned char* my_line;    // the peer's line in this rank's memory
    u64* counter;              // this rank's step counter (local)
    unsigned flag;             // flagnoctr: this call's flag
};

__device__ __forceinline__ void pdl() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

extern "C" __global__ void __launch_bounds__(512, 2) floor_empty(FloorArgs) { pdl(); }

// One LL line into the peer's line `par`, then a poll of this rank's line `par` for the peer's.
__device__ __forceinline__ void exchange(const FloorArgs& f, unsigned flag, unsigned par) {
    ll_store(f.peer_line + 16 * par, make_uint2(1, 2), flag);
    const unsigned char* p = f.my_line + 16 * par;
    while (true) {
        const uint4 v = ll_load(p);
        if (v.y == flag && v.w == flag) break;
    }
}

extern "C" __global__ void __launch_bounds__(512, 2) floor_flag(FloorArgs f) {
    pdl();
    if (threadIdx.x != 0) return;
    const u64 step = *(volatile u64*)f.counter + 1;
    exchange(f, (unsigned)(step % 0xffffffffull) + 1u, (unsigned)(step & 1));
    *f.counter = step;
}

extern "C" __global__ void __launch_bounds__(512, 2) floor_flagnoctr(FloorArgs f) {
    pdl();
    if (threadIdx.x == 0) exchange(f, f.flag, f.flag & 1);
}

extern "C" __global__ void __launch_bounds__(512, 2) realar(CollArgs a) {
    pdl();
    run_ll<float, OP_ALLREDUCE>(a);
}

extern "C" __global__ void __launch_bounds__(512, 2) realar2(CollArgs a) {
    pdl();
    run_ll<float, OP_ALLREDUCE, 2>(a);
}

int main(int argc, char** argv) {
    const int replays = argc > 1 ? atoi(argv[1]) : 20;
    GpuPair pair = open_pair();
    cudaStream_t* st = pair.st;
    cudaEvent_t* e0 = pair.e0;
    const size_t max_bytes = 64 * 1024;
    const size_t ll_region = 2ull * 2 * LL_SLOT_BYTES;
    u64* sync[2];
    unsigned char *scratch[2], *in[2], *out[2], *lines[2];
    for (int d = 0; d < 2; ++d) {
        CK(cudaSetDevice(d));
        CK(cudaMalloc(&sync[d], SYNC_BYTES));
        CK(cudaMemset(sync[d], 0, SYNC_BYTES));
        CK(cudaMalloc(&scratch[d], ll_region));
        CK(cudaMemset(scratch[d], 0, ll_region));
        CK(cudaMalloc(&lines[d], 4096));
        CK(cudaMemset(lines[d], 0, 4096));
        CK(cudaMalloc(&in[d], max_bytes));
        CK(cudaMalloc(&out[d], max_bytes));
        std::vector<float> h(max_bytes / 4);
        for (size_t i = 0; i < h.size(); ++i) h[i] = (float)((i * 7 + d * 3) % 1000);
        CK(cudaMemcpy(in[d], h.data(), max_bytes, cudaMemcpyHostToDevice));
    }
    int* abort_flag = pair.abort_flag;

    // piece: 8-byte units per block (0: as the plan, up to THREADS); block: threads per block
    // (0: THREADS, as the library launches).
    struct Variant {
        const char* name;
        const void* fn;
        size_t bytes;
        unsigned piece, block;
    };
    const Variant variants[] = {
        {"empty", (const void*)floor_empty, 0},
        {"flag", (const void*)floor_flag, 8},
        {"flagnoctr", (const void*)floor_flagnoctr, 8},
        {"real", (const void*)coll_f32_ll, 8},
        {"real", (const void*)coll_f32_ll, 4096},
        {"real", (const void*)coll_f32_ll, 65536},
        {"realar", (const void*)realar, 8},
        {"realar", (const void*)realar, 4096},
        {"realar2", (const void*)realar2, 8},
        {"realar2", (const void*)realar2, 4096},
        {"realar2", (const void*)realar2, 8, 0, 32},
        {"realar2", (const void*)realar2, 4096, 128, 128},
        {"realar2", (const void*)realar2, 4096, 64, 64},
        {"realar2", (const void*)realar2, 4096, 32, 32},
        {"realar2", (const void*)realar2, 65536},
        {"realar2", (const void*)realar2, 65536, 256, 256},
        {"realar2", (const void*)realar2, 65536, 128, 128},
        {"realar2", (const void*)realar2, 65536, 64, 64},
    };

    int failed = 0;
    for (int pass = 0; pass < 2; ++pass) {  // twice, to see the spread
        for (int use_pdl = 1; use_pdl >= 0; --use_pdl) {
            for (const Variant& v : variants) {
                cudaGraphExec_t exec[2];
                const bool real = v.fn == (const void*)coll_f32_ll || v.fn == (const void*)realar ||
                                  v.fn == (const void*)realar2;
#ifdef LL_PROBE_ON
                unsigned long long zero[8] = {0};
                for (int d = 0; d < 2; ++d) {
                    CK(cudaSetDevice(d));
                    CK(cudaMemcpyToSymbol(ll_probe_sum, zero, sizeof(zero)));
                    CK(cudaMemcpyToSymbol(ll_probe_last, zero, sizeof(zero[0])));
                }
#endif
                const u64 units = (v.bytes + 7) / 8;
                const u64 piece = v.piece ? v.piece : units < THREADS ? units : THREADS;
                const unsigned grid = real ? (unsigned)((units + piece - 1) / piece) : 1;
                const unsigned block = v.block ? v.block : THREADS;
                const bool noctr = v.fn == (const void*)floor_flagnoctr;
                const int calls = noctr ? 100 * replays : 100, reps = noctr ? 1 : replays;
                // flagnoctr's flags: above every counter-made flag, new in each pass and mode.
                const unsigned flag0 = 1000000u * (unsigned)(1 + 2 * pass + use_pdl);
                for (int d = 0; d < 2; ++d) {
                    CK(cudaSetDevice(d));
                    CK(cudaStreamBeginCapture(st[d], cudaStreamCaptureModeThreadLocal));
                    for (int c = 0; c < calls; ++c) {
                        CollArgs a;
                        memset(&a, 0, sizeof(a));
                        FloorArgs f = {lines[1 - d] + 64 * d, lines[d] + 64 * (1 - d), sync[d] + COUNTERS_OFF + 200,
                                       flag0 + (unsigned)c};
                        void* args_real[] = {&a};
                        void* args_floor[] = {&f};
                        if (real) {
                            a.input = in[d];
                            a.output = out[d];
                            for (int r = 0; r < 2; ++r) {
                                a.scratch[r] = scratch[r];
                                a.sync[r] = sync[r];
                            }
                            a.abort_flag = abort_flag;
                            a.count = v.bytes / 4;
                            a.piece = piece;
                            a.slot_bytes = 0;
                            a.timeout_ns = 5000000000ull;
                            a.op = OP_ALLREDUCE;
                            a.redop = R_SUM;
                            a.rank = d;
                            a.nranks = 2;
                        }
                        cudaLaunchConfig_t cfg;
                        memset(&cfg, 0, sizeof(cfg));
                        cfg.gridDim = dim3(grid);
                        cfg.blockDim = dim3(block);
                        cfg.stream = st[d];
                        cudaLaunchAttribute attr;
                        attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
                        attr.val.programmaticStreamSerializationAllowed = 1;
                        cfg.attrs = &attr;
                        cfg.numAttrs = use_pdl ? 1 : 0;
                        CK(cudaLaunchKernelExC(&cfg, v.fn, real ? args_real : args_floor));
                    }
                    cudaGraph_t g;
                    CK(cudaStreamEndCapture(st[d], &g));
                    CK(cudaGraphInstantiate(&exec[d], g, 0));
                    CK(cudaGraphUpload(exec[d], st[d]));  // not in the timed span
                    CK(cudaGraphDestroy(g));
                }
                // One warm-up replay (not for flagnoctr, whose flags must not repeat), then the
                // timed ones back to back (each GPU times its own stream; the slower counts).
                for (int r = noctr ? 0 : -1; r < reps; ++r) {
                    if (r == 0)
                        for (int d = 0; d < 2; ++d) {
                            CK(cudaSetDevice(d));
                            CK(cudaEventRecord(e0[d], st[d]));
                        }
                    for (int d = 0; d < 2; ++d) {
                        CK(cudaSetDevice(d));
                        CK(cudaGraphLaunch(exec[d], st[d]));
                    }
                }
                const float ms = pair_elapsed_ms(pair);
                for (int d = 0; d < 2; ++d) CK(cudaGraphExecDestroy(exec[d]));
                int wrong = 0;
                if (real) {
                    std::vector<float> a0(v.bytes / 4), a1(v.bytes / 4), o(v.bytes / 4);
                    CK(cudaMemcpy(a0.data(), in[0], v.bytes, cudaMemcpyDeviceToHost));
                    CK(cudaMemcpy(a1.data(), in[1], v.bytes, cudaMemcpyDeviceToHost));
                    for (int d = 0; d < 2; ++d) {
                        u64 fail = 0;
                        CK(cudaMemcpy(&fail, sync[d] + FAIL_OFF, sizeof(u64), cudaMemcpyDeviceToHost));
                        if (fail) wrong = -1;
                        CK(cudaMemcpy(o.data(), out[d], v.bytes, cudaMemcpyDeviceToHost));
                        for (size_t i = 0; i < o.size() && wrong >= 0; ++i) wrong += o[i] != a0[i] + a1[i];
                        CK(cudaMemset(out[d], 0, v.bytes));
                    }
                }
                printf("%-10s %-5s %6zu %.3f %d grid %u block %u\n", v.name, use_pdl ? "pdl" : "plain", v.bytes,
                       1000.0 * ms / (double)(reps * calls), wrong, grid, block);
                fflush(stdout);
#ifdef LL_PROBE_ON
                if (real)
                    for (int d = 0; d < 2; ++d) {
                        unsigned long long sum[8];
                        CK(cudaSetDevice(d));
                        CK(cudaMemcpyFromSymbol(sum, ll_probe_sum, sizeof(sum)));
                        const double n = sum[7] ? (double)sum[7] : 1.0;
                        printf("  probe gpu%d calls %llu, ns: prologue %.0f store %.0f wait %.0f output %.0f "
                               "counter %.0f; between calls %.0f\n",
                               d, sum[7], sum[1] / n, sum[2] / n, sum[3] / n, sum[4] / n, sum[5] / n, sum[6] / (n - 1.0));
                    }
#endif
                if (wrong) failed = 1;
            }
        }
    }
    return failed;
}
