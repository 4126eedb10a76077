// Timing marks inside run_ll for ll_floor.cu (docs/performance.md, "All-reduce, LL"), put in front
// of coll.cu by sweep.sh ll-floor for its probe build. Thread 0 of block 0 adds the globaltimer ns
// between marks i-1 and i to ll_probe_sum[i] (marks: 0 entry, 1 prologue loads done, 2 stores
// issued, 3 the peer's line seen, 4 output written, and in older code 5 counter written), the ns
// from the previous call's last mark to this call's first to ll_probe_sum[6], and counts the calls
// in ll_probe_sum[7]. The marks cost time themselves: compare totals with the build without them.
__device__ unsigned long long ll_probe_sum[8], ll_probe_last;
__device__ __noinline__ void ll_probe_mark(int i) {
    unsigned long long g;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g));
    if (i == 0) {
        if (ll_probe_last) ll_probe_sum[6] += g - ll_probe_last;
        ll_probe_sum[7] += 1;
    } else {
        ll_probe_sum[i] += g - ll_probe_last;
    }
    ll_probe_last = g;
}
#define LL_PROBE(i) \
    if (threadIdx.x == 0 && blockIdx.x == 0) ll_probe_mark(i)
