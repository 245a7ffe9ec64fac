// The batch-1 FP8 GEMV's weight access pattern, measured alone (issue 38; BENCHMARKS.md,
// thirty-second session): each CTA of 256 threads reads one 16-row tile of R row sets (gate_up:
// R = 2) of a row-major [R n, k] e4m3 weight, 16 16-byte loads in flight a lane in two halves as
// Fp8W16MmaKernelDeep keeps them, 2 CTAs an SM, copies past the L2 in turn, CUDA graphs of 60
// launches (with and without PDL). The three layouts of a lane's i-th load:
//   w16 (8x64B)      Fp8W16MmaKernel's: rows lane / 4 (+ 8), chunk warp * 4 + lane % 4 + 32 u:
//                    a warp load is 8 rows x 64 bytes;
//   8x128B->4rows    kTensorCoreWide's: 8 lanes a row, chunk warp * 8 + lane % 8 + 64 u: 4 rows x
//                    128 bytes;
//   row512B          the tile read in order (a warp's 512 bytes contiguous), as a packed layout
//                    would.
// compute=1 adds the W16 kernel's arithmetic on whatever was loaded (e4m3 -> f16 conversions and
// mma.sync against f16 activations in shared memory), so the instruction mix is the kernel's.
// Prints us a call and TB/s for Llama-3-8B's gate_up / down / qkv / o.
//
//   w16_read_pattern_bench      (no flags)
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                           \
  do {                                                                                  \
    cudaError_t e = (x);                                                                \
    if (e != cudaSuccess) {                                                             \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)

__device__ __forceinline__ uint32_t Word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}
__device__ __forceinline__ void Cvt(uint32_t q, uint32_t& lo, uint32_t& hi) {
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\n"
      "cvt.rn.f16x2.e4m3x2 %1, h;\n}"
      : "=r"(lo), "=r"(hi)
      : "r"(q));
}
__device__ __forceinline__ void Mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                    uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

struct P {
  const uint8_t* w;
  int64_t n, k;
  uint32_t* sink;
};

template <int MODE, int R>
__device__ __forceinline__ int64_t Offset(const P& p, int i, int lane, int warp) {
  const int64_t row0 = int64_t{blockIdx.x} * 16;
  if constexpr (MODE == 0) {
    const int u = i / (2 * R), r = (i % (2 * R)) / 2, h = i % 2;
    const int64_t row = r * p.n + row0 + lane / 4 + 8 * h;
    const int64_t chunk = warp * 4 + lane % 4 + 32 * u;
    return row * p.k + chunk * 16;
  } else if constexpr (MODE == 2) {
    const int u = i / (4 * R), r = (i % (4 * R)) / 4, h = i % 4;
    const int64_t row = r * p.n + row0 + lane / 8 + 4 * h;
    const int64_t chunk = warp * 8 + lane % 8 + 64 * u;
    return row * p.k + chunk * 16;
  } else {
    const int r = i % R, j = i / R;  // the set's 16 rows are 16 k contiguous bytes
    return (r * p.n + row0) * p.k + (int64_t{j} * 256 + warp * 32 + lane) * 16;
  }
}

template <int MODE, int R, int F, bool COMPUTE, bool PDL>
__global__ void __launch_bounds__(256, 2) Read(P p) {
  extern __shared__ uint4 act[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int loads = static_cast<int>(16 * R * p.k / (256 * 16));  // a lane's 16-byte loads
  uint4 buf[F];
#pragma unroll
  for (int j = 0; j < F; ++j) {
    buf[j] = j < loads
                 ? __ldcs(reinterpret_cast<const uint4*>(p.w + Offset<MODE, R>(p, j, lane, warp)))
                 : make_uint4(0, 0, 0, 0);
  }
  if constexpr (PDL) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;");
  }
  if constexpr (COMPUTE) {
    for (int i = threadIdx.x; i < p.k / 8; i += 256) act[i] = make_uint4(0x3c003c00u, i, 0x3c00, 1);
    __syncthreads();
  }
  uint32_t x = 0;
  float acc[4] = {0, 0, 0, 0};
  constexpr int H = F / 2;
  for (int base = 0; base < loads; base += F) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
#pragma unroll
      for (int j = 0; j < H; ++j) {
        const int s = half * H + j;
        if (base + s < loads) {
          const uint4 v = buf[s];
          if constexpr (COMPUTE) {
            // every two loads are rows g / g + 8 of one group: 4 mma
            if (s % 2 == 1) {
              const uint4 v0 = buf[s - 1];
              const int c = (warp * 4 + lane % 4 + 32 * ((base + s) / 4)) % (p.k / 16);
              const uint4 b0 = act[2 * c], b1 = act[2 * c + 1];
#pragma unroll
              for (int q = 0; q < 4; ++q) {
                uint32_t a0, a1, a2, a3;
                Cvt(Word(v0, q), a0, a2);
                Cvt(Word(v, q), a1, a3);
                const uint4& b = q < 2 ? b0 : b1;
                Mma(acc, a0, a1, a2, a3, Word(b, (2 * q) & 3), Word(b, (2 * q + 1) & 3));
              }
            }
          } else {
            x ^= v.x ^ v.y ^ v.z ^ v.w;
          }
        }
      }
#pragma unroll
      for (int j = 0; j < H; ++j) {
        const int s = half * H + j;
        const int nx = base + F + s;
        if (nx < loads) {
          buf[s] = __ldcs(reinterpret_cast<const uint4*>(p.w + Offset<MODE, R>(p, nx, lane, warp)));
        }
      }
    }
  }
  x ^= __float_as_uint(acc[0] + acc[1] + acc[2] + acc[3]);
  if (x == 0x9e3779b9u) p.sink[threadIdx.x] = x;
}

template <int MODE, int R, int F, bool COMPUTE, bool PDL>
float Time(const std::vector<uint8_t*>& bufs, int64_t n, int64_t k, uint32_t* sink, int iters) {
  auto kernel = Read<MODE, R, F, COMPUTE, PDL>;
  const size_t smem = COMPUTE ? k * 2 : 0;
  if (smem > 48 * 1024)
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(n / 16));
  cfg.blockDim = dim3(256);
  cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = PDL ? 1 : 0;
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  cfg.stream = st;
  cudaGraph_t g;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < iters; ++i) {
    P p{bufs[i % bufs.size()], n, k, sink};
    CK(cudaLaunchKernelEx(&cfg, kernel, p));
  }
  CK(cudaStreamEndCapture(st, &g));
  cudaGraphExec_t ge;
  CK(cudaGraphInstantiate(&ge, g, 0));
  CK(cudaGraphLaunch(ge, st));
  CK(cudaStreamSynchronize(st));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  float best = 1e30f;
  for (int rep = 0; rep < 3; ++rep) {
    CK(cudaEventRecord(a, st));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    best = std::min(best, ms * 1000.0f / iters);
  }
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  CK(cudaStreamDestroy(st));
  return best;
}

template <int R, int F, bool COMPUTE, bool PDL>
void Shape(const char* name, int64_t n, int64_t k, uint32_t* sink) {
  const int64_t bytes = R * n * k;
  const int copies = static_cast<int>(std::max<int64_t>(2, (512LL << 20) / bytes + 1));
  std::vector<uint8_t*> bufs(copies);
  for (auto& b : bufs) {
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemset(b, 0x38, bytes));  // e4m3 1.0
  }
  const int iters = 60;
  float t[3];
  for (int round = 0; round < 2; ++round) {
    t[0] = Time<0, R, F, COMPUTE, PDL>(bufs, n, k, sink, iters);
    t[1] = Time<2, R, F, COMPUTE, PDL>(bufs, n, k, sink, iters);
    t[2] = Time<3, R, F, COMPUTE, PDL>(bufs, n, k, sink, iters);
    printf(
        "%-8s R=%d F=%2d compute=%d pdl=%d  %6.1f MB  us: w16(8x64B) %6.2f (%4.2f TB/s)  "
        "8x128B->4rows %6.2f (%4.2f)  row512B %6.2f (%4.2f)\n",
        name, R, F, COMPUTE, PDL, bytes / 1e6, t[0], bytes / t[0] / 1e6, t[1], bytes / t[1] / 1e6,
        t[2], bytes / t[2] / 1e6);
  }
  for (auto b : bufs) CK(cudaFree(b));
}

template <bool COMPUTE, bool PDL>
void All(uint32_t* sink) {
  Shape<2, 16, COMPUTE, PDL>("gate_up", 14336, 4096, sink);
  Shape<1, 16, COMPUTE, PDL>("down", 4096, 14336, sink);
  Shape<1, 16, COMPUTE, PDL>("qkv", 6144, 4096, sink);
  Shape<1, 16, COMPUTE, PDL>("o", 4096, 4096, sink);
}

int main() {
  uint32_t* sink;
  CK(cudaMalloc(&sink, 4096));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("%s, %d SMs\n", prop.name, prop.multiProcessorCount);
  All<false, false>(sink);
  All<false, true>(sink);
  All<true, false>(sink);
  All<true, true>(sink);
  Shape<2, 32, false, true>("gate_up", 14336, 4096, sink);
  Shape<2, 8, false, true>("gate_up", 14336, 4096, sink);
  return 0;
}
