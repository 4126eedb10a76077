// The interface between the transport's Rust (conn.rs, copy/) and its kernels (sendrecv.cu,
// copy.cu), written once: NVRTC compiles it in front of each of them, and p2p-transport's
// build.rs turns it into Rust (`crate::kernels::abi`) with p2p-abigen (which says what forms
// this file keeps to).

typedef unsigned long long u64;

// What status[0] of a send, recv or wait holds after a failure (0: none): the time limit, or
// the abort flag (set by the host, by a watching rendezvous group, or by a failed kernel).
enum SrFail { SR_TIMED_OUT = 1, SR_ABORTED = 2 };

// One launch of p2p_send or p2p_recv (a message through the ring of slots).
struct SrArgs {
    unsigned char* buf;          // the source (send) or the destination (recv)
    u64 bytes;                   // the message's size
    unsigned char* slots;        // the ring's first slot
    u64 slot_bytes;              // bytes per slot
    volatile u64* ready;         // the ready flags (in the receiver's memory)
    volatile u64* freed;         // the freed flags (in the sender's memory)
    u64 base;                    // the connection's chunk counter before this message
    u64 timeout_ns;              // how long any wait may take
    volatile int* abort_flag;    // pinned host memory: nonzero once aborted
    int* status;                 // [code, chunk] of the first failure
    unsigned nslots;             // slots in the ring
    int slots_remote;            // recv: the slots are a peer's memory (read mode), reread each round
};

// One launch of p2p_wait_flag (the copy-engine path's wait before a chunk's copy).
struct SrWaitArgs {
    volatile u64* flag;
    u64 want;                    // wait until *flag >= want
    u64 timeout_ns;
    volatile int* abort_flag;
    int* status;
    u64 chunk;                   // recorded in status[1] on failure
};

// One launch of p2p_copy_bytes (the SM data path: `bytes` from src to dst, either of them a
// peer's memory).
struct CopyArgs {
    unsigned char* dst;
    const unsigned char* src;
    u64 bytes;
};

static_assert(sizeof(CopyArgs) == 24, "CopyArgs changed: p2p-abigen checks the Rust struct against this size");
static_assert(sizeof(SrArgs) == 88, "SrArgs changed: p2p-abigen checks the Rust struct against this size");
static_assert(sizeof(SrWaitArgs) == 48, "SrWaitArgs changed: p2p-abigen checks the Rust struct against this size");
