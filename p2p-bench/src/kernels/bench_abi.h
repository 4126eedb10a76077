// The interface between the tools' Rust (doctor.rs, latency.rs, gate.rs) and their kernels
// (probe.cu, latency.cu, gate.cu), written once: NVRTC compiles it in front of each of them, and the crate's
// build.rs turns it into Rust (`kernels::abi`) with p2p-abigen (which says what
// forms this file keeps to).

typedef unsigned long long u64;

// One launch of p2p_fill: dst[i] = pattern(i, seed) for i < n (dst may be a peer's memory).
struct FillArgs {
    uint4* dst;                  // n 16-byte elements
    u64 n;
    unsigned seed;
};

// One launch of p2p_copy: dst[i] = src[i] for i < n (src may be a peer's memory).
struct CopyArgs {
    uint4* dst;                  // n 16-byte elements
    const uint4* src;            // n 16-byte elements
    u64 n;
};

// One launch of p2p_pingpong (one thread): `warmup` untimed round trips, then `iters` timed.
struct PingPongArgs {
    volatile unsigned* mine;     // the flag this GPU waits on, in its own memory
    volatile unsigned* theirs;   // the peer's flag, through the peer mapping
    u64* result;                 // [nanoseconds for the timed round trips, 1 if a wait timed out]
    u64 timeout_ns;              // how long any one wait may take
    unsigned warmup;
    unsigned iters;
    int starter;                 // nonzero: this side stores first
};

// One launch of p2p_gate (one thread): holds its stream until the host opens the gate or the
// time limit passes, so that the work queued behind it starts at once when it opens (graph
// timing without the host's launch cost in the figure).
struct GateArgs {
    volatile int* open;          // pinned host flag: nonzero opens the gate
    volatile int* timed_out;     // pinned host flag: the kernel sets it to 1 if it gave up
    u64 timeout_ns;              // how long the gate may hold its stream
};

static_assert(sizeof(FillArgs) == 24, "FillArgs changed: p2p-abigen checks the Rust struct against this size");
static_assert(sizeof(CopyArgs) == 24, "CopyArgs changed: p2p-abigen checks the Rust struct against this size");
static_assert(sizeof(PingPongArgs) == 48, "PingPongArgs changed: p2p-abigen checks the Rust struct against this size");
static_assert(sizeof(GateArgs) == 24, "GateArgs changed: p2p-abigen checks the Rust struct against this size");
