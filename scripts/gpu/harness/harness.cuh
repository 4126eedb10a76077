// Shared by the nvcc harnesses here (p2p_sweep.cu, ll_floor.cu): the includes, a CUDA
// call check, and two GPUs set up for each other (peer access both ways, a non-blocking stream
// and two timing events each). sweep.sh puts this after coll_abi.h and coll.cu.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

struct GpuPair {
    cudaStream_t st[2];
    cudaEvent_t e0[2], e1[2];
    int* abort_flag;  // pinned, mapped: the kernels' abort flag, never set here
};

// Exits unless there are two GPUs; enables peer access both ways and makes each GPU's stream
// and events. Leaves GPU 1 current.
static GpuPair open_pair() {
    int ndev = 0;
    CK(cudaGetDeviceCount(&ndev));
    if (ndev < 2) {
        fprintf(stderr, "needs 2 GPUs, found %d\n", ndev);
        exit(1);
    }
    GpuPair p;
    for (int d = 0; d < 2; ++d) {
        CK(cudaSetDevice(d));
        CK(cudaDeviceEnablePeerAccess(1 - d, 0));
        CK(cudaStreamCreateWithFlags(&p.st[d], cudaStreamNonBlocking));
        CK(cudaEventCreate(&p.e0[d]));
        CK(cudaEventCreate(&p.e1[d]));
    }
    CK(cudaHostAlloc(&p.abort_flag, sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable));
    *p.abort_flag = 0;
    return p;
}

// Records e1 on both streams, waits, and gives the longer of the two GPUs' e0 -> e1 times in ms.
static float pair_elapsed_ms(GpuPair& p) {
    float ms = 0;
    for (int d = 0; d < 2; ++d) {
        CK(cudaSetDevice(d));
        CK(cudaEventRecord(p.e1[d], p.st[d]));
        CK(cudaEventSynchronize(p.e1[d]));
        float m = 0;
        CK(cudaEventElapsedTime(&m, p.e0[d], p.e1[d]));
        if (m > ms) ms = m;
    }
    return ms;
}
