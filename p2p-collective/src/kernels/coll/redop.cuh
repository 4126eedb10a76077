// The reductions, as functors: one definition each, used by every path that reduces (the
// vector loops and tails of reduce.cuh, LL's lines in proto/ll.cuh, the copy-engine
// all-reduce in proto/ce.cuh). A reduction gives
//   apply(x, y)   x combined with y, on accumulators (f16 and bf16 in f32), x from the lower
//                 rank: every rank combines in rank order, so every rank gets the same bits;
//   finish(x, n)  the result once all n ranks' values are in (the average divides by n).
// A new reduction is its entry in `enum RedOp` (coll_abi.h), its functor here and its line in
// COLL_REDOPS.
#pragma once
#include "base.cuh"

struct FuncSum {
    template <typename A> static __device__ __forceinline__ A apply(A x, A y) { return x + y; }
    template <typename A> static __device__ __forceinline__ A finish(A x, int) { return x; }
};
struct FuncProd {
    template <typename A> static __device__ __forceinline__ A apply(A x, A y) { return x * y; }
    template <typename A> static __device__ __forceinline__ A finish(A x, int) { return x; }
};
struct FuncMin {
    template <typename A> static __device__ __forceinline__ A apply(A x, A y) { return y < x ? y : x; }
    template <typename A> static __device__ __forceinline__ A finish(A x, int) { return x; }
};
struct FuncMax {
    template <typename A> static __device__ __forceinline__ A apply(A x, A y) { return y > x ? y : x; }
    template <typename A> static __device__ __forceinline__ A finish(A x, int) { return x; }
};
// The average: the sum, divided once at the end (integers truncate, as NCCL's do).
struct FuncAvg {
    template <typename A> static __device__ __forceinline__ A apply(A x, A y) { return x + y; }
    template <typename A> static __device__ __forceinline__ A finish(A x, int n) { return (A)(x / (A)n); }
};

// Every reduction with its code, X(code, functor): what the dispatches below are made of.
#define COLL_REDOPS(X) X(R_SUM, FuncSum) X(R_PROD, FuncProd) X(R_MIN, FuncMin) X(R_MAX, FuncMax) X(R_AVG, FuncAvg)

// f(Func()) for the functor of reduction `op`, so that a loop over many elements is compiled
// once per reduction with no branch on it (an unknown code, which the host never passes,
// sums).
template <typename F> __device__ __forceinline__ void with_redop(int op, F f) {
    switch (op) {
#define COLL_REDOP_CASE(code, Func) \
    case code: f(Func()); return;
        COLL_REDOPS(COLL_REDOP_CASE)
#undef COLL_REDOP_CASE
        default: f(FuncSum()); return;
    }
}

// apply and finish of reduction `op` chosen at run time, for code that reduces a few elements
// with the call's reduction (LL's lines, the tails of the vector loops).
template <typename A> __device__ __forceinline__ A combine(int op, A x, A y) {
    switch (op) {
#define COLL_REDOP_CASE(code, Func) \
    case code: return Func::apply(x, y);
        COLL_REDOPS(COLL_REDOP_CASE)
#undef COLL_REDOP_CASE
        default: return FuncSum::apply(x, y);
    }
}

template <typename A> __device__ __forceinline__ A finish(int op, A x, int nranks) {
    switch (op) {
#define COLL_REDOP_CASE(code, Func) \
    case code: return Func::finish(x, nranks);
        COLL_REDOPS(COLL_REDOP_CASE)
#undef COLL_REDOP_CASE
        default: return x;
    }
}
