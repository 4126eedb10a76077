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

