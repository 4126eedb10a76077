// The interface between the host (p2p-collective's `plan` and `call`) and the collective
// kernels (`coll/`), written once. Every kernel header includes it; p2p-collective's build.rs
// turns the same text into Rust (`crate::abi`): every #define below becomes a `usize` constant,
// every enum entry an `i32` constant, and `struct CollArgs` a #[repr(C)] struct (pointers as
// u64). Keep to those forms: `#define NAME <integer expression of numbers and earlier names>`,
// `enum X { NAME = n, ... };`, and struct fields of the types build.rs maps.
#pragma once

#define MAX_RANKS 8
#define MAX_BLOCKS 256
#define THREADS 512  // threads per block; an LL block's piece is at most this many 8-byte units

// Layout of a rank's sync area, in 64-bit words.
#define FLAGS_OFF 0                                            // [MAX_BLOCKS][MAX_RANKS]
#define SIGS_OFF (MAX_BLOCKS * MAX_RANKS)                      // [2][MAX_BLOCKS][MAX_RANKS]
#define COUNTERS_OFF (3 * MAX_BLOCKS * MAX_RANKS)              // [MAX_BLOCKS]
#define FAIL_OFF (COUNTERS_OFF + MAX_BLOCKS)                   // 1 word
#define STATUS_OFF (FAIL_OFF + 1)                              // STATUS_WORDS words
#define STATUS_WORDS 6  // failure, what failed (a plan's code or K_SEND ...), peer, block, this rank's signature, the peer's
// Point-to-point (send/recv): per peer and per block of a direction, lifetime counts of chunks.
#define P2P_BLOCKS 32      // blocks (lanes) per direction of a send/recv kernel
#define P2P_SLOTS 2        // slots per (source, block) in a receiver's inbox
#define P2P_CHUNK (256 * 1024)  // data bytes per slot: the largest chunk
#define P2P_MIN_CHUNK 4096       // the smallest chunk of a message cut over the lanes (a multiple of 16)
#define P2P_PIPE_CHUNK (128 * 1024)  // a lane's share above this travels as two chunks or more
#define P2P_UNROLL 4             // 16-byte loads in flight per thread in a chunk's copy
#define P2P_LL_BYTES (128 * 1024)  // messages up to this travel as LL lines (8 data bytes per 16-byte line)
#define P2P_HEADER 32      // each slot starts with two LL lines: (message number + 1, message bytes)
#define P2P_LL_AREA (2 * P2P_MIN_CHUNK)  // then an LL chunk's lines (never written with raw data)
#define P2P_LL_SCRUB 268435456  // every this many uses of a slot, the sender rewrites its whole LL area
#define P2P_SLOT_BYTES (P2P_HEADER + P2P_LL_AREA + P2P_CHUNK)  // then a copied chunk
#define P2P_INBOX_BYTES (P2P_BLOCKS * P2P_SLOTS * P2P_SLOT_BYTES)  // per source rank
#define P2P_FREED_OFF (STATUS_OFF + 8)                          // [MAX_RANKS dst][P2P_BLOCKS], written by dst
#define P2P_SENT_OFF (P2P_FREED_OFF + MAX_RANKS * P2P_BLOCKS)   // [MAX_RANKS dst][P2P_BLOCKS], local
#define P2P_RECVD_OFF (P2P_SENT_OFF + MAX_RANKS * P2P_BLOCKS)   // [MAX_RANKS src][P2P_BLOCKS], local
#define P2P_MSGS_OFF (P2P_RECVD_OFF + MAX_RANKS * P2P_BLOCKS)   // [2 send/recv][MAX_RANKS][P2P_BLOCKS], local
#define P2P_END_OFF (P2P_MSGS_OFF + 2 * MAX_RANKS * P2P_BLOCKS)
// The copy-engine all-reduce on two ranks (proto/ce.cuh): the peer's copy engines write its
// whole input into this rank's output in CE_CHUNKS chunks of halving size (half the data, a
// quarter, ..., the last chunk the rest: little reduction is left once the last copy lands),
// each chunk's edge rounded down to CE_ALIGN bytes; after each chunk the peer's stream writes 1
// into this rank's word CE_FLAGS_OFF + k. The host clears the words after the reduce kernel.
#define CE_FLAGS_OFF P2P_END_OFF  // [CE_CHUNKS], written by the peer's stream
#define CE_CHUNKS 6
#define CE_ALIGN 65536
// How often waits read the host's abort flag (sync.cuh `Limits`): each waiting thread at most
// once every HOST_POLL_NS * min(blocks, HOST_POLL_SPREAD) ns, the blocks staggered.
#define HOST_POLL_NS 100000
#define HOST_POLL_SPREAD 64
// The pipelined all-reduce (algo/pipe.cuh): warps [0, PIPE_PUSH_WARPS) of a block push, the
// rest reduce.
#define PIPE_PUSH_WARPS 8
// What failed, in status word 1: a collective records its plan's code (`Plan::code`: CODE_TAG
// | op << CODE_OP_SHIFT | algorithm << CODE_ALGO_SHIFT | protocol, so at least CODE_TAG), a
// send or recv one of these.
#define K_SEND 64
#define K_RECV 65
#define K_RECV_ORDER 66  // a recv met another message number than its own: words 4, 5 are the two numbers
#define CODE_TAG 4096
#define CODE_OP_SHIFT 8
#define CODE_ALGO_SHIFT 4
// The element types (`DataType::ALL`'s order: entry.cuh gives each its kernels).
#define COLL_TYPES 7
// The kernels compile as COLL_PARTS programs, in parallel (docs/performance.md, "The first
// compile and the kernel cache"): part k < COLL_PART_P2P holds every kernel of the k-th type,
// part COLL_PART_P2P the send/recv kernel. The host defines COLL_PART for each compile
// (NVRTC's -D); the program compiled without it holds every kernel.
#define COLL_PARTS (COLL_TYPES + 1)
#define COLL_PART_P2P COLL_TYPES
#define SYNC_BYTES (64 * 1024)  // the sync area at the start of a workspace; the scratch follows
// The host's abort flag (p2p_transport::conn::AbortHandle): a failing kernel sets it to
// ABORT_KERNEL_FAILED | (the rank it waited for + 1) << ABORT_PEER_SHIFT
// | (its own rank + 1) << ABORT_RANK_SHIFT, plus ABORT_MISMATCH for a mismatched call
// (otherwise it reached its time limit).
#define ABORT_KERNEL_FAILED 2
#define ABORT_PEER_SHIFT 8
#define ABORT_RANK_SHIFT 16
#define ABORT_MISMATCH 16777216  // 1 << 24

// LL: the largest all-reduce it carries, and the bytes of one (parity, source) slot of its region.
#define LL_MAX_BYTES (512 * 1024)
#define LL_SLOT_BYTES (2 * LL_MAX_BYTES)
#define LL_LINES_PER_BLOCK THREADS

// The collectives (`Op::ALL`'s order; checked in types.rs's tests).
enum Op { OP_ALLREDUCE = 0, OP_BROADCAST = 1, OP_REDUCE = 2, OP_ALLGATHER = 3, OP_REDUCESCATTER = 4, OP_ALLTOALL = 5 };

// The reductions (`RedOp::ALL`'s order; each a functor in coll/redop.cuh).
enum RedOp { R_SUM = 0, R_PROD = 1, R_MIN = 2, R_MAX = 3, R_AVG = 4 };

// Failure codes in the status words (F_ELSEWHERE: another block failed first; never recorded).
enum Fail { F_TIMEOUT = 1, F_ABORT = 2, F_MISMATCH = 3, F_ELSEWHERE = 4 };

typedef unsigned long long u64;

struct CollArgs {
    const unsigned char* input;
    unsigned char* output;
    unsigned char* scratch[MAX_RANKS];  // every rank's scratch, as addressed from this GPU
    u64* sync[MAX_RANKS];               // every rank's sync area, as addressed from this GPU
    const unsigned char* peer_in[MAX_RANKS];  // direct: every rank's input, from this GPU
    unsigned char* peer_out[MAX_RANKS];       // direct, copy engines: every rank's output, from this GPU
    volatile int* abort_flag;           // pinned host memory: every wait polls it; a failing kernel sets it (ABORT_KERNEL_FAILED ...)
    u64 count;                          // elements per segment (the whole buffer, or one rank's part)
    u64 piece;                          // elements per block per chunk, a multiple of 16 bytes
    u64 sub;                            // the pipelined all-reduce: elements per sub-piece (else 0)
    u64 slot_bytes;                     // bytes per (parity, source rank) slot of scratch
    u64 stride;                         // bytes between blocks' regions of a slot (the largest piece)
    u64 timeout_ns;
    u64 sig;
    int op, redop, rank, nranks, root, check;  // op: enum Op; redop: enum RedOp
    int own_done;                       // one-shot all-gather, all-to-all: the own part is copied elsewhere (the copy engine)
    int code;                           // the plan's code, recorded in the status words on a failure
    int overlap;                        // two-shot, split: the chunks' steps overlap (steps.cuh, run_staged)
};

// Point-to-point groups (NCCL's ncclGroupStart/End around ncclSend/ncclRecv): one kernel runs
// every send, receive and copy to itself of a group. The host sorts them into channels, one per
// peer and direction (receives first, so that every receiving block is resident before any
// sender waits; then the copies to itself; then the sends), each run by P2P_BLOCKS blocks, one
// per lane. A channel's operations run in the order they were added.
#define P2P_MAX_OPS 32
enum P2pKind { P2P_RECV = 0, P2P_SEND = 1, P2P_COPY = 2 };

struct P2pArgs {
    const unsigned char* src[P2P_MAX_OPS];  // send, copy: the user's buffer; recv: this rank's inbox for the peer
    unsigned char* dst[P2P_MAX_OPS];        // send: the peer's inbox for this rank, from this GPU; recv, copy: the user's buffer
    u64* peer_sync[P2P_MAX_OPS];            // send, recv: the peer's sync area, from this GPU
    u64 bytes[P2P_MAX_OPS];
    int peer[P2P_MAX_OPS];
    int kind[P2P_MAX_OPS];                  // enum P2pKind
    int chan_first[P2P_MAX_OPS];            // channel c runs operations [chan_first[c], chan_first[c] + chan_ops[c])
    int chan_ops[P2P_MAX_OPS];
    u64* my_sync;                           // this rank's sync area
    volatile int* abort_flag;
    u64 timeout_ns;
    int rank, channels;                     // the grid is channels * P2P_BLOCKS blocks
};
static_assert(sizeof(P2pArgs) == 1568, "P2pArgs changed: p2p-abigen checks the Rust struct against this size");
// An LL message's chunks are P2P_MIN_CHUNK bytes (p2p_chunk), whose lines fill P2P_LL_AREA.
static_assert(P2P_LL_BYTES <= P2P_BLOCKS * P2P_MIN_CHUNK, "an LL chunk must fit its slot's LL area");

// The host's `CollArgs` (generated from this header) has the same layout and checks the same size.
static_assert(sizeof(CollArgs) == 376, "CollArgs changed: p2p-abigen checks the Rust struct against this size");
