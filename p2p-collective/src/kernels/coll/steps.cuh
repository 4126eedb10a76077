// The kernel families, each its own entry point so that each gets its own register allocation
// (one large function made ptxas spill in the hot loops): the stepped kinds through the scratch
// (`coll_<type>`), the split broadcast and reduce (`coll_<type>_split`), LL (`coll_<type>_ll`),
// the direct kinds on registered buffers (`coll_<type>_direct`), and LL all-reduce on two
// ranks with its kind and world size known at compile time (`coll_<type>_ll2`: the smaller
// code, with its one peer and one reduction unrolled, measured 0.45 us faster a call than the
// general LL kernel at 8 B-4 KiB, perf-notes §28), and the copy-engine all-reduce's reduction
// (`coll_<type>_ce`: in the direct family its unrolled loop made ptxas spill there), and the
// pipelined one-shot all-reduce (`coll_<type>_pipe`, its block split into pushing and reducing
// warps), and all-gather, all-to-all and reduce-scatter through the scratch where a part or a
// buffer lies off a 16-byte boundary (`coll_<type>_shift`: its copies realign their words; in
// the steps kernel that code cost aligned copies 2-3 %, perf-notes §44). The host picks by
// kind, world size and alignment.
enum Family { FAM_STEPS = 0, FAM_LL = 1, FAM_DIRECT = 2, FAM_SPLIT = 3, FAM_LL2 = 4, FAM_CE = 5, FAM_PIPE = 6, FAM_SHIFT = 7 };

template <typename T, int FAMILY>
__device__ void run(const CollArgs& a) {
    const int b = blockIdx.x, G = gridDim.x, N = a.nranks, me = a.rank;
    const u64 E = sizeof(T);
    // The `_shift` family: all-gather, all-to-all and reduce-scatter with copies that realign
    // their words where ends lie off a 16-byte boundary unlike each other (copy_shifted).
    constexpr bool SH = FAMILY == FAM_SHIFT;
    u64* mine = a.sync[me];
#if __CUDA_ARCH__ >= 900
    // Launched with programmatic dependent launch: wait here until the previous kernel on the
    // stream has finished and its writes are visible (our counters, the caller's buffers), and
    // let the next one be scheduled early, hiding the launch gap.
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    if (FAMILY == FAM_LL) {
        run_ll<T>(a);
        return;
    }
    if (FAMILY == FAM_LL2) {
        run_ll<T, K_ALLREDUCE_LL, 2>(a);
        return;
    }
    __shared__ int err;
    __shared__ u64 base;
    if (threadIdx.x == 0) {
        err = (int)((volatile u64*)mine)[FAIL_OFF];
        base = mine[COUNTERS_OFF + b];
    }
    __syncthreads();
    if (err) return;  // an earlier call failed: the communicator is unusable, drain at once
    if (FAMILY == FAM_CE) {
        run_ce_reduce<T>(a, &err);
        return;
    }
    if (FAMILY == FAM_DIRECT) {
        run_direct<T>(a, base, &err);
        return;
    }
    if (FAMILY == FAM_PIPE) {
        run_pipe<T>(a, base, &err);
        return;
    }

    u64 step = base;
    const u64 chunk = a.piece * (u64)G;
    const u64 nchunks = (a.count + chunk - 1) / chunk;
    const T* in = (const T*)a.input;
    T* out = (T*)a.output;
    // This block's slot in rank r's scratch for parity `par` and source rank `src`.
    // Block b's region starts at b * stride (the tuning's largest piece) whatever this call's
    // piece, so it is only ever used by block b, on every rank: blocks' counters differ after
    // calls of different grids, and the parity argument of the file comment holds per block.
#define SLOT(r, par, src) (a.scratch[r] + ((u64)(par) * N + (src)) * a.slot_bytes + (u64)b * a.stride)

    for (u64 c = 0; c < nchunks; ++c) {
        const u64 lo0 = c * chunk + (u64)b * a.piece;
        const u64 lo = lo0 < a.count ? lo0 : a.count;
        const u64 hi = lo + a.piece < a.count ? lo + a.piece : a.count;
        const u64 n = hi - lo;
        unsigned char* dsts[MAX_RANKS];
        const T* srcs[MAX_RANKS];
        switch (a.kind) {
            case K_ALLREDUCE_ONESHOT: {
                if (FAMILY != FAM_STEPS) return;
                const int par = (int)((step + 1) & 1);
                for (int q = 0; q < N; ++q) dsts[q] = q == me ? 0 : SLOT(q, par, me);
                copy_bytes_multi(dsts, N, (const unsigned char*)(in + lo), n * E);
                if (barrier(a, ++step, &err)) return;
                for (int r = 0; r < N; ++r) srcs[r] = r == me ? in + lo : (const T*)SLOT(me, par, r);
                reduce_into<T>(out + lo, dsts, 0, srcs, N, n, a.redop, N);
                break;
            }
            case K_ALLREDUCE_TWOSHOT: {
                if (FAMILY != FAM_STEPS) return;
                // The piece splits into N parts of `sub` elements (whole 16-byte vectors); rank
                // q reduces part q, then hands the result to everyone.
                const u64 vecs = 16 / E;
                const u64 sub = ((n + N - 1) / N + vecs - 1) / vecs * vecs;
                const int par1 = (int)((step + 1) & 1), par2 = (int)((step + 2) & 1);
                for (int q = 0; q < N; ++q) {
                    u64 qlo, qhi;
                    part_of(q, sub, n, qlo, qhi);
                    if (q != me) copy_bytes(SLOT(q, par1, me) + qlo * E, (const unsigned char*)(in + lo + qlo), (qhi - qlo) * E);
                }
                if (barrier(a, ++step, &err)) return;
                u64 mlo, mhi;
                part_of(me, sub, n, mlo, mhi);
                int nd = 0;
                for (int q = 0; q < N; ++q)
                    if (q != me) dsts[nd++] = SLOT(q, par2, me) + mlo * E;
                for (int r = 0; r < N; ++r)
                    srcs[r] = r == me ? in + lo + mlo : (const T*)(SLOT(me, par1, r) + mlo * E);
                reduce_into<T>(out + lo + mlo, dsts, nd, srcs, N, mhi - mlo, a.redop, N);
                if (barrier(a, ++step, &err)) return;
                for (int q = 0; q < N; ++q) {
                    if (q == me) continue;
                    u64 qlo, qhi;
                    part_of(q, sub, n, qlo, qhi);
                    copy_bytes((unsigned char*)(out + lo + qlo), SLOT(me, par2, q) + qlo * E, (qhi - qlo) * E);
                }
                break;
            }
            case K_ALLREDUCE_RING: {
                if (FAMILY != FAM_STEPS) return;
                // Reduce-scatter then all-gather around the ring me -> me+1, one part per rank.
                // Part p starts at rank p+1 and travels the ring, each rank adding its own
                // input; rank p gets the full sum of part p after N-1 hops (the order of the
                // additions is fixed per part), then passes the result on for N-1 more hops.
                const u64 vecs = 16 / E;
                const u64 sub = ((n + N - 1) / N + vecs - 1) / vecs * vecs;
                const int next = (me + 1) % N, prev = (me + N - 1) % N;
                for (int s = 0; s < 2 * (N - 1); ++s) {
                    const int par = (int)((step + 1) & 1), ppar = (int)(step & 1);
                    // The part this rank sends in step s, and the one it received in step s-1.
                    const int send_part = ((me - 1 - s) % N + 2 * N) % N;
                    u64 plo, phi;
                    part_of(send_part, sub, n, plo, phi);
                    unsigned char* to = SLOT(next, par, me) + plo * E;
                    if (s == 0) {
                        copy_bytes(to, (const unsigned char*)(in + lo + plo), (phi - plo) * E);
                    } else if (s < N - 1) {
                        srcs[0] = (const T*)(SLOT(me, ppar, prev) + plo * E);
                        srcs[1] = in + lo + plo;
                        dsts[0] = to;
                        reduce_into<T>((T*)to, dsts, 0, srcs, 2, phi - plo, a.redop == R_AVG ? R_SUM : a.redop, N);
                    } else if (s == N - 1) {
                        // Last reduction: this rank finishes part `send_part` (its own index + 1
                        // ... wraps to me), writes it out and starts passing it on.
                        srcs[0] = (const T*)(SLOT(me, ppar, prev) + plo * E);
                        srcs[1] = in + lo + plo;
                        dsts[0] = to;
                        reduce_into<T>(out + lo + plo, dsts, 1, srcs, 2, phi - plo, a.redop, N);
                    } else {
                        copy_bytes(to, SLOT(me, ppar, prev) + plo * E, (phi - plo) * E);
                        copy_bytes((unsigned char*)(out + lo + plo), SLOT(me, ppar, prev) + plo * E, (phi - plo) * E);
                    }
                    if (barrier(a, ++step, &err)) return;
                }
                // The last part arrived in the final step: store it.
                {
                    const int ppar = (int)(step & 1);
                    const int part = ((me - 1 - 2 * (N - 1)) % N + 2 * N) % N;
                    u64 plo, phi;
                    part_of(part, sub, n, plo, phi);
                    copy_bytes((unsigned char*)(out + lo + plo), SLOT(me, ppar, prev) + plo * E, (phi - plo) * E);
                }
                break;
            }
            case K_REDUCE: {
                if (FAMILY != FAM_STEPS) return;
                const int par = (int)((step + 1) & 1);
                if (me != a.root) copy_bytes(SLOT(a.root, par, me), (const unsigned char*)(in + lo), n * E);
                if (barrier(a, ++step, &err)) return;
                if (me == a.root) {
                    for (int r = 0; r < N; ++r) srcs[r] = r == me ? in + lo : (const T*)SLOT(me, par, r);
                    reduce_into<T>(out + lo, dsts, 0, srcs, N, n, a.redop, N);
                }
                break;
            }
            case K_BROADCAST: {
                if (FAMILY != FAM_STEPS) return;
                const int par = (int)((step + 1) & 1);
                if (me == a.root) {
                    for (int q = 0; q < N; ++q) dsts[q] = q == me ? 0 : SLOT(q, par, me);
                    copy_bytes_multi(dsts, N, (const unsigned char*)(in + lo), n * E);
                }
                // The root's own copy runs while its signal travels.
                signal_peers(a, ++step);
                if (me == a.root) copy_bytes((unsigned char*)(out + lo), (const unsigned char*)(in + lo), n * E);
                if (wait_peers(a, step, &err)) return;
                if (me != a.root) copy_bytes((unsigned char*)(out + lo), SLOT(me, par, a.root), n * E);
                break;
            }
            case K_ALLGATHER: {
                if (FAMILY != FAM_STEPS && !SH) return;
                const int par = (int)((step + 1) & 1);
                for (int q = 0; q < N; ++q) dsts[q] = q == me ? 0 : SLOT(q, par, me);
                copy_bytes_multi<Block, SH>(dsts, N, (const unsigned char*)(in + lo), n * E);
                signal_peers(a, ++step);  // the own part is copied while the signal travels
                if (!a.own_done) copy_bytes<SH>((unsigned char*)(out + (u64)me * a.count + lo), (const unsigned char*)(in + lo), n * E);
                if (wait_peers(a, step, &err)) return;
                for (int r = 0; r < N; ++r)
                    if (r != me) copy_bytes<SH>((unsigned char*)(out + (u64)r * a.count + lo), SLOT(me, par, r), n * E);
                break;
            }
            case K_REDUCESCATTER: {
                if (FAMILY != FAM_STEPS && !SH) return;
                const int par = (int)((step + 1) & 1);
                // So that the reduction reads and writes 16-byte vectors, not an element at a
                // time, the `_shift` kernels (the host runs the steps kernel where every part is
                // on a boundary) use this rank's own slot, which no peer writes: an own part off
                // a 16-byte boundary is staged there (perf-notes §44), and an output off the
                // boundary (in place it is the own part) is reduced there and then copied out
                // realigned (§45).
                const T* own = in + (u64)me * a.count + lo;
                T* const own_slot = (T*)SLOT(me, par, me);
                const bool stage = SH && !aligned16(own);
                const bool via = SH && !aligned16(out + lo);
                for (int q = 0; q < N; ++q)
                    if (q != me || stage) copy_bytes<SH>(SLOT(q, par, me), (const unsigned char*)(in + (u64)q * a.count + lo), n * E);
                if (barrier(a, ++step, &err)) return;
                for (int r = 0; r < N; ++r) srcs[r] = r == me && !stage ? own : (const T*)SLOT(me, par, r);
                reduce_into<T>(via ? own_slot : out + lo, dsts, 0, srcs, N, n, a.redop, N);
                if (via) {
                    __syncthreads();  // the copy's threads read what other threads reduced
                    copy_bytes<SH>((unsigned char*)(out + lo), (const unsigned char*)own_slot, n * E);
                }
                break;
            }
            case K_ALLTOALL: {
                if (FAMILY != FAM_STEPS && !SH) return;
                const int par = (int)((step + 1) & 1);
                for (int q = 0; q < N; ++q)
                    if (q != me) copy_bytes<SH>(SLOT(q, par, me), (const unsigned char*)(in + (u64)q * a.count + lo), n * E);
                signal_peers(a, ++step);  // the own part is copied while the signal travels
                if (!a.own_done)
                    copy_bytes<SH>((unsigned char*)(out + (u64)me * a.count + lo), (const unsigned char*)(in + (u64)me * a.count + lo), n * E);
                if (wait_peers(a, step, &err)) return;
                for (int r = 0; r < N; ++r)
                    if (r != me) copy_bytes<SH>((unsigned char*)(out + (u64)r * a.count + lo), SLOT(me, par, r), n * E);
                break;
            }
            case K_BROADCAST_SPLIT: {
                if (FAMILY != FAM_SPLIT) return;
                // The piece splits into N-1 parts (whole vectors); part j belongs to the j-th
                // non-root (rank j, or j+1 past the root). Step 1: the root sends each non-root
                // its part. Step 2: each non-root writes its part out and forwards it to the
                // other non-roots. Every GPU's links carry the data about once.
                const u64 vecs = 16 / E;
                const u64 sub = ((n + N - 2) / (N - 1) + vecs - 1) / vecs * vecs;
                const int par1 = (int)((step + 1) & 1), par2 = (int)((step + 2) & 1);
                if (me == a.root) {
                    for (int j = 0; j < N - 1; ++j) {
                        const int q = nonroot_rank(j, a.root);
                        u64 jlo, jhi;
                        part_of(j, sub, n, jlo, jhi);
                        copy_bytes(SLOT(q, par1, me) + jlo * E, (const unsigned char*)(in + lo + jlo), (jhi - jlo) * E);
                    }
                }
                signal_peers(a, ++step);  // the root's own copy runs while its signal travels
                if (me == a.root) copy_bytes((unsigned char*)(out + lo), (const unsigned char*)(in + lo), n * E);
                if (wait_peers(a, step, &err)) return;
                if (me != a.root) {
                    const int j = nonroot_index(me, a.root);
                    u64 mlo, mhi;
                    part_of(j, sub, n, mlo, mhi);
                    int nd = 0;
                    dsts[nd++] = (unsigned char*)(out + lo + mlo);
                    for (int q = 0; q < N; ++q)
                        if (q != me && q != a.root) dsts[nd++] = SLOT(q, par2, me) + mlo * E;
                    copy_bytes_multi(dsts, nd, SLOT(me, par1, a.root) + mlo * E, (mhi - mlo) * E);
                }
                if (barrier(a, ++step, &err)) return;
                if (me != a.root) {
                    for (int q = 0; q < N; ++q) {
                        if (q == me || q == a.root) continue;
                        const int j = nonroot_index(q, a.root);
                        u64 qlo, qhi;
                        part_of(j, sub, n, qlo, qhi);
                        copy_bytes((unsigned char*)(out + lo + qlo), SLOT(me, par2, q) + qlo * E, (qhi - qlo) * E);
                    }
                }
                break;
            }
            case K_REDUCE_SPLIT: {
                if (FAMILY != FAM_SPLIT) return;
                // The piece splits into N-1 parts; the j-th non-root reduces part j. Step 1:
                // every rank sends part j to its owner. Step 2: each owner reduces its part over
                // every rank, in rank order, straight into the root's scratch; the root copies.
                const u64 vecs = 16 / E;
                const u64 sub = ((n + N - 2) / (N - 1) + vecs - 1) / vecs * vecs;
                const int par1 = (int)((step + 1) & 1), par2 = (int)((step + 2) & 1);
                for (int j = 0; j < N - 1; ++j) {
                    const int q = nonroot_rank(j, a.root);
                    if (q == me) continue;
                    u64 jlo, jhi;
                    part_of(j, sub, n, jlo, jhi);
                    copy_bytes(SLOT(q, par1, me) + jlo * E, (const unsigned char*)(in + lo + jlo), (jhi - jlo) * E);
                }
                if (barrier(a, ++step, &err)) return;
                if (me != a.root) {
                    const int j = nonroot_index(me, a.root);
                    u64 mlo, mhi;
                    part_of(j, sub, n, mlo, mhi);
                    for (int r = 0; r < N; ++r)
                        srcs[r] = r == me ? in + lo + mlo : (const T*)(SLOT(me, par1, r) + mlo * E);
                    reduce_into<T>((T*)(SLOT(a.root, par2, me) + mlo * E), dsts, 0, srcs, N, mhi - mlo, a.redop, N);
                }
                if (barrier(a, ++step, &err)) return;
                if (me == a.root) {
                    for (int q = 0; q < N; ++q) {
                        if (q == me) continue;
                        const int j = nonroot_index(q, a.root);
                        u64 qlo, qhi;
                        part_of(j, sub, n, qlo, qhi);
                        copy_bytes((unsigned char*)(out + lo + qlo), SLOT(me, par2, q) + qlo * E, (qhi - qlo) * E);
                    }
                }
                break;
            }
            default:
                return;
        }
    }
#undef SLOT
    __syncthreads();
    if (threadIdx.x == 0) mine[COUNTERS_OFF + b] = step;
}

// Two resident blocks of 512 threads per SM (the planner's grid, docs/perf-notes.md section 10)
// need at most 64 registers a thread: the second bound makes ptxas keep to that. Without it,
// a change elsewhere in this file once let coll_u8 take 100 registers, which dropped every
// kernel to one block per SM and large collectives by up to 20 % (perf-notes section 16).
#define COLL_KERNEL(name, T)                                                                     \
    extern "C" __global__ void __launch_bounds__(512, 2) name(CollArgs a) { run<T, FAM_STEPS>(a); } \
    extern "C" __global__ void __launch_bounds__(512, 2) name##_ll(CollArgs a) { run<T, FAM_LL>(a); } \
    extern "C" __global__ void __launch_bounds__(512, 2) name##_ll2(CollArgs a) { run<T, FAM_LL2>(a); } \
    extern "C" __global__ void __launch_bounds__(512, 2) name##_direct(CollArgs a) { run<T, FAM_DIRECT>(a); } \
    extern "C" __global__ void __launch_bounds__(512, 2) name##_split(CollArgs a) { run<T, FAM_SPLIT>(a); } \
    extern "C" __global__ void __launch_bounds__(512, 2) name##_ce(CollArgs a) { run<T, FAM_CE>(a); } \
    extern "C" __global__ void __launch_bounds__(512, 2) name##_pipe(CollArgs a) { run<T, FAM_PIPE>(a); } \
    extern "C" __global__ void __launch_bounds__(512, 2) name##_shift(CollArgs a) { run<T, FAM_SHIFT>(a); }

// Which kernels this compile holds: COLL_PART (coll_abi.h), every kernel when undefined. The
// order is DataType::ALL's; comm.rs looks each kernel up in its part, so a kernel in the wrong
// part fails the communicator's init.
#ifndef COLL_PART
#define COLL_PART -1
#endif
#define COLL_IN(k) (COLL_PART < 0 || COLL_PART == (k))
#if COLL_IN(0)
COLL_KERNEL(coll_f32, float)
#endif
#if COLL_IN(1)
COLL_KERNEL(coll_f64, double)
#endif
#if COLL_IN(2)
COLL_KERNEL(coll_f16, half_t)
#endif
#if COLL_IN(3)
COLL_KERNEL(coll_bf16, bhalf_t)
#endif
#if COLL_IN(4)
COLL_KERNEL(coll_i32, int)
#endif
#if COLL_IN(5)
COLL_KERNEL(coll_i64, long long)
#endif
#if COLL_IN(6)
COLL_KERNEL(coll_u8, unsigned char)
#endif

