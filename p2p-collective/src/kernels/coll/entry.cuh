// The entry points of the collective program. COLL_ENTRY(name, run) defines, for every element
// type that this compile's part holds (COLL_PART, coll_abi.h), the kernel
// `coll_<type>_<name>(CollArgs)`, which runs the prologue below and then `run<T>(a)`.
//
// Each algorithm and protocol has entry points of its own, so that each gets its own register
// allocation (one large function made ptxas spill in the hot loops). The host names an entry
// by its plan (`plan::Entry`, whose suffixes are these names) and looks it up in the part of
// the call's type, so a kernel missing from its part fails the communicator's init.
//
// Two resident blocks of THREADS (512) threads per SM (the planner's grid: docs/performance.md,
// "Grid and blocks per SM") need at most 64 registers a thread: `__launch_bounds__`'s second
// bound makes ptxas keep to that. Without it a kernel once took 100 registers, which dropped
// every kernel to one block per SM and large collectives by up to 20 %.
#pragma once
#include "base.cuh"

// Launched with programmatic dependent launch: wait here until the previous kernel on the
// stream has finished and its writes are visible (our counters, the caller's buffers), and let
// the next one be scheduled early, hiding the launch gap (docs/performance.md, "Programmatic
// dependent launch"). Without it (a plain launch, sm_80) stream order does the same.
__device__ __forceinline__ void coll_prologue() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Which kernels this compile holds: part k < COLL_PART_P2P the kernels of the k-th type
// (`DataType::ALL`'s order), part COLL_PART_P2P the send/recv kernel (p2p.cuh); every kernel
// when COLL_PART is undefined.
#ifndef COLL_PART
#define COLL_PART -1
#endif
#define COLL_IN(k) (COLL_PART < 0 || COLL_PART == (k))

#define COLL_KERNEL(type, T, name, run)                                                          \
    extern "C" __global__ void __launch_bounds__(THREADS, 2) coll_##type##_##name(CollArgs a) { \
        coll_prologue();                                                                         \
        run<T>(a);                                                                               \
    }

// One line per element type, in `DataType::ALL`'s order (COLL_TYPES of them).
#if COLL_IN(0)
#define COLL_ENTRY_F32(name, run) COLL_KERNEL(f32, float, name, run)
#else
#define COLL_ENTRY_F32(name, run)
#endif
#if COLL_IN(1)
#define COLL_ENTRY_F64(name, run) COLL_KERNEL(f64, double, name, run)
#else
#define COLL_ENTRY_F64(name, run)
#endif
#if COLL_IN(2)
#define COLL_ENTRY_F16(name, run) COLL_KERNEL(f16, half_t, name, run)
#else
#define COLL_ENTRY_F16(name, run)
#endif
#if COLL_IN(3)
#define COLL_ENTRY_BF16(name, run) COLL_KERNEL(bf16, bhalf_t, name, run)
#else
#define COLL_ENTRY_BF16(name, run)
#endif
#if COLL_IN(4)
#define COLL_ENTRY_I32(name, run) COLL_KERNEL(i32, int, name, run)
#else
#define COLL_ENTRY_I32(name, run)
#endif
#if COLL_IN(5)
#define COLL_ENTRY_I64(name, run) COLL_KERNEL(i64, long long, name, run)
#else
#define COLL_ENTRY_I64(name, run)
#endif
#if COLL_IN(6)
#define COLL_ENTRY_U8(name, run) COLL_KERNEL(u8, unsigned char, name, run)
#else
#define COLL_ENTRY_U8(name, run)
#endif
static_assert(COLL_TYPES == 7, "one COLL_ENTRY_<type> line per element type");

#define COLL_ENTRY(name, run)                                                                  \
    COLL_ENTRY_F32(name, run)                                                                  \
    COLL_ENTRY_F64(name, run)                                                                  \
    COLL_ENTRY_F16(name, run)                                                                  \
    COLL_ENTRY_BF16(name, run) COLL_ENTRY_I32(name, run) COLL_ENTRY_I64(name, run) COLL_ENTRY_U8(name, run)
