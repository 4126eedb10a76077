// Point-to-point: the send/recv kernel of a group (`p2p_sendrecv`), outside the collectives'
// step counters.
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

#pragma once
#include "copy.cuh"
#include "entry.cuh"
#include "lines.cuh"
#include "sync.cuh"

// The chunk size of a message of `bytes`: one chunk per lane, so that a 128 KiB message keeps
// every lane busy rather than two of them; once a lane's share passes P2P_PIPE_CHUNK, at least
// two chunks per lane, so that one chunk's copy overlaps the other's flag round trip (the
// send/recv sweep measured both rules: docs/performance.md, "Send and receive"). At least
// P2P_MIN_CHUNK, at most a slot. Both sides compute it from the size alone; a mismatched size
// is still caught by the header.
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
