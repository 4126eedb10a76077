// Host cost of one kernel launch by the driver's entry points (docs/performance.md, "Host cost
// of a call"): what p2p's collectives pay per call before any code of ours. No Rust needed
// (sweep.sh launch-cost).
//
// Built twice: with -DKERNELS -cubin for the empty kernels, and as the host program (driver API
// only, -lcuda), which loads the cubin into each context it makes. Each variant queues CALLS
// launches of an empty one-block kernel round-robin over its streams (contexts), timed on the
// host clock around the queueing only (every context synchronised before and after, outside
// the timing); SAMPLES batches per variant, the variants interleaved batch by batch so drift
// hits them alike; reported per launch: median, min, max.
#ifdef KERNELS
#define ARGS_WORDS 47  // the collectives' argument block: 376 bytes (p2p-collective KERNEL_ARGS_BYTES)
struct Args { unsigned long long w[ARGS_WORDS]; };
__device__ __forceinline__ void overlap() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
extern "C" __global__ void empty_kernel() { overlap(); }
extern "C" __global__ void empty_args_kernel(Args a) {
  overlap();
  if (a.w[ARGS_WORDS - 1] == 1) asm volatile("trap;");
}
#else
#include <cuda.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CK(x)                                                              \
  do {                                                                     \
    CUresult r_ = (x);                                                     \
    if (r_ != CUDA_SUCCESS) {                                              \
      const char* s_ = nullptr;                                            \
      cuGetErrorName(r_, &s_);                                             \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, s_ ? s_ : "?"); \
      exit(1);                                                             \
    }                                                                      \
  } while (0)

struct Ctx {
  CUcontext ctx;
  CUstream stream;
  CUfunction empty, with_args;
};

enum Api { LEGACY, EX, EX_PDL };

struct Variant {
  const char* name;
  const char* what;
  Api api;
  bool args;
  int contexts;   // launches go round-robin over this many contexts (1: the first only)
  int streams;    // ... and this many streams of the first context (contexts == 1 only)
  bool set_ctx;   // cuCtxSetCurrent before every launch, as p2p's Device::bind_to_thread does
};

static unsigned long long args_block[46];

static void launch(const Ctx& c, CUstream s, Api api, bool args) {
  void* one[] = {args_block};
  void** params = args ? one : nullptr;
  CUfunction f = args ? c.with_args : c.empty;
  if (api == LEGACY) {
    CK(cuLaunchKernel(f, 1, 1, 1, 512, 1, 1, 0, s, params, nullptr));
    return;
  }
  CUlaunchAttribute attr;
  memset(&attr, 0, sizeof attr);
  attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  attr.value.programmaticStreamSerializationAllowed = 1;
  CUlaunchConfig cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
  cfg.blockDimX = 512;
  cfg.blockDimY = cfg.blockDimZ = 1;
  cfg.hStream = s;
  cfg.attrs = api == EX_PDL ? &attr : nullptr;
  cfg.numAttrs = api == EX_PDL ? 1 : 0;
  CK(cuLaunchKernelEx(&cfg, f, params, nullptr));
}

int main(int argc, char** argv) {
  const char* cubin = argc > 1 ? argv[1] : "launch_cost.cubin";
  int calls = argc > 2 ? atoi(argv[2]) : 200;
  int samples = argc > 3 ? atoi(argv[3]) : 50;
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  // Context 0 is the primary one (as p2p uses); 1-3 are extra contexts on the same GPU, to
  // show what switching contexts costs, as one thread issuing for several GPUs does.
  std::vector<Ctx> ctxs(4);
  for (int i = 0; i < 4; i++) {
    if (i == 0) {
      CK(cuDevicePrimaryCtxRetain(&ctxs[i].ctx, dev));
    } else {
#if CUDA_VERSION >= 13000
      CK(cuCtxCreate(&ctxs[i].ctx, nullptr, 0, dev));
#else
      CK(cuCtxCreate(&ctxs[i].ctx, 0, dev));
#endif
    }
    CK(cuCtxSetCurrent(ctxs[i].ctx));
    CUmodule m;
    CK(cuModuleLoad(&m, cubin));
    CK(cuModuleGetFunction(&ctxs[i].empty, m, "empty_kernel"));
    CK(cuModuleGetFunction(&ctxs[i].with_args, m, "empty_args_kernel"));
    CK(cuStreamCreate(&ctxs[i].stream, CU_STREAM_NON_BLOCKING));
  }
  CUstream second;
  CK(cuCtxSetCurrent(ctxs[0].ctx));
  CK(cuStreamCreate(&second, CU_STREAM_NON_BLOCKING));
  std::vector<Variant> vs = {
      {"legacy", "cuLaunchKernel, no parameters", LEGACY, false, 1, 1, false},
      {"legacy_args", "cuLaunchKernel, 376-byte block", LEGACY, true, 1, 1, false},
      {"ex_args", "cuLaunchKernelEx, no attribute, 376-byte block", EX, true, 1, 1, false},
      {"ex_pdl_args", "cuLaunchKernelEx, dependent launch, 376-byte block", EX_PDL, true, 1, 1, false},
      {"ex_pdl_args_setctx", "as ex_pdl_args, cuCtxSetCurrent (same context) before each", EX_PDL, true, 1, 1, true},
      {"legacy_args_2streams", "as legacy_args, two streams in turn", LEGACY, true, 1, 2, true},
      {"ex_args_2streams", "as ex_args, two streams in turn", EX, true, 1, 2, true},
      {"ex_pdl_args_2streams", "as ex_pdl_args, two streams in turn", EX_PDL, true, 1, 2, true},
      {"ex_pdl_args_2ctx", "as ex_pdl_args_setctx, two contexts in turn", EX_PDL, true, 2, 1, true},
      {"ex_pdl_args_4ctx", "as ex_pdl_args_setctx, four contexts in turn", EX_PDL, true, 4, 1, true},
      {"legacy_args_4ctx", "as legacy_args with cuCtxSetCurrent, four contexts in turn", LEGACY, true, 4, 1, true},
  };
  std::vector<std::vector<double>> t(vs.size());
  auto sync_all = [&] {
    for (auto& c : ctxs) {
      CK(cuCtxSetCurrent(c.ctx));
      CK(cuCtxSynchronize());
    }
    CK(cuCtxSetCurrent(ctxs[0].ctx));
  };
  for (int s = -1; s < samples; s++) {  // sample -1 warms every variant up
    for (size_t v = 0; v < vs.size(); v++) {
      const Variant& x = vs[v];
      sync_all();
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < calls; i++) {
        const Ctx& c = ctxs[x.contexts > 1 ? i % x.contexts : 0];
        if (x.set_ctx) CK(cuCtxSetCurrent(c.ctx));
        CUstream st = x.streams > 1 && i % 2 ? second : c.stream;
        launch(c, st, x.api, x.args);
      }
      double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / calls;
      if (s >= 0) t[v].push_back(us);
    }
  }
  sync_all();
  int drv = 0;
  cuDriverGetVersion(&drv);
  char name[128] = {0};
  cuDeviceGetName(name, sizeof name, dev);
  printf("# host us per launch: %s, driver %d, %d batches of %d launches per variant\n", name, drv, samples, calls);
  printf("| variant | median | min | max | what |\n| --- | --- | --- | --- | --- |\n");
  for (size_t v = 0; v < vs.size(); v++) {
    auto& x = t[v];
    std::sort(x.begin(), x.end());
    printf("| %s | %.3f | %.3f | %.3f | %s |\n", vs[v].name, x[x.size() / 2], x.front(), x.back(), vs[v].what);
  }
  return 0;
}
#endif
