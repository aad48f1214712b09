// Allocation benchmark on a real GPU, the same workloads as benches/alloc.rs:
//   hot/<size>       one alloc+free pair of one size, repeated (warm cache)
//   mixed_1000_live  1000 live blocks, log-uniform 512 B – 8 MiB; each step frees a random
//                    live block and allocates a new random size (one pair)
// for PyTorch's C++ caching allocator (c10 raw_alloc/raw_delete), cuMemAllocAsync/
// cuMemFreeAsync on the default stream's pool, and cuMemAlloc/cuMemFree.
// Prints one JSON object per line: {"impl", "workload", "ns_per_pair" (median of repeats)}.
//   alloc_bench [ITERS] [REPEATS] [mixed]: with `mixed`, PyTorch's mixed workload alone (the
//   interleaved protocol of scripts/gpu/run.sh alternates it with gpumem-nb's, process by process).
//
// Built on the GPU machine by scripts/gpu/run.sh against the installed torch's headers.
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

static double now_ns() {
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Rng {
  uint64_t s;
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  size_t size() {
    double u = double(next() >> 11) / 9007199254740992.0;
    return size_t(std::pow(2.0, 9.0 + u * 14.0));
  }
};

using Alloc = std::function<void*(size_t)>;
using Free = std::function<void(void*)>;

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

static double hot(const Alloc& a, const Free& f, size_t size, int iters, int repeats) {
  std::vector<double> r;
  f(a(size));  // warm
  for (int k = 0; k < repeats; ++k) {
    double t0 = now_ns();
    for (int i = 0; i < iters; ++i) f(a(size));
    r.push_back((now_ns() - t0) / iters);
  }
  return median(r);
}

static double mixed(const Alloc& a, const Free& f, int iters, int repeats) {
  Rng rng{0x2545F4914F6CDD1DULL};
  std::vector<void*> live;
  for (int i = 0; i < 1000; ++i) live.push_back(a(rng.size()));
  std::vector<double> r;
  for (int k = 0; k < repeats; ++k) {
    double t0 = now_ns();
    for (int i = 0; i < iters; ++i) {
      size_t j = rng.next() % live.size();
      f(live[j]);
      live[j] = a(rng.size());
    }
    r.push_back((now_ns() - t0) / iters);
  }
  for (void* p : live) f(p);
  return median(r);
}

static void check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) {
    const char* s = nullptr;
    cuGetErrorName(r, &s);
    std::fprintf(stderr, "%s failed: %s\n", what, s ? s : "?");
    std::exit(1);
  }
}

static void report(const char* impl, const char* workload, double ns) {
  std::printf("{\"impl\": \"%s\", \"workload\": \"%s\", \"ns_per_pair\": %.1f}\n", impl, workload, ns);
  std::fflush(stdout);
}

// 8 threads, each on its own stream, hot 512 B pairs: ns per pair as each thread sees it
// (the slowest thread's wall time / pairs per thread), median of repeats.
static double threads8(const std::function<void*(size_t, CUstream)>& a, const std::function<void(void*, CUstream)>& f,
                       const std::vector<CUstream>& streams, int iters, int repeats) {
  std::vector<double> r;
  for (int k = 0; k < repeats; ++k) {
    std::vector<double> per(streams.size());
    std::vector<std::thread> ts;
    for (size_t t = 0; t < streams.size(); ++t) {
      ts.emplace_back([&, t] {
        cudaSetDevice(0);
        f(a(512, streams[t]), streams[t]);  // warm
        double t0 = now_ns();
        for (int i = 0; i < iters; ++i) f(a(512, streams[t]), streams[t]);
        per[t] = (now_ns() - t0) / iters;
      });
    }
    for (auto& th : ts) th.join();
    r.push_back(*std::max_element(per.begin(), per.end()));
  }
  return median(r);
}

int main(int argc, char** argv) {
  int iters = argc > 1 ? std::atoi(argv[1]) : 200000;
  int repeats = argc > 2 ? std::atoi(argv[2]) : 7;
  cudaSetDevice(0);
  cudaFree(nullptr);  // create the primary context
  c10::cuda::CUDACachingAllocator::init(1);

  Alloc torch_a = [](size_t n) { return c10::cuda::CUDACachingAllocator::raw_alloc(n); };
  Free torch_f = [](void* p) { c10::cuda::CUDACachingAllocator::raw_delete(p); };
  Alloc async_a = [](size_t n) {
    CUdeviceptr p;
    check(cuMemAllocAsync(&p, n, nullptr), "cuMemAllocAsync");
    return (void*)p;
  };
  Free async_f = [](void* p) { check(cuMemFreeAsync((CUdeviceptr)p, nullptr), "cuMemFreeAsync"); };
  Alloc sync_a = [](size_t n) {
    CUdeviceptr p;
    check(cuMemAlloc(&p, n), "cuMemAlloc");
    return (void*)p;
  };
  Free sync_f = [](void* p) { check(cuMemFree((CUdeviceptr)p), "cuMemFree"); };

  if (argc > 3 && std::string(argv[3]) == "mixed") {
    report("pytorch_c10", "mixed_1000_live", mixed(torch_a, torch_f, iters, repeats));
    return 0;
  }

  const size_t sizes[] = {512, 1 << 20, 64 << 20};
  const char* names[] = {"hot/512", "hot/1048576", "hot/67108864"};
  for (int s = 0; s < 3; ++s) {
    report("pytorch_c10", names[s], hot(torch_a, torch_f, sizes[s], iters, repeats));
    report("cuMemAllocAsync", names[s], hot(async_a, async_f, sizes[s], iters, repeats));
    report("cuMemAlloc", names[s], hot(sync_a, sync_f, sizes[s], iters / 200 + 1, repeats));
  }
  report("pytorch_c10", "mixed_1000_live", mixed(torch_a, torch_f, iters, repeats));
  report("cuMemAllocAsync", "mixed_1000_live", mixed(async_a, async_f, iters, repeats));
  report("cuMemAlloc", "mixed_1000_live", mixed(sync_a, sync_f, iters / 200 + 1, repeats));

  std::vector<CUstream> streams(8);
  for (auto& s : streams) check(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  auto torch_sa = [](size_t n, CUstream s) {
    return c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(n, reinterpret_cast<cudaStream_t>(s));
  };
  auto torch_sf = [](void* p, CUstream) { c10::cuda::CUDACachingAllocator::raw_delete(p); };
  auto async_sa = [](size_t n, CUstream s) {
    CUdeviceptr p;
    check(cuMemAllocAsync(&p, n, s), "cuMemAllocAsync");
    return (void*)p;
  };
  auto async_sf = [](void* p, CUstream s) { check(cuMemFreeAsync((CUdeviceptr)p, s), "cuMemFreeAsync"); };
  report("pytorch_c10", "threads8/hot_512_per_stream", threads8(torch_sa, torch_sf, streams, iters / 4, repeats));
  report("cuMemAllocAsync", "threads8/hot_512_per_stream", threads8(async_sa, async_sf, streams, iters / 4, repeats));
  cudaDeviceSynchronize();
  return 0;
}
