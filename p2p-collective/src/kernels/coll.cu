// The collective kernels: one kernel per element type, `coll_<type>`, that runs every collective.
//
// Every rank owns a scratch buffer and a sync area that every peer can write (peer pointers in
// one process, CUDA IPC mappings between processes). A collective is a sequence of steps; in
// each step every block of every rank
//   1. pushes its piece of data into peers' scratch (stores over NVLink are posted: writes beat
//      reads across the link),
//   2. signals every peer by storing its step number into the peer's flag for (block, rank),
//      then waits until every peer's flag for (block, peer) in its own memory reaches that step,
//   3. combines what arrived (a reduction in rank order, or a copy) into its output.
//
// Counters are per block, live in device memory and only grow: block b reads counters[b] when
// it starts and stores the last step it runs (the stepped kinds when they end; LL as soon as
// every thread of the block has read it). Every kernel that reads the counters first runs
// `griddepcontrol.wait` (or is stream-ordered), so it sees the previous call's stores. Nothing the host passes changes from
// call to call except buffer addresses and sizes, so a call captured in a CUDA graph replays
// correctly. Every rank launches the same grid and the same number of steps for a call (both
// follow from the count alone), so block b's counter agrees on every rank.
//
// Scratch is double-buffered by step parity, and each half holds one region per block index,
// used by that block index alone on every rank. Writing into a peer's half for step s is safe
// because this block waited, in step s-1, for the peer's signal of s-1, which the peer gave
// after it finished reading step s-2 (the last use of that half). (The pipelined all-reduce
// keeps the same rule with its own argument: see run_pipe.)
//
// No hangs: every wait polls the abort flag (pinned host memory) and the device's failure word,
// and gives up after `timeout_ns`; a kernel that fails sets the abort flag so that the ranks
// sharing it stop too. The first failure is recorded in `status` (code, kind, peer,
// block, this rank's signature and the peer's), and later kernels return at once.
//
// With `check` on, each signal also carries a 64-bit signature of the call (kind, type, redop,
// root, count); a waiter that sees a different one from a peer stops with code 3.

// Constants, enums and the argument block: coll_abi.h, compiled in front of this file.

// Timing marks for experiments (scripts/gpu/ll_floor.cu defines LL_PROBE before this file);
// nothing in the library's build.
#ifndef LL_PROBE
#define LL_PROBE(i)
#endif

struct half_t { unsigned short x; };
struct bhalf_t { unsigned short x; };

// Storage type -> accumulator type; f16 and bf16 accumulate in f32 and round once.
template <typename T> struct Ty {
    typedef T acc;
    static __device__ __forceinline__ acc up(T x) { return x; }
    static __device__ __forceinline__ T down(acc x) { return x; }
};
template <> struct Ty<half_t> {
    typedef float acc;
    static __device__ __forceinline__ float up(half_t x) {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.x));
        return f;
    }
    static __device__ __forceinline__ half_t down(float f) {
        half_t r;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.x) : "f"(f));
        return r;
    }
};
template <> struct Ty<bhalf_t> {
    typedef float acc;
    static __device__ __forceinline__ float up(bhalf_t x) { return __uint_as_float(((unsigned)x.x) << 16); }
    static __device__ __forceinline__ bhalf_t down(float f) {
        bhalf_t r;
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.x) : "f"(f));
        return r;
    }
};

template <typename A> __device__ __forceinline__ A combine(int op, A x, A y) {
    switch (op) {
        case R_PROD: return x * y;
        case R_MIN: return y < x ? y : x;
        case R_MAX: return y > x ? y : x;
        default: return x + y;  // sum, and avg before its division
    }
}

template <typename A> __device__ __forceinline__ A finish(int op, A x, int nranks) {
    return op == R_AVG ? (A)(x / (A)nranks) : x;
}

__device__ __forceinline__ u64 now_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ void fence_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }

// The abort flag's value for rank `rank`'s kernel that failed (`code`) waiting for `peer`
// (coll_abi.h).
__device__ __forceinline__ int abort_value(int rank, int peer, int code) {
    const int p = peer >= 0 && peer < MAX_RANKS ? peer + 1 : 0;
    const int r = rank >= 0 && rank < MAX_RANKS ? rank + 1 : 0;
    return ABORT_KERNEL_FAILED | (p << ABORT_PEER_SHIFT) | (r << ABORT_RANK_SHIFT) |
           (code == F_MISMATCH ? ABORT_MISMATCH : 0);
}

__device__ void record_failure(const CollArgs& a, int code, int peer, u64 peer_sig) {
    u64* my = a.sync[a.rank];
    // A time limit stops every rank that shares this flag (one process: all of them) at once;
    // the host's monitor reports it to the other processes. (A mismatch is seen by every rank
    // itself, since each compares every peer's signature.)
    if (code == F_TIMEOUT && *a.abort_flag == 0) *a.abort_flag = abort_value(a.rank, peer, code);
    if (atomicCAS((unsigned long long*)(my + FAIL_OFF), 0ull, (unsigned long long)code) == 0ull) {
        volatile u64* st = my + STATUS_OFF;
        st[1] = (u64)a.kind;
        st[2] = (u64)peer;
        st[3] = (u64)blockIdx.x;
        st[4] = a.sig;
        st[5] = peer_sig;
        __threadfence();
        st[0] = (u64)code;
    }
}

// The limits of every wait (wait_ge, ll_wait_all, the send/recv waits), checked once every 1024
// rounds of its poll: the failure word and the clock (both on this GPU), and the host's abort
// flag (pinned memory: a read across PCIe) by each waiting thread at most once every
// HOST_POLL_NS * S, where S = min(gridDim.x, HOST_POLL_SPREAD), the blocks' first reads
// staggered HOST_POLL_NS apart, so that a grid whose blocks all wait reads it about
// max(1, gridDim.x / HOST_POLL_SPREAD) times every HOST_POLL_NS. (Every waiting block reading
// it once every 1024 polls cost the copy-engine all-reduce ~100-170 us a call at 1 GiB:
// perf-notes §30-31.) An abort, or a failure on another GPU of this process (which arrives
// through the same flag), reaches every waiting thread within HOST_POLL_NS * HOST_POLL_SPREAD
// (6.4 ms) plus 1024 polls; at the time limit the flag is read once more, so that a wait
// aborted late reports the abort, not a time-out.
struct Limits {
    u64 deadline = 0, host_due = 0;
    unsigned spins = 0;
    // 0 while the wait may go on; otherwise the failure code that ends it. `a` (CollArgs or
    // P2pArgs) gives the abort flag and the time limit; `fail` is this GPU's failure word.
    template <typename Args>
    __device__ __forceinline__ int check(const Args& a, volatile u64* fail) {
        if ((++spins & 1023u) != 0) return 0;
        if (*fail) return F_ELSEWHERE;
        const u64 t = now_ns();
        const unsigned spread = gridDim.x < HOST_POLL_SPREAD ? gridDim.x : HOST_POLL_SPREAD;
        if (deadline == 0) {
            deadline = t + a.timeout_ns;
            host_due = t + HOST_POLL_NS * (u64)(blockIdx.x % spread + 1);
        } else if (t > deadline) {
            return *a.abort_flag ? F_ABORT : F_TIMEOUT;
        }
        if (t >= host_due) {
            if (*a.abort_flag) return F_ABORT;
            host_due = t + HOST_POLL_NS * (u64)spread;
        }
        return 0;
    }
};

// Waits until *flag >= want. The flag (local memory) is polled every round.
__device__ int wait_ge(const CollArgs& a, volatile u64* flag, u64 want) {
    Limits lim;
    volatile u64* fail = a.sync[a.rank] + FAIL_OFF;
    while (*flag < want) {
        if (const int e = lim.check(a, fail)) return e;
    }
    return 0;
}

// One peer's half of a step: signal_one gives peer p this block's step (after a release fence,
// so that the block's pushes that happened before it are visible first); wait_one waits for
// peer p's signal of `step` and acquires its pushes. wait_one returns the failure (recorded,
// unless it happened elsewhere) or 0. In checking mode the signature travels in the slot of
// parity `par`: the step's parity for the stepped kinds (a peer gives step s + 2 only after
// this rank gave s + 1, so the two slots are enough); one slot for a whole pipelined call.
__device__ __forceinline__ void signal_one(const CollArgs& a, int p, u64 step, int par) {
    const int b = blockIdx.x;
    fence_sys();
    if (a.check) {
        a.sync[p][SIGS_OFF + (par * MAX_BLOCKS + b) * MAX_RANKS + a.rank] = a.sig;
        fence_sys();
    }
    ((volatile u64*)a.sync[p])[FLAGS_OFF + b * MAX_RANKS + a.rank] = step;
}

__device__ __forceinline__ int wait_one(const CollArgs& a, int p, u64 step, int par) {
    const int b = blockIdx.x;
    volatile u64* mine = a.sync[a.rank];
    int e = wait_ge(a, mine + FLAGS_OFF + b * MAX_RANKS + p, step);
    fence_sys();  // acquire: the peer's pushes are visible after its signal
    u64 peer_sig = 0;
    if (!e && a.check) {
        peer_sig = mine[SIGS_OFF + (par * MAX_BLOCKS + b) * MAX_RANKS + p];
        if (peer_sig != a.sig) e = F_MISMATCH;
    }
    if (e && e != F_ELSEWHERE) record_failure(a, e, p, peer_sig);
    return e;
}

// The step barrier of one block with every peer (see the file comment), in two halves so that a
// block can do local work while its signal travels: signal_peers, then wait_peers. Thread
// p < nranks handles peer p.
__device__ void signal_peers(const CollArgs& a, u64 step) {
    __syncthreads();  // the block's pushes happen before thread p's release fence
    const int p = threadIdx.x;
    if (p < a.nranks && p != a.rank) signal_one(a, p, step, (int)(step & 1));
}

// Returns nonzero (for every thread) if the collective must stop.
__device__ int wait_peers(const CollArgs& a, u64 step, int* err) {
    const int p = threadIdx.x;
    if (p < a.nranks && p != a.rank) {
        if (const int e = wait_one(a, p, step, (int)(step & 1))) *err = e;
    }
    __syncthreads();
    return *err;
}

__device__ int barrier(const CollArgs& a, u64 step, int* err) {
    signal_peers(a, step);
    return wait_peers(a, step, err);
}

__device__ __forceinline__ bool aligned16(const void* p) { return (((u64)p) & 15ull) == 0; }

// Elements [lo, hi) of part j, `sub` elements each, of a piece of n elements (empty past its end).
__device__ __forceinline__ void part_of(u64 j, u64 sub, u64 n, u64& lo, u64& hi) {
    lo = j * sub < n ? j * sub : n;
    hi = lo + sub < n ? lo + sub : n;
}

// Kinds split among the non-roots: rank of the j-th non-root, and the index of non-root q.
__device__ __forceinline__ int nonroot_rank(int j, int root) { return j < root ? j : j + 1; }
__device__ __forceinline__ int nonroot_index(int q, int root) { return q < root ? q : q - 1; }

// The widest access, 16, 8, 4, 2 or 1 bytes, at which addresses a and b are aligned alike
// (their low bits equal): a copy between them runs at that width after a head of bytes.
__device__ __forceinline__ unsigned common_width(u64 a, u64 b) {
    const u64 x = a ^ b;
    return (x & 15ull) == 0 ? 16 : (x & 7ull) == 0 ? 8 : (x & 3ull) == 0 ? 4 : (x & 1ull) == 0 ? 2 : 1;
}

// The unsigned type of an access of W bytes (uint4 for 16).
template <unsigned W> struct Word;
template <> struct Word<16> { typedef uint4 T; };
template <> struct Word<8> { typedef uint2 T; };
template <> struct Word<4> { typedef unsigned T; };
template <> struct Word<2> { typedef unsigned short T; };
template <> struct Word<1> { typedef unsigned char T; };

// The threads of a block that run a loop: [FIRST, FIRST + COUNT), or from FIRST to the block's
// end when COUNT is 0. (Template parameters, not arguments, so that the whole-block loops
// compile as they did before the pipelined kernel split its block: arguments cost spills.)
template <unsigned FIRST, unsigned COUNT> struct Threads {
    static __device__ __forceinline__ unsigned tid() { return threadIdx.x - FIRST; }
    static __device__ __forceinline__ unsigned count() { return COUNT ? COUNT : blockDim.x - FIRST; }
};
typedef Threads<0, 0> Block;

// Where a copy stores: one destination (ToOne), or up to MAX_RANKS with null entries skipped
// (ToMany). `word(off, i, v)` stores the i-th T after byte off; `byte(j, v)` byte j; `low()`
// the destinations' address mod 16 where they all share it, else 16.
struct ToOne {
    unsigned char* d;
    template <typename T> __device__ __forceinline__ void word(u64 off, u64 i, T v) const { ((T*)(d + off))[i] = v; }
    __device__ __forceinline__ void byte(u64 j, unsigned char v) const { d[j] = v; }
    __device__ __forceinline__ unsigned low() const { return (unsigned)((u64)d & 15ull); }
};
struct ToMany {
    unsigned char* const* d;
    int n;
    __device__ __forceinline__ unsigned low() const {
        unsigned l = 16;
        for (int k = 0; k < n; ++k) {
            if (!d[k]) continue;
            const unsigned m = (unsigned)((u64)d[k] & 15ull);
            if (l != 16 && m != l) return 16;
            l = m;
        }
        return l;
    }
    template <typename T> __device__ __forceinline__ void word(u64 off, u64 i, T v) const {
        for (int k = 0; k < n; ++k)
            if (d[k]) ((T*)(d[k] + off))[i] = v;
    }
    __device__ __forceinline__ void byte(u64 j, unsigned char v) const {
        for (int k = 0; k < n; ++k)
            if (d[k]) d[k][j] = v;
    }
};

// Copies n bytes from src to `to` with the threads TH, W bytes an access: single bytes up to
// src's first W-byte boundary, words of W, then the bytes left (W: a width at which src and
// every destination are aligned alike). Sources are read with ld.cg: scratch is written by
// other GPUs, so L1 must not serve it.
template <unsigned W, typename TH, typename To>
__device__ __forceinline__ void copy_at(To to, const unsigned char* src, u64 n) {
    typedef typename Word<W>::T T;
    u64 head = (W - ((u64)src & (W - 1))) & (W - 1);
    head = head < n ? head : n;
    const u64 nw = (n - head) / W;
    for (u64 j = TH::tid(); j < head; j += TH::count()) to.byte(j, __ldcg(src + j));
    const T* s = (const T*)(src + head);
    for (u64 i = TH::tid(); i < nw; i += TH::count()) to.template word<T>(head, i, __ldcg(s + i));
    for (u64 j = head + nw * W + TH::tid(); j < n; j += TH::count()) to.byte(j, __ldcg(src + j));
}

// Bytes [m, m + 16) of the 32 bytes x then y (m in 1..15), as one 16-byte word: whole 32-bit
// words picked by m / 4 (two levels of selects, no indexed registers), then joined by funnel
// shifts of 8 * (m % 4) bits.
__device__ __forceinline__ uint4 shifted_word(uint4 x, uint4 y, unsigned m) {
    const unsigned z[8] = {x.x, x.y, x.z, x.w, y.x, y.y, y.z, y.w};
    unsigned w[6], v[5];
#pragma unroll
    for (int i = 0; i < 6; ++i) w[i] = (m & 8) ? z[i + 2] : z[i];
#pragma unroll
    for (int i = 0; i < 5; ++i) v[i] = (m & 4) ? w[i + 1] : w[i];
    const unsigned r = 8 * (m & 3);
    return make_uint4(__funnelshift_r(v[0], v[1], r), __funnelshift_r(v[1], v[2], r), __funnelshift_r(v[2], v[3], r),
                      __funnelshift_r(v[3], v[4], r));
}

// Bytes from which a copy between ends aligned differently is realigned (copy_shifted) rather
// than run at the widest width both share.
#define SHIFT_MIN_BYTES 256

// A copy whose destinations all lie `low` bytes past a 16-byte boundary and whose source does
// not: single bytes up to the destinations' boundary, then every store a whole 16-byte word,
// made from the two aligned source words it straddles (the second from the next lane by a
// shuffle, so each source word is loaded once; the last lane of a warp loads its own), then
// the bytes left. No load reaches past the source's end; the first may start up to 15 bytes
// before it, inside the same 16-byte block (so the same allocation and page). TH must be whole
// warps; n at least 47.
template <typename TH, typename To>
__device__ __forceinline__ void copy_shifted(To to, unsigned low, const unsigned char* src, u64 n) {
    const u64 head = (16 - low) & 15;
    for (u64 j = TH::tid(); j < head; j += TH::count()) to.byte(j, __ldcg(src + j));
    const unsigned m = (unsigned)((u64)(src + head) & 15ull);  // not 0: the ends differ mod 16
    const uint4* s = (const uint4*)(src + head - m);
    // Word i of the destination takes source words i and i + 1: i + 1 < (m + n - head) / 16.
    const u64 nw = (m + n - head) / 16 - 1;
    const unsigned lane = threadIdx.x & 31;
    for (u64 base = TH::tid() - lane; base < nw; base += TH::count()) {
        const u64 i = base + lane;
        const uint4 x = i <= nw ? __ldcg(s + i) : make_uint4(0, 0, 0, 0);
        uint4 y;
        y.x = __shfl_down_sync(0xffffffffu, x.x, 1);
        y.y = __shfl_down_sync(0xffffffffu, x.y, 1);
        y.z = __shfl_down_sync(0xffffffffu, x.z, 1);
        y.w = __shfl_down_sync(0xffffffffu, x.w, 1);
        if (lane == 31 && i < nw) y = __ldcg(s + i + 1);
        if (i < nw) to.template word<uint4>(head, i, shifted_word(x, y, m));
    }
    for (u64 j = head + nw * 16 + TH::tid(); j < n; j += TH::count()) to.byte(j, __ldcg(src + j));
}

// Whether copy_shifted may run for the threads TH: whole warps (the shuffles need every lane).
template <typename TH> __device__ __forceinline__ bool whole_warps() {
    return ((threadIdx.x - TH::tid()) & 31) == 0 && (TH::count() & 31) == 0;
}

// A copy whose ends are not all 16-byte aligned, out of line: the many callers of the copies
// inline only the path where every end is, so that path and the compile stay as they were.
// With SHIFT (only in the `_shift` kernels: in the others the larger callee costs the
// kernel's register allocation 2-3 % on aligned copies, perf-notes §44), destinations all
// aligned alike but not like the source go through copy_shifted; otherwise copy_at at the
// widest width src and every destination share (common_width).
template <typename TH, bool SHIFT, typename To>
__device__ __noinline__ void copy_unaligned(To to, unsigned w, const unsigned char* src, u64 n) {
    if (SHIFT && w < 16 && n >= SHIFT_MIN_BYTES && whole_warps<TH>()) {
        const unsigned low = to.low();
        if (low < 16) {
            copy_shifted<TH>(to, low, src, n);
            return;
        }
    }
    switch (w) {
        case 16: copy_at<16, TH>(to, src, n); break;
        case 8: copy_at<8, TH>(to, src, n); break;
        case 4: copy_at<4, TH>(to, src, n); break;
        case 2: copy_at<2, TH>(to, src, n); break;
        default: copy_at<1, TH>(to, src, n); break;
    }
}

// Copies n bytes within the block: 16-byte vectors where both ends are 16-byte aligned, else
// realigned (SHIFT) or at the widest width both share.
template <bool SHIFT = false>
__device__ void copy_bytes(unsigned char* dst, const unsigned char* src, u64 n) {
    if (n == 0 || dst == src) return;
    if (!(aligned16(dst) && aligned16(src))) {
        copy_unaligned<Block, SHIFT>(ToOne{dst}, common_width((u64)dst, (u64)src), src, n);
        return;
    }
    const u64 nv = n >> 4;
    uint4* d = (uint4*)dst;
    const uint4* s = (const uint4*)src;
    for (u64 i = threadIdx.x; i < nv; i += blockDim.x) d[i] = __ldcg(s + i);
    for (u64 j = (nv << 4) + threadIdx.x; j < n; j += blockDim.x) dst[j] = __ldcg(src + j);
}

// Copies n bytes to up to MAX_RANKS destinations (null entries skipped), reading once, with
// the threads TH: 16-byte vectors where every end is 16-byte aligned, else realigned (SHIFT,
// destinations aligned alike) or at the widest width all share.
template <typename TH = Block, bool SHIFT = false>
__device__ void copy_bytes_multi(unsigned char* const* dsts, int ndst, const unsigned char* src, u64 n) {
    if (n == 0) return;
    bool vec = aligned16(src);
    for (int k = 0; k < ndst; ++k) vec = vec && (dsts[k] == 0 || aligned16(dsts[k]));
    if (!vec) {
        unsigned w = 16;
        for (int k = 0; k < ndst; ++k) {
            const unsigned c = dsts[k] ? common_width((u64)dsts[k], (u64)src) : 16;
            w = c < w ? c : w;
        }
        copy_unaligned<TH, SHIFT>(ToMany{dsts, ndst}, w, src, n);
        return;
    }
    const u64 nv = n >> 4;
    const uint4* s = (const uint4*)src;
    for (u64 i = TH::tid(); i < nv; i += TH::count()) {
        const uint4 v = __ldcg(s + i);
        for (int k = 0; k < ndst; ++k)
            if (dsts[k]) ((uint4*)dsts[k])[i] = v;
    }
    for (u64 j = (nv << 4) + TH::tid(); j < n; j += TH::count()) {
        const unsigned char v = __ldcg(src + j);
        for (int k = 0; k < ndst; ++k)
            if (dsts[k]) dsts[k][j] = v;
    }
}

// One element, read past L1 as copy_bytes reads (the scratch is written by other GPUs): by
// its bits, as an unsigned integer of its size.
template <typename T> __device__ __forceinline__ T ld_cg(const T* p) {
    static_assert(sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8, "element size");
    T v;
    if (sizeof(T) == 1) {
        const unsigned char u = __ldcg((const unsigned char*)p);
        memcpy(&v, &u, 1);
    } else if (sizeof(T) == 2) {
        const unsigned short u = __ldcg((const unsigned short*)p);
        memcpy(&v, &u, 2);
    } else if (sizeof(T) == 4) {
        const unsigned u = __ldcg((const unsigned*)p);
        memcpy(&v, &u, 4);
    } else {
        const unsigned long long u = __ldcg((const unsigned long long*)p);
        memcpy(&v, &u, 8);
    }
    return v;
}

template <typename T> union Vec {
    uint4 u;
    T t[16 / sizeof(T)];
};

// A 16-byte vector to and from its accumulators. f16 and bf16 convert two elements per
// instruction where the ISA allows (cvt.rn.{f16,bf16}x2.f32, sm_80+): these loops are on the
// bandwidth path of every 16-bit reduction.
template <typename T> struct Pack {
    typedef typename Ty<T>::acc A;
    static __device__ __forceinline__ void up(uint4 u, A* acc) {
        Vec<T> v;
        v.u = u;
#pragma unroll
        for (int e = 0; e < 16 / (int)sizeof(T); ++e) acc[e] = Ty<T>::up(v.t[e]);
    }
    static __device__ __forceinline__ uint4 down(const A* acc) {
        Vec<T> v;
#pragma unroll
        for (int e = 0; e < 16 / (int)sizeof(T); ++e) v.t[e] = Ty<T>::down(acc[e]);
        return v.u;
    }
};

// Element 2k is the low half of word k (little endian); cvt.rn.*x2.f32 d, a, b puts a in the
// upper half and b in the lower.
__device__ __forceinline__ unsigned pack2_bf16(float lo, float hi) {
    unsigned d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}
__device__ __forceinline__ unsigned pack2_f16(float lo, float hi) {
    unsigned d;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

template <> struct Pack<bhalf_t> {
    static __device__ __forceinline__ void up(uint4 u, float* acc) {
        const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            acc[2 * k] = __uint_as_float(w[k] << 16);
            acc[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
        }
    }
    static __device__ __forceinline__ uint4 down(const float* acc) {
        return make_uint4(pack2_bf16(acc[0], acc[1]), pack2_bf16(acc[2], acc[3]), pack2_bf16(acc[4], acc[5]),
                          pack2_bf16(acc[6], acc[7]));
    }
};

template <> struct Pack<half_t> {
    static __device__ __forceinline__ void up(uint4 u, float* acc) {
        Vec<half_t> v;
        v.u = u;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] = Ty<half_t>::up(v.t[e]);
    }
    static __device__ __forceinline__ uint4 down(const float* acc) {
        return make_uint4(pack2_f16(acc[0], acc[1]), pack2_f16(acc[2], acc[3]), pack2_f16(acc[4], acc[5]),
                          pack2_f16(acc[6], acc[7]));
    }
};

// Two 16-bit sources summed or multiplied: one packed fma per two elements. For two operands
// this is bit-for-bit the f32-then-round result (the f32 sum or product of two f16/bf16 values
// is exact or, where not, so far from a rounding boundary of the 16-bit type that both round
// the same way), so results do not depend on the path. fma.rn.{f16,bf16}x2: sm_53/sm_80+.
template <typename T, int OP> struct Pair {
    static const bool ok = false;
    static __device__ __forceinline__ unsigned apply(unsigned x, unsigned) { return x; }
};
#define PAIR(T, OP, PTX, B, C)                                                                   \
    template <> struct Pair<T, OP> {                                                              \
        static const bool ok = true;                                                              \
        static __device__ __forceinline__ unsigned apply(unsigned x, unsigned y) {               \
            unsigned d;                                                                           \
            asm(PTX " %0, %1, %2, %3;" : "=r"(d) : "r"(x), "r"(B), "r"(C));                       \
            return d;                                                                             \
        }                                                                                         \
    };
// sum: x * 1 + y; product: x * y + (-0), which keeps the sign of a zero product.
PAIR(bhalf_t, R_SUM, "fma.rn.bf16x2", 0x3f803f80u, y)
PAIR(bhalf_t, R_PROD, "fma.rn.bf16x2", y, 0x80008000u)
PAIR(half_t, R_SUM, "fma.rn.f16x2", 0x3c003c00u, y)
PAIR(half_t, R_PROD, "fma.rn.f16x2", y, 0x80008000u)
#undef PAIR

// The vector loop of reduce_into for one reduction, known at compile time so that the loop
// body holds no branch on it.
template <typename T, int OP, typename TH>
__device__ void reduce_vecs(uint4* out, unsigned char* const* extra, int nextra, const T* const* srcs, int nsrc,
                            u64 nv, int nranks) {
    typedef typename Ty<T>::acc A;
    const int E = 16 / sizeof(T);
    if (Pair<T, OP>::ok && nsrc == 2) {
        for (u64 i = TH::tid(); i < nv; i += TH::count()) {
            const uint4 x = __ldcg((const uint4*)srcs[0] + i);
            const uint4 y = __ldcg((const uint4*)srcs[1] + i);
            const uint4 v = make_uint4(Pair<T, OP>::apply(x.x, y.x), Pair<T, OP>::apply(x.y, y.y),
                                       Pair<T, OP>::apply(x.z, y.z), Pair<T, OP>::apply(x.w, y.w));
            out[i] = v;
            for (int k = 0; k < nextra; ++k) ((uint4*)extra[k])[i] = v;
        }
        return;
    }
    for (u64 i = TH::tid(); i < nv; i += TH::count()) {
        A acc[16 / sizeof(T)];
        Pack<T>::up(__ldcg((const uint4*)srcs[0] + i), acc);
        for (int k = 1; k < nsrc; ++k) {
            A w[16 / sizeof(T)];
            Pack<T>::up(__ldcg((const uint4*)srcs[k] + i), w);
#pragma unroll
            for (int e = 0; e < E; ++e) acc[e] = combine<A>(OP, acc[e], w[e]);
        }
        if (OP == R_AVG) {
#pragma unroll
            for (int e = 0; e < E; ++e) acc[e] = finish<A>(OP, acc[e], nranks);
        }
        const uint4 v = Pack<T>::down(acc);
        out[i] = v;
        for (int k = 0; k < nextra; ++k) ((uint4*)extra[k])[i] = v;
    }
}

// out[i] (and every extra destination) = reduce over srcs[0..nsrc) in that order, for n
// elements, by the threads TH. The order is the same on every rank, so every rank gets the
// same bits.
template <typename T, typename TH = Block>
__device__ void reduce_into(T* out, unsigned char* const* extra, int nextra, const T* const* srcs, int nsrc, u64 n,
                            int op, int nranks) {
    typedef typename Ty<T>::acc A;
    const int E = 16 / sizeof(T);
    bool vec = aligned16(out);
    for (int k = 0; k < nsrc; ++k) vec = vec && aligned16(srcs[k]);
    for (int k = 0; k < nextra; ++k) vec = vec && aligned16(extra[k]);
    u64 head = 0;
    if (vec) {
        const u64 nv = n / E;
        uint4* o = (uint4*)out;
        switch (op) {
            case R_PROD: reduce_vecs<T, R_PROD, TH>(o, extra, nextra, srcs, nsrc, nv, nranks); break;
            case R_MIN: reduce_vecs<T, R_MIN, TH>(o, extra, nextra, srcs, nsrc, nv, nranks); break;
            case R_MAX: reduce_vecs<T, R_MAX, TH>(o, extra, nextra, srcs, nsrc, nv, nranks); break;
            case R_AVG: reduce_vecs<T, R_AVG, TH>(o, extra, nextra, srcs, nsrc, nv, nranks); break;
            default: reduce_vecs<T, R_SUM, TH>(o, extra, nextra, srcs, nsrc, nv, nranks); break;
        }
        head = nv * E;
    }
    for (u64 j = head + TH::tid(); j < n; j += TH::count()) {
        A acc = Ty<T>::up(ld_cg(srcs[0] + j));
        for (int k = 1; k < nsrc; ++k) acc = combine<A>(op, acc, Ty<T>::up(ld_cg(srcs[k] + j)));
        const T r = Ty<T>::down(finish<A>(op, acc, nranks));
        out[j] = r;
        for (int k = 0; k < nextra; ++k) ((T*)extra[k])[j] = r;
    }
}

// ---- LL: flags inside the data, for small all-reduces ----------------------------------------
//
// Every 16-byte store carries 8 data bytes and the call's 32-bit flag twice, {d0, f, d1, f}, the
// layout of NCCL's LL protocol: each 8-byte half lands atomically, so a reader that sees both
// flags equal to this call's has both halves of the data. No fence and no separate flag store,
// so a call costs one NVLink crossing. The flag is the block's step number (never 0, which
// fresh scratch holds); a stale line in the same parity half holds the step before last.
// Each thread owns the same units in the push and the reduce loops, so in place is safe; all
// pushes come before any wait, so ranks cannot wait on each other in a cycle.
//
// LL lines live in their own region after the scratch (2 parities x N sources x LL_SLOT_BYTES),
// never written by the other kinds: user data there could otherwise look like a valid flag.
// Block b owns lines [b * LL_LINES_PER_BLOCK, (b + 1) * LL_LINES_PER_BLOCK) whatever the grid, so
// a line is only ever written with block b's step numbers, which only grow: a line left by an
// earlier call (of any size) does not carry the current flag until the 32-bit flag wraps. That
// takes 2 x (2^32 - 1) of the block's steps (hours of back-to-back calls), and a stale line
// would have to sit unwritten for exactly a multiple of that; not guarded (the point-to-point
// lines are scrubbed, P2P_LL_SCRUB).


__device__ __forceinline__ unsigned char* ll_slot(const CollArgs& a, int r, int par, int src) {
    return a.scratch[r] + 2ull * a.nranks * a.slot_bytes + ((u64)par * a.nranks + src) * LL_SLOT_BYTES;
}

__device__ __forceinline__ void ll_store(unsigned char* p, uint2 d, unsigned flag) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(d.x), "r"(flag), "r"(d.y),
                 "r"(flag)
                 : "memory");
}

__device__ __forceinline__ uint4 ll_load(const unsigned char* p) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}

// Bytes [8u, 8u + 8) of `p` (zero past `bytes`).
__device__ __forceinline__ uint2 load8(const unsigned char* p, u64 u, u64 bytes, bool aligned) {
    if (aligned && 8 * u + 8 <= bytes) return *(const uint2*)(p + 8 * u);
    union { uint2 v; unsigned char c[8]; } w;
    w.v = make_uint2(0, 0);
    for (int i = 0; i < 8; ++i)
        if (8 * u + i < bytes) w.c[i] = p[8 * u + i];
    return w.v;
}

__device__ __forceinline__ void store8(unsigned char* p, u64 u, u64 bytes, bool aligned, uint2 d) {
    if (aligned && 8 * u + 8 <= bytes) {
        *(uint2*)(p + 8 * u) = d;
        return;
    }
    union { uint2 v; unsigned char c[8]; } w;
    w.v = d;
    for (int i = 0; i < 8; ++i)
        if (8 * u + i < bytes) p[8 * u + i] = w.c[i];
}

template <typename T> union Vec8 {
    uint2 u;
    T t[8 / sizeof(T)];
};

// Waits until the LL line `line` of every rank in `mask` (bit r: rank r) carries `flag`, and
// gives each one's data in got[r]. Every round loads all the lines still missing before looking
// at any (one load latency a round, not one per peer: with three peers that is ~1 us saved);
// the same limits as wait_ge. A single peer is polled by a loop of its own. On failure `*peer` is a rank still missing.
__device__ int ll_wait_all(const CollArgs& a, int par, u64 line, unsigned flag, unsigned mask,
                           uint2 (&got)[MAX_RANKS], int* peer) {
    Limits lim;
    volatile u64* fail = a.sync[a.rank] + FAIL_OFF;
    if ((mask & (mask - 1u)) == 0u) {
        // One peer (2 ranks, or a rooted kind's non-root): a tight loop of one load and one
        // compare a round, as before the all-peers poll (which measured 0.26 us slower on 2
        // ranks). `got` is written through constant indices so that it stays in registers.
        const int q = __ffs(mask) - 1;
        const unsigned char* p = ll_slot(a, a.rank, par, q) + 16 * line;
        *peer = q;
        while (true) {
            const uint4 v = ll_load(p);
            if (v.y == flag && v.w == flag) {
#pragma unroll
                for (int r = 0; r < MAX_RANKS; ++r)
                    if (r == q) got[r] = make_uint2(v.x, v.z);
                return 0;
            }
            if (const int e = lim.check(a, fail)) return e;
        }
    }
    // Source r's line sits r slots after source 0's: one base pointer and constant offsets
    // (eight 64-bit pointers kept across the loop made ptxas spill).
    const unsigned char* p0 = ll_slot(a, a.rank, par, 0) + 16 * line;
    while (true) {
        uint4 v[MAX_RANKS];
#pragma unroll
        for (int r = 0; r < MAX_RANKS; ++r)
            if (mask & (1u << r)) v[r] = ll_load(p0 + (u64)r * LL_SLOT_BYTES);
#pragma unroll
        for (int r = 0; r < MAX_RANKS; ++r) {
            if ((mask & (1u << r)) && v[r].y == flag && v[r].w == flag) {
                got[r] = make_uint2(v[r].x, v[r].z);
                mask &= ~(1u << r);
            }
        }
        if (mask == 0) return 0;
        *peer = __ffs(mask) - 1;
        if (const int e = lim.check(a, fail)) return e;
    }
}

// Every collective through LL lines, in one step: each rank stores a line per unit into the LL
// slot of every peer (an empty line where the peer needs no data), then waits for every peer's
// line and combines what it needs. `a.count`
// is one source's segment (the whole buffer, or one rank's part for all-gather, reduce-scatter
// and all-to-all); `a.piece` is 8-byte units per block, at most one per thread (the plan keeps
// piece <= the block's threads <= THREADS). What each kind sends and combines:
//   all-reduce      sends its input to every peer;        reduces every rank's, in rank order
//   reduce-scatter  sends part q to rank q;                reduces its own part over every rank
//   reduce          non-roots send their input to the root; the root reduces every rank's
//   all-gather      sends its input to every peer;        copies rank r's to output part r
//   all-to-all      sends part q to rank q;                copies rank r's to output part r
//   broadcast       the root sends its input to every peer; every rank copies the root's
// It runs its own prologue: the input load goes out together with the counter's, instead of
// after it (two load latencies overlapped).
// KIND and NR, when given, fix the kind and the world size at compile time (`coll_<type>_ll2`
// fixes all-reduce on two ranks; the other LL kernels leave both to the arguments).
template <typename T, int KIND = -1, int NR = 0>
__device__ void run_ll(const CollArgs& a) {
    typedef typename Ty<T>::acc A;
    const int E = 8 / sizeof(T);
    const int N = NR > 0 ? NR : a.nranks, me = a.rank, root = a.root, kind = KIND >= 0 ? KIND : a.kind;
    LL_PROBE(0);
    u64* mine = a.sync[me];
    const u64 bytes = a.count * sizeof(T);
    const u64 units = (bytes + 7) / 8;
    const u64 lo = (u64)blockIdx.x * a.piece < units ? (u64)blockIdx.x * a.piece : units;
    const u64 hi = lo + a.piece < units ? lo + a.piece : units;
    const u64 u = lo + threadIdx.x;  // this thread's unit, if u < hi
    const bool has = u < hi && threadIdx.x < a.piece;
    // Parts at multiples of `bytes` are 8-byte aligned only if `bytes` is.
    const bool aligned = ((((u64)a.input) | ((u64)a.output) | bytes) & 7ull) == 0;
    const bool parted_in = kind == K_REDUCESCATTER_LL || kind == K_ALLTOALL_LL;
    const bool reduces = kind == K_ALLREDUCE_LL || kind == K_REDUCESCATTER_LL || kind == K_REDUCE_LL;
    __shared__ int err;
    __shared__ u64 base;
    if (threadIdx.x == 0) {
        err = (int)((volatile u64*)mine)[FAIL_OFF];
        base = mine[COUNTERS_OFF + blockIdx.x];
    }
    // Broadcast and reduce: every rank exchanges a line with every peer both ways (data from
    // the root, or to it; an empty line otherwise), so that no rank can run more than one call
    // ahead of any peer: a root that only sent (broadcast) would overwrite, two calls later,
    // lines a slow non-root has not read yet (seen as a stall under CUDA graph replay), and on
    // more than two ranks a non-root that heard only from the root could go on to push, in
    // the next stepped call, into the scratch half another non-root was still reading (the
    // parity argument of the file comment needs a line or flag from every peer in every step).
    const bool rooted = kind == K_BROADCAST_LL || kind == K_REDUCE_LL;
    // Whether this rank's input carries data (a broadcast's non-roots have no input).
    const bool has_input = kind != K_BROADCAST_LL || me == root;
    // Unparted kinds send and use the same 8 bytes of the input: load them now.
    const uint2 first = has && !parted_in && has_input ? load8(a.input, u, bytes, aligned) : make_uint2(0, 0);
    __syncthreads();
    LL_PROBE(1);
    if (err) return;  // an earlier call failed: the communicator is unusable, drain at once
    const u64 step = base + 1;
    // The counter moves on now, not after a second barrier at the end (perf-notes §28: ~0.2 us
    // of a 2 us call): every thread has read `base`, and the next call on this stream reads the
    // counter only after its `griddepcontrol.wait`, which waits for this whole grid (without
    // programmatic dependent launch, stream order does the same). A call that fails leaves it
    // moved on, which nothing reads again: a failure poisons the communicator.
    if (threadIdx.x == 0) mine[COUNTERS_OFF + blockIdx.x] = step;
    const unsigned flag = (unsigned)(step % 0xffffffffull) + 1u;
    const int par = (int)(step & 1);
    // Line of unit u in a slot: inside this block's own lines (LL_LINES_PER_BLOCK of them).
    const u64 line = (u64)blockIdx.x * LL_LINES_PER_BLOCK + threadIdx.x;
    if (has) {
        if (rooted) {
            // Data where the collective sends it (broadcast: from the root; reduce: to it), an
            // empty line everywhere else.
            for (int q = 0; q < N; ++q) {
                if (q == me) continue;
                const bool data = kind == K_BROADCAST_LL ? me == root : q == root;
                ll_store(ll_slot(a, q, par, me) + 16 * line, data ? first : make_uint2(0, 0), flag);
            }
        } else if (parted_in) {
            for (int q = 0; q < N; ++q)
                if (q != me)
                    ll_store(ll_slot(a, q, par, me) + 16 * line, load8(a.input + (u64)q * bytes, u, bytes, aligned), flag);
        } else {
            for (int q = 0; q < N; ++q)
                if (q != me) ll_store(ll_slot(a, q, par, me) + 16 * line, first, flag);
        }
    }
    LL_PROBE(2);
    if (has) {
        // Every kind waits for every peer's line (see `rooted` above).
        const unsigned need = ((1u << N) - 1u) & ~(1u << me);
        uint2 got[MAX_RANKS];
        int peer = 0;
        const int e = need ? ll_wait_all(a, par, line, flag, need, got, &peer) : 0;
        LL_PROBE(3);
        if (e) {
            if (e != F_ELSEWHERE) record_failure(a, e, peer, 0);
        } else {
            // This rank's own 8 bytes, from its input.
            const uint2 own = parted_in ? load8(a.input + (u64)me * bytes, u, bytes, aligned) : first;
            if (kind == K_REDUCE_LL && me != root) {
                // The root's line was its acknowledgement: nothing to write.
            } else if (reduces) {
                A acc[8 / sizeof(T)];
#pragma unroll
                for (int r = 0; r < MAX_RANKS; ++r) {
                    if (r >= N) break;
                    Vec8<T> w;
                    w.u = r == me ? own : got[r];
#pragma unroll
                    for (int k = 0; k < E; ++k)
                        acc[k] = r == 0 ? Ty<T>::up(w.t[k]) : combine<A>(a.redop, acc[k], Ty<T>::up(w.t[k]));
                }
                Vec8<T> o;
#pragma unroll
                for (int k = 0; k < E; ++k) o.t[k] = Ty<T>::down(finish<A>(a.redop, acc[k], N));
                store8(a.output, u, bytes, aligned, o.u);
            } else if (kind == K_BROADCAST_LL) {
                uint2 w = own;
#pragma unroll
                for (int r = 0; r < MAX_RANKS; ++r)
                    if (r == root && r != me) w = got[r];
                store8(a.output, u, bytes, aligned, w);
            } else {
                // All-gather and all-to-all: rank r's segment goes to output part r.
#pragma unroll
                for (int r = 0; r < MAX_RANKS; ++r) {
                    if (r >= N) break;
                    store8(a.output + (u64)r * bytes, u, bytes, aligned, r == me ? own : got[r]);
                }
            }
        }
    }
    LL_PROBE(4);
}

// The direct kinds, on buffers every rank registered: no scratch and no barrier per chunk. A
// barrier at the start (every peer has entered this call: its input is ready and its output
// free) and one at the end (every write into this rank's output has landed, and every peer is
// done reading its input); in between, each block streams its share.
//   all-reduce      rank me owns part me (G pieces); block b reads piece b of it from every
//                   rank's input, reduces in rank order, and writes it into every rank's output
//   reduce-scatter  block b reads piece b of part me from every rank's input and reduces it
//   all-gather      block b writes piece b of its input into part me of every rank's output
//   all-to-all      block b writes piece b of its part q into part me of rank q's output
template <typename T>
__device__ void run_direct(const CollArgs& a, u64 base, int* err) {
    const int N = a.nranks, me = a.rank, b = blockIdx.x;
    const u64 E = sizeof(T);
    u64 step = base;
    if (barrier(a, ++step, err)) return;
    unsigned char* dsts[MAX_RANKS];
    const T* srcs[MAX_RANKS];
    const u64 start = (a.kind == K_ALLREDUCE_DIRECT ? (u64)me * gridDim.x + b : (u64)b) * a.piece;
    const u64 lo = start < a.count ? start : a.count;
    const u64 hi = lo + a.piece < a.count ? lo + a.piece : a.count;
    const u64 seg = a.count * E;  // bytes of one rank's part (not used by all-reduce)
    switch (a.kind) {
        case K_ALLREDUCE_DIRECT: {
            int nd = 0;
            for (int r = 0; r < N; ++r) {
                srcs[r] = (const T*)(r == me ? a.input : a.peer_in[r]) + lo;
                if (r != me) dsts[nd++] = a.peer_out[r] + lo * E;
            }
            reduce_into<T>((T*)a.output + lo, dsts, nd, srcs, N, hi - lo, a.redop, N);
            break;
        }
        case K_REDUCESCATTER_DIRECT: {
            for (int r = 0; r < N; ++r) srcs[r] = (const T*)((r == me ? a.input : a.peer_in[r]) + (u64)me * seg) + lo;
            reduce_into<T>((T*)a.output + lo, dsts, 0, srcs, N, hi - lo, a.redop, N);
            break;
        }
        case K_ALLGATHER_DIRECT: {
            for (int q = 0; q < N; ++q) {
                unsigned char* d = (q == me ? a.output : a.peer_out[q]) + (u64)me * seg + lo;
                dsts[q] = d == a.input + lo ? 0 : d;  // in place, the own part is already there
            }
            copy_bytes_multi(dsts, N, a.input + lo, hi - lo);
            break;
        }
        case K_ALLTOALL_DIRECT: {
            for (int k = 1; k <= N; ++k) {
                const int q = (me + k) % N;  // peers first, staggered, so ranks spread over targets
                copy_bytes((q == me ? a.output : a.peer_out[q]) + (u64)me * seg + lo, a.input + (u64)q * seg + lo, hi - lo);
            }
            break;
        }
        case K_ALLGATHER_CE:
        case K_ALLTOALL_CE:
        case K_ALLREDUCE_CE:
            // A copy-engine plan's barrier (count 0): no data, and a failure recorded under
            // the collective's own kind.
            break;
        default:
            return;
    }
    if (barrier(a, ++step, err)) return;
    __syncthreads();
    if (threadIdx.x == 0) a.sync[me][COUNTERS_OFF + b] = step;
}

// Elements [lo, hi) of chunk k of a copy-engine all-reduce of n elements of e bytes (see
// CE_FLAGS_OFF in coll_abi.h); plan.rs `ce_chunk` is the same formula.
__device__ __forceinline__ void ce_chunk(int k, u64 n, u64 e, u64& lo, u64& hi) {
    const u64 align = CE_ALIGN / e;
    lo = k == 0 ? 0 : (n - (n >> k)) / align * align;
    hi = k == CE_CHUNKS - 1 ? n : (n - (n >> (k + 1))) / align * align;
}

// op(x, y) of two vectors of T, x from the lower rank: reduce_vecs's arithmetic for two sources.
template <typename T, int OP>
__device__ __forceinline__ uint4 vec_op(uint4 x, uint4 y) {
    typedef typename Ty<T>::acc A;
    if (Pair<T, OP>::ok) {
        return make_uint4(Pair<T, OP>::apply(x.x, y.x), Pair<T, OP>::apply(x.y, y.y),
                          Pair<T, OP>::apply(x.z, y.z), Pair<T, OP>::apply(x.w, y.w));
    }
    const int E = 16 / sizeof(T);
    A a[16 / sizeof(T)], b[16 / sizeof(T)];
    Pack<T>::up(x, a);
    Pack<T>::up(y, b);
#pragma unroll
    for (int e = 0; e < E; ++e) a[e] = finish<A>(OP, combine<A>(OP, a[e], b[e]), 2);
    return Pack<T>::down(a);
}

// Vectors [lo, hi) of a copy-engine all-reduce chunk over the whole grid, four in flight per
// thread: out = op(rank 0's, rank 1's), this rank's from `in` (read once: streaming), the
// peer's from `out` (landed there by the copy engines: L2, never L1).
template <typename T, int OP>
__device__ void ce_reduce_vecs(uint4* out, const uint4* in, u64 lo, u64 hi, int me) {
    const u64 stride = (u64)gridDim.x * blockDim.x;
    u64 i = lo + (u64)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < hi; i += 4 * stride) {
        uint4 x[4], y[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            x[u] = __ldcs(in + i + u * stride);
            y[u] = __ldcg(out + i + u * stride);
        }
#pragma unroll
        for (int u = 0; u < 4; ++u)
            __stcg(out + i + u * stride, me == 0 ? vec_op<T, OP>(x[u], y[u]) : vec_op<T, OP>(y[u], x[u]));
    }
    for (; i < hi; i += stride) {
        const uint4 x = __ldcs(in + i), y = __ldcg(out + i);
        __stcg(out + i, me == 0 ? vec_op<T, OP>(x, y) : vec_op<T, OP>(y, x));
    }
}

// K_ALLREDUCE_CE, two ranks, on a stream of its own beside the copies (comm.rs): for each chunk,
// wait until the peer's copy of it has landed in this rank's output (its flag), then reduce
// this rank's input into it, the two sources in rank order, as every other path does. Aligned
// buffers: the whole grid strides over the chunk's vectors, four in flight per thread (one
// vector a round over contiguous block shares measured 125 us slower a call at 256 MiB-1 GiB,
// perf-notes §30), and block 0 takes the elements past the last whole vector; otherwise block
// b reduces the b-th share with reduce_into. No step counter: the barrier kernel before the
// copies is the call's only step.
template <typename T>
__device__ void run_ce_reduce(const CollArgs& a, int* err) {
    const int me = a.rank, G = gridDim.x, b = blockIdx.x;
    const u64 E = sizeof(T), V = 16 / sizeof(T);
    volatile u64* flags = a.sync[me] + CE_FLAGS_OFF;
    T* out = (T*)a.output;
    const T* in = (const T*)a.input;
    const bool vec = aligned16(out) && aligned16(in);
    for (int k = 0; k < CE_CHUNKS; ++k) {
        if (threadIdx.x == 0) {
            const int e = wait_ge(a, flags + k, 1);
            fence_sys();  // acquire: the copy landed before the peer's stream wrote the flag
            if (e) {
                if (e != F_ELSEWHERE) record_failure(a, e, 1 - me, 0);
                *err = e;
            }
        }
        __syncthreads();
        if (*err) return;
        u64 lo, hi;
        ce_chunk(k, a.count, E, lo, hi);
        if (vec) {
            // lo is a chunk edge (a multiple of CE_ALIGN bytes); hi is one too, or the end.
            const u64 vlo = lo / V, vhi = hi / V;
            uint4* o = (uint4*)out;
            const uint4* x = (const uint4*)in;
            switch (a.redop) {
                case R_PROD: ce_reduce_vecs<T, R_PROD>(o, x, vlo, vhi, me); break;
                case R_MIN: ce_reduce_vecs<T, R_MIN>(o, x, vlo, vhi, me); break;
                case R_MAX: ce_reduce_vecs<T, R_MAX>(o, x, vlo, vhi, me); break;
                case R_AVG: ce_reduce_vecs<T, R_AVG>(o, x, vlo, vhi, me); break;
                default: ce_reduce_vecs<T, R_SUM>(o, x, vlo, vhi, me); break;
            }
            if (b == 0) {
                typedef typename Ty<T>::acc A;
                for (u64 j = vhi * V + threadIdx.x; j < hi; j += blockDim.x) {
                    const A mine = Ty<T>::up(in[j]), peer = Ty<T>::up(out[j]);
                    const A r = me == 0 ? combine<A>(a.redop, mine, peer) : combine<A>(a.redop, peer, mine);
                    out[j] = Ty<T>::down(finish<A>(a.redop, r, 2));
                }
            }
        } else {
            const u64 share = ((hi - lo + G - 1) / G + V - 1) / V * V;
            const u64 blo = lo + (u64)b * share < hi ? lo + (u64)b * share : hi;
            const u64 bhi = blo + share < hi ? blo + share : hi;
            const T* srcs[2];
            srcs[me] = in + blo;
            srcs[1 - me] = out + blo;  // the peer's input, copied here
            reduce_into<T>(out + blo, nullptr, 0, srcs, 2, bhi - blo, a.redop, 2);
        }
        __syncthreads();
    }
}

// ---- The pipelined one-shot all-reduce (K_ALLREDUCE_PIPE) -----------------------------------
//
// One-shot through the scratch (every rank pushes its input into every peer's scratch and
// reduces what arrived, in rank order), with each block's push and reduction overlapped. The
// plan gives one chunk (count <= grid * piece): block b's piece is cut into S = piece / sub
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
// reading this call's half when its last flag arrives, so the file comment's argument, which
// takes a peer's flag for "done reading", does not hold for these flags). The peer ran that
// earlier kernel to its end before its pushers gave this call's first flag (kernels on a stream
// end in order; griddepcontrol.wait), and this block waited for that flag. The call after next
// writes this half again only after a flag of the next call, so after the peer's whole kernel
// for this one.
template <typename T>
__device__ void run_pipe(const CollArgs& a, u64 base, int* err) {
    const int b = blockIdx.x, N = a.nranks, me = a.rank;
    const u64 E = sizeof(T);
    constexpr unsigned P = PIPE_PUSH_WARPS * 32;
    const unsigned tid = threadIdx.x;
    // Never planned (plan.rs: THREADS threads, a piece within the stride); the peers' waits will
    // say so.
    if (a.sub == 0 || blockDim.x <= P || (blockDim.x & 31) || a.piece * E > a.stride) return;
    const u64 S = (a.piece + a.sub - 1) / a.sub;
    const int par = (int)((base + 1) & 1);
    const bool in_place = a.input == a.output;
    const u64 lo0 = (u64)b * a.piece;
    const u64 lo = lo0 < a.count ? lo0 : a.count;
    const u64 n = (lo + a.piece < a.count ? lo + a.piece : a.count) - lo;
    const T* in = (const T*)a.input + lo;
    T* out = (T*)a.output + lo;
    // This block's region of rank r's slot for source src (see SLOT in run).
    auto slot = [&](int r, int src) { return a.scratch[r] + ((u64)par * N + src) * a.slot_bytes + (u64)b * a.stride; };
    __shared__ volatile unsigned pushed;  // sub-pieces this block's pushers have read
    if (tid == 0) pushed = 0;
    __syncthreads();
    if (tid < P) {
        unsigned char* dsts[MAX_RANKS];
        for (u64 s = 0; s < S; ++s) {
            u64 slo, shi;
            part_of(s, a.sub, n, slo, shi);
            for (int q = 0; q < N; ++q) dsts[q] = q == me ? 0 : slot(q, me) + slo * E;
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
                e = wait_one(a, (int)rt, base + s + 1, par);
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
            for (int r = 0; r < N; ++r) srcs[r] = r == me ? in + slo : (const T*)(slot(me, r) + slo * E);
            reduce_into<T, Threads<P, 0>>(out + slo, nullptr, 0, srcs, N, shi - slo, a.redop, N);
        }
    }
    __syncthreads();
    if (tid == 0 && !*err) a.sync[me][COUNTERS_OFF + b] = base + (S | 1);
}

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

// ---------------------------------------------------------------------------------------------
// Point-to-point: the sends and receives of a group, outside the collectives' step counters.
//
// Rank s sends to rank d through d's inbox for s: P2P_BLOCKS lanes, each a ring of P2P_SLOTS
// slots. A message of n bytes is cut into chunks of p2p_chunk(n) bytes (n spread over the
// lanes, at least P2P_MIN_CHUNK, at most a slot's P2P_CHUNK); chunk k travels in lane
// k % P2P_BLOCKS. Each lane keeps lifetime counts on both sides, in device memory (so a call
// captured in a CUDA graph replays correctly):
//   s: SENT[d][lane] (chunks it put in the lane), and FREED[d][lane] in s's sync area, written
//      by d (chunks d has taken out);
//   d: RECVD[s][lane].
// The sender's i-th chunk of a lane goes into slot i % P2P_SLOTS once FREED > i - P2P_SLOTS.
// Every slot starts with a header of two LL lines (message number + 1, message bytes), each
// 8-byte half carrying the flag i % (2^32 - 1) + 1, which no line of the slot still carries
// (never 0; the LL area is rewritten whole every P2P_LL_SCRUB uses): the header is the chunk's
// ready signal, and the receiver checks it against its own message number and size (a
// different size is a mismatch, never silent). The chunk's data travels one of two ways:
//   - a message of at most P2P_LL_BYTES: as LL lines in the slot's LL area (8 data bytes and
//     two flags per 16-byte line; the receiver polls each line; no fence);
//   - a larger one: copied into the slot's data area, then a system fence, then the header; the
//     receiver fences after the header and copies out.
// The receiver then stores FREED = i + 1 in the sender's sync area. Every lane counts every
// message (MSGS), even one that carries none of its chunks, so the message numbers agree on
// both sides. The LL area is only ever written with LL lines, so user data never sits where a
// flag is polled.
//
// A group's operations are sorted by the host into channels (coll_abi.h); block b runs lane
// b % P2P_BLOCKS of channel b / P2P_BLOCKS, that channel's messages one after another. The
// receiving channels come first in the grid, so they are resident before any sending block
// waits for a slot: a sender only ever waits for receivers, which never wait for a block that
// is not running.

// The chunk size of a message of `bytes`: one chunk per lane, so that a 128 KiB message keeps
// every lane busy rather than two of them; once a lane's share passes P2P_PIPE_CHUNK, at least
// two chunks per lane, so that one chunk's copy overlaps the other's flag round trip (the send/
// recv sweep of perf-notes §25 measured both rules). At least P2P_MIN_CHUNK, at most a slot.
// Both sides compute it from the size alone; a mismatched size is still caught by the header.
__device__ __forceinline__ u64 p2p_chunk(u64 bytes) {
    u64 c = (bytes + P2P_BLOCKS - 1) / P2P_BLOCKS;
    if (c > P2P_PIPE_CHUNK) c = (bytes + 2 * P2P_BLOCKS - 1) / (2 * P2P_BLOCKS);
    // Whole 512-byte units (aligned copies), at least P2P_MIN_CHUNK: a message just over a
    // power of two still spreads over every lane.
    c = (c + 511) / 512 * 512;
    if (c < P2P_MIN_CHUNK) c = P2P_MIN_CHUNK;
    return c > P2P_CHUNK ? (u64)P2P_CHUNK : c;
}

// copy_bytes with P2P_UNROLL 16-byte loads in flight per thread before their stores (a block
// of one load each keeps too few bytes in flight to fill its share of the link).
__device__ void copy_chunk(unsigned char* dst, const unsigned char* src, u64 n) {
    if (!(aligned16(dst) && aligned16(src))) {
        copy_bytes(dst, src, n);
        return;
    }
    const u64 nv = n >> 4;
    uint4* d = (uint4*)dst;
    const uint4* s = (const uint4*)src;
    const u64 step = blockDim.x;
    u64 i = threadIdx.x;
    for (; i + (P2P_UNROLL - 1) * step < nv; i += P2P_UNROLL * step) {
        uint4 v[P2P_UNROLL];
#pragma unroll
        for (int u = 0; u < P2P_UNROLL; ++u) v[u] = __ldcg(s + i + u * step);
#pragma unroll
        for (int u = 0; u < P2P_UNROLL; ++u) d[i + u * step] = v[u];
    }
    for (; i < nv; i += step) d[i] = __ldcg(s + i);
    const u64 head = nv << 4;
    for (u64 j = head + threadIdx.x; j < n; j += step) dst[j] = __ldcg(src + j);
}

__device__ void p2p_fail(const P2pArgs& a, int code, int kind, int peer, u64 mine, u64 theirs) {
    // A mismatch stops this process's ranks too, so that the sender (which may be waiting for
    // slots this receiver will never free) ends at once; other processes learn it from the
    // host's monitor.
    if ((code == F_TIMEOUT || code == F_MISMATCH) && *a.abort_flag == 0)
        *a.abort_flag = abort_value(a.rank, peer, code);
    u64* my = a.my_sync;
    if (atomicCAS((unsigned long long*)(my + FAIL_OFF), 0ull, (unsigned long long)code) == 0ull) {
        volatile u64* st = my + STATUS_OFF;
        st[1] = (u64)kind;
        st[2] = (u64)peer;
        st[3] = (u64)blockIdx.x;
        st[4] = mine;
        st[5] = theirs;
        __threadfence();
        st[0] = (u64)code;
    }
}

// Waits until *flag >= want (thread 0 of the block only).
__device__ int p2p_wait(const P2pArgs& a, volatile u64* flag, u64 want) {
    Limits lim;
    volatile u64* fail = a.my_sync + FAIL_OFF;
    while (*flag < want) {
        if (const int e = lim.check(a, fail)) return e;
    }
    return 0;
}

// Waits until the LL line at `p` carries `flag` in both halves, and gives its data.
__device__ int p2p_wait_line(const P2pArgs& a, const unsigned char* p, unsigned flag, uint2* got) {
    Limits lim;
    volatile u64* fail = a.my_sync + FAIL_OFF;
    while (true) {
        const uint4 v = ll_load(p);
        if (v.y == flag && v.w == flag) {
            *got = make_uint2(v.x, v.z);
            return 0;
        }
        if (const int e = lim.check(a, fail)) return e;
    }
}

// One lane's part of operation `o` (a send or a receive). Returns nonzero once the call failed
// (every thread of the block returns the same).
__device__ int p2p_message(const P2pArgs& a, int o, int lane, int* err) {
    volatile u64* my = a.my_sync;
    const bool sending = a.kind[o] == P2P_SEND;
    const int peer = a.peer[o];
    const u64 bytes = a.bytes[o];
    // A zero-byte message is one empty chunk: its header still tells the receiver the size.
    const u64 chunk = p2p_chunk(bytes);
    const u64 chunks = bytes == 0 ? 1 : (bytes + chunk - 1) / chunk;
    volatile u64* msgs = my + P2P_MSGS_OFF + ((sending ? 0 : 1) * MAX_RANKS + peer) * P2P_BLOCKS + lane;
    const u64 msg = *msgs;
    volatile u64* count = my + (sending ? P2P_SENT_OFF : P2P_RECVD_OFF) + peer * P2P_BLOCKS + lane;
    u64 i = *count;
    const bool ll = bytes <= P2P_LL_BYTES;
    for (u64 k = lane; k < chunks; k += P2P_BLOCKS, ++i) {
        const u64 off = k * chunk;
        const u64 len = bytes - off < chunk ? bytes - off : chunk;
        const u64 slot = (u64)lane * P2P_SLOTS + i % P2P_SLOTS;
        // Never 0 (the LL area starts zeroed), and distinct for any two chunk numbers less
        // than 2^32 - 1 apart; the scrub below keeps every line of the area younger than that.
        const unsigned flag = (unsigned)(i % 0xffffffffull) + 1u;
        const u64 lines = (len + 7) / 8;
        if (sending) {
            unsigned char* s = a.dst[o] + slot * P2P_SLOT_BYTES;
            if (threadIdx.x == 0 && i >= P2P_SLOTS) {
                const int e = p2p_wait(a, my + P2P_FREED_OFF + peer * P2P_BLOCKS + lane, i - P2P_SLOTS + 1);
                fence_sys();  // acquire: the receiver's reads of the slot are done before we overwrite it
                if (e) {
                    if (e != F_ELSEWHERE) p2p_fail(a, e, K_SEND, peer, msg, 0);
                    *err = e;
                }
            }
            __syncthreads();
            if (*err) return *err;
            if ((i / P2P_SLOTS) % P2P_LL_SCRUB == 0) {
                // Once every P2P_LL_SCRUB uses of a slot, every line of its LL area gets this
                // chunk's flag (with no data; the receiver polls only the lines a message fills):
                // a line a receiver polls then always holds a flag from fewer than 2^29 chunk
                // numbers back, never one equal to the current flag after the 32-bit wrap.
                for (u64 u = (ll ? lines : 0) + threadIdx.x; u < P2P_LL_AREA / 16; u += blockDim.x)
                    ll_store(s + P2P_HEADER + 16 * u, make_uint2(0, 0), flag);
            }
            if (ll) {
                const unsigned char* from = a.src[o] + off;
                const bool al = (((u64)from) & 7ull) == 0;
                for (u64 u = threadIdx.x; u < lines; u += blockDim.x)
                    ll_store(s + P2P_HEADER + 16 * u, load8(from, u, len, al), flag);
            } else {
                copy_chunk(s + P2P_HEADER + P2P_LL_AREA, a.src[o] + off, len);
                __syncthreads();
                if (threadIdx.x == 0) fence_sys();  // release: the chunk before its header
            }
            if (threadIdx.x == 0) {
                ll_store(s, make_uint2((unsigned)(msg + 1), (unsigned)bytes), flag);
                ll_store(s + 16, make_uint2((unsigned)((msg + 1) >> 32), (unsigned)(bytes >> 32)), flag);
            }
        } else {
            const unsigned char* s = a.src[o] + slot * P2P_SLOT_BYTES;
            if (threadIdx.x == 0) {
                uint2 h0 = make_uint2(0, 0), h1 = make_uint2(0, 0);
                int e = p2p_wait_line(a, s, flag, &h0);
                if (!e) e = p2p_wait_line(a, s + 16, flag, &h1);
                if (!e && !ll) fence_sys();  // acquire: the copied chunk is visible after its header
                int kind = K_RECV;
                u64 mine = bytes, theirs = 0;
                if (!e) {
                    const u64 their_msg = (u64)h0.x | ((u64)h1.x << 32);
                    const u64 their_bytes = (u64)h0.y | ((u64)h1.y << 32);
                    if (their_msg != msg + 1) {
                        // Another message than this one (the two ranks' orders differ): report
                        // the message numbers, since the sizes may well agree.
                        e = F_MISMATCH;
                        kind = K_RECV_ORDER;
                        mine = msg;
                        theirs = their_msg - 1;
                    } else if (their_bytes != bytes) {
                        e = F_MISMATCH;
                        theirs = their_bytes;
                    }
                }
                if (e) {
                    if (e != F_ELSEWHERE) p2p_fail(a, e, kind, peer, mine, theirs);
                    *err = e;
                }
            }
            __syncthreads();
            if (*err) return *err;
            if (ll) {
                unsigned char* to = a.dst[o] + off;
                const bool al = (((u64)to) & 7ull) == 0;
                for (u64 u = threadIdx.x; u < lines; u += blockDim.x) {
                    uint2 d;
                    const int e = p2p_wait_line(a, s + P2P_HEADER + 16 * u, flag, &d);
                    if (e) {
                        if (e != F_ELSEWHERE) p2p_fail(a, e, K_RECV, peer, bytes, 0);
                        *err = e;
                        break;
                    }
                    store8(to, u, len, al, d);
                }
                // Every line's load has returned (its data is stored): the slot may be reused
                // without a fence.
                __syncthreads();
                if (*err) return *err;
                if (threadIdx.x == 0)
                    ((volatile u64*)a.peer_sync[o])[P2P_FREED_OFF + a.rank * P2P_BLOCKS + lane] = i + 1;
            } else {
                copy_chunk(a.dst[o] + off, s + P2P_HEADER + P2P_LL_AREA, len);
                __syncthreads();  // every thread's loads of the slot are done
                if (threadIdx.x == 0) {
                    fence_sys();
                    ((volatile u64*)a.peer_sync[o])[P2P_FREED_OFF + a.rank * P2P_BLOCKS + lane] = i + 1;
                }
            }
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        *count = i;
        *msgs = msg + 1;
    }
    __syncthreads();  // the next message of this channel reads the counters back
    return 0;
}

#if COLL_IN(COLL_PART_P2P)
extern "C" __global__ void __launch_bounds__(512, 2) p2p_sendrecv(P2pArgs a) {
    __shared__ int err;
    // An earlier call failed: the communicator is unusable. Read once, so that every thread of
    // the block leaves together.
    if (threadIdx.x == 0) err = ((volatile u64*)a.my_sync)[FAIL_OFF] ? F_ELSEWHERE : 0;
    __syncthreads();
    if (err) return;
    const int c = (int)blockIdx.x / P2P_BLOCKS;
    const int lane = (int)blockIdx.x % P2P_BLOCKS;
    const int end = a.chan_first[c] + a.chan_ops[c];
    for (int o = a.chan_first[c]; o < end; ++o) {
        if (a.kind[o] == P2P_COPY) {
            // A message to itself: this lane's chunks, copied locally.
            const u64 bytes = a.bytes[o];
            const u64 chunk = p2p_chunk(bytes);
            for (u64 off = (u64)lane * chunk; off < bytes; off += (u64)P2P_BLOCKS * chunk) {
                const u64 len = bytes - off < chunk ? bytes - off : chunk;
                copy_chunk(a.dst[o] + off, a.src[o] + off, len);
            }
            continue;
        }
        if (p2p_message(a, o, lane, &err)) return;
    }
}
#endif  // COLL_IN(COLL_PART_P2P)
