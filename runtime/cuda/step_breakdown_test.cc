#include "runtime/cuda/step_breakdown.h"

#include <algorithm>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::runtime::cuda {
namespace {

// Demangled names as CUPTI + abi::__cxa_demangle give them.
constexpr char kEmbed[] =
    "void tandem::kernels::cuda::(anonymous namespace)::EmbeddingKernel<__nv_bfloat16>(long "
    "const*, long, __nv_bfloat16 const*, long, long, long, __nv_bfloat16*)";
constexpr char kGemv[] =
    "void tandem::kernels::cuda::(anonymous namespace)::SmallMLinearKernel<__nv_bfloat16, "
    "__nv_bfloat16, 1, 1>(__nv_bfloat16 const*, __nv_bfloat16 const*, __nv_bfloat16 const*, "
    "long, long, __nv_bfloat16*)";
constexpr char kGateUp[] =
    "void tandem::kernels::cuda::(anonymous namespace)::SmallMLinearKernel<__nv_bfloat16, "
    "__nv_bfloat16, 1, 2>(__nv_bfloat16 const*, __nv_bfloat16 const*, __nv_bfloat16 const*, "
    "long, long, __nv_bfloat16*)";
constexpr char kLmHead[] =
    "void tandem::kernels::cuda::(anonymous namespace)::SmallMLinearKernel<__nv_bfloat16, float, "
    "1, 1>(__nv_bfloat16 const*, __nv_bfloat16 const*, __nv_bfloat16 const*, long, long, float*)";
// The folded kernels' names (their Fold argument printed as a cast) and the qkv + RoPE kernel.
constexpr char kFoldedGateUp[] =
    "void tandem::kernels::cuda::(anonymous namespace)::SmallMLinearKernel<__nv_bfloat16, "
    "__nv_bfloat16, 1, 2, (tandem::kernels::cuda::(anonymous namespace)::Fold)1>(__nv_bfloat16 "
    "const*, __nv_bfloat16 const*, __nv_bfloat16 const*, long, long, __nv_bfloat16*, "
    "__nv_bfloat16 const*, float)";
constexpr char kFoldedAdd[] =
    "void tandem::kernels::cuda::(anonymous namespace)::SmallMLinearKernel<__nv_bfloat16, "
    "__nv_bfloat16, 1, 1, (tandem::kernels::cuda::(anonymous namespace)::Fold)2>(__nv_bfloat16 "
    "const*, __nv_bfloat16 const*, __nv_bfloat16 const*, long, long, __nv_bfloat16*, "
    "__nv_bfloat16 const*, float)";
constexpr char kQkvRope[] =
    "void tandem::kernels::cuda::(anonymous namespace)::SmallMLinearNormInRopeKvKernel<"
    "__nv_bfloat16, 1>(__nv_bfloat16 const*, __nv_bfloat16 const*, __nv_bfloat16 const*, long, "
    "__nv_bfloat16 const*, float, tandem::kernels::cuda::GemvRopeKv)";
constexpr char kFused[] =
    "void tandem::comm::(anonymous namespace)::AddNormKernel<__nv_bfloat16, 4, 2>(tandem::comm::"
    "(anonymous namespace)::ArParams, tandem::comm::(anonymous namespace)::ArNormParams<"
    "__nv_bfloat16>)";
constexpr char kRope[] =
    "void tandem::kernels::cuda::(anonymous namespace)::RopeQkvToCacheKernel<__nv_bfloat16>(int)";
constexpr char kAttn[] =
    "void tandem::kernels::cuda::(anonymous namespace)::PagedDecodeKernel<__nv_bfloat16, 128, "
    "4>(tandem::kernels::cuda::(anonymous namespace)::DecodeParams)";
constexpr char kSample[] = "void tandem::kernels::cuda::SampleRowKernel(float const*, int)";

constexpr char kW16GateUp[] =
    "void tandem::kernels::cuda::(anonymous namespace)::Fp8W16Kernel<__nv_bfloat16, 2, "
    "(tandem::kernels::cuda::(anonymous namespace)::Fold)1>(tandem::kernels::cuda::(anonymous "
    "namespace)::Args, __nv_bfloat16*)";
constexpr char kW16AddTo[] =
    "void tandem::kernels::cuda::(anonymous namespace)::Fp8W16Kernel<__nv_bfloat16, 1, "
    "(tandem::kernels::cuda::(anonymous namespace)::Fold)2>(tandem::kernels::cuda::(anonymous "
    "namespace)::Args, __nv_bfloat16*)";

constexpr char kW16MmaGateUp[] =
    "void tandem::kernels::cuda::(anonymous namespace)::Fp8W16MmaKernel<__nv_bfloat16, 2, "
    "(tandem::kernels::cuda::(anonymous namespace)::Fold)1>(tandem::kernels::cuda::(anonymous "
    "namespace)::Args, __nv_bfloat16*)";

constexpr char kW16RingGateUp[] =
    "void tandem::kernels::cuda::fp8_w16_internal::(anonymous namespace)::Fp8W16RingKernel<"
    "__nv_bfloat16, 2, (tandem::kernels::cuda::fp8_w16_internal::Fold)1>(tandem::kernels::cuda::"
    "fp8_w16_internal::Args, int, __nv_bfloat16*)";
constexpr char kW16RingAddTo[] =
    "void tandem::kernels::cuda::fp8_w16_internal::(anonymous namespace)::Fp8W16RingKernel<"
    "__nv_bfloat16, 1, (tandem::kernels::cuda::fp8_w16_internal::Fold)2>(tandem::kernels::cuda::"
    "fp8_w16_internal::Args, int, __nv_bfloat16*)";

constexpr char kW16WideLmHead[] =
    "void tandem::kernels::cuda::fp8_w16_internal::(anonymous namespace)::Fp8W16MmaKernelWide<"
    "float, 1, (tandem::kernels::cuda::fp8_w16_internal::Fold)0, false>(tandem::kernels::cuda::"
    "fp8_w16_internal::Args, float*)";

TEST(StepBreakdownTest, WeightOnlyFp8GemvsFollowTheLayerOrder) {
  // An FP8 lm_head (fp32 logits) wherever it runs.
  EXPECT_EQ(KernelClass(kW16WideLmHead, "gather logit rows"), "fp8 w8a16 gemv lm_head");
  EXPECT_EQ(KernelClass(kW16AddTo, "embedding"), "fp8 w8a16 gemv qkv");
  EXPECT_EQ(KernelClass(kW16AddTo, "attention"), "fp8 w8a16 gemv o_proj");
  EXPECT_EQ(KernelClass(kW16GateUp, "fp8 w8a16 gemv o_proj"), "fp8 w8a16 gemv gate_up + silu");
  EXPECT_EQ(KernelClass(kW16AddTo, "fp8 w8a16 gemv gate_up + silu"), "fp8 w8a16 gemv down_proj");
  // The tensor-core inner loop (Fp8W16Math::kTensorCore) classes the same.
  EXPECT_EQ(KernelClass(kW16MmaGateUp, "fp8 w8a16 gemv o_proj"), "fp8 w8a16 gemv gate_up + silu");
  // And the ring forms (Fp8W16Math::kRing*).
  EXPECT_EQ(KernelClass(kW16RingAddTo, "attention"), "fp8 w8a16 gemv o_proj");
  EXPECT_EQ(KernelClass(kW16RingGateUp, "fp8 w8a16 gemv o_proj"), "fp8 w8a16 gemv gate_up + silu");
  EXPECT_EQ(KernelClass(kW16RingAddTo, "fp8 w8a16 gemv gate_up + silu"),
            "fp8 w8a16 gemv down_proj");
}

TEST(StepBreakdownTest, ClassesFollowTheLayerOrder) {
  EXPECT_EQ(KernelClass(kGemv, "all-reduce + add + norm (fused)"), "gemv qkv");
  EXPECT_EQ(KernelClass(kGemv, "attention"), "gemv o_proj");
  EXPECT_EQ(KernelClass(kGemv, "gemv gate_up + silu"), "gemv down_proj");
  EXPECT_EQ(KernelClass(kGateUp, "rmsnorm (+ add)"), "gemv gate_up + silu");
  EXPECT_EQ(KernelClass(kLmHead, "gather logit rows"), "gemv lm_head");
  EXPECT_EQ(KernelClass(kFused, "gemv o_proj"), "all-reduce + add + norm (fused)");
  EXPECT_EQ(KernelClass(kAttn, "rope + KV write"), "attention");
  EXPECT_EQ(KernelClass("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage)", ""),
            "NCCL");
  EXPECT_EQ(KernelClass("void foo::(anonymous namespace)::Mystery<int>(int)", ""),
            "other: Mystery");
  EXPECT_EQ(KernelClass("SmallMLinearKernel", ""), "gemv qkv");  // no template arguments
  EXPECT_EQ(KernelClass(kFoldedGateUp, "gemv o_proj"), "gemv gate_up + silu");
  EXPECT_EQ(KernelClass(kFoldedAdd, "attention"), "gemv o_proj");
  EXPECT_EQ(KernelClass(kFoldedAdd, "gemv gate_up + silu"), "gemv down_proj");
  EXPECT_EQ(KernelClass(kQkvRope, "gemv down_proj"), "gemv qkv + rope + KV write");
  EXPECT_EQ(KernelClass("void nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NTN(CUtensorMap_st)", ""),
            "cuBLAS GEMM");
}

// Two steps of one layer, 1 us per kernel unless said: times add up per class, the PDL overlap
// of two kernels counts once in busy time, gaps before the embedding are between steps.
TEST(StepBreakdownTest, TimesPerClassBusyAndGaps) {
  std::vector<KernelRecord> records;
  uint64_t t = 1000;
  auto add = [&](const char* name, uint64_t gap_ns, uint64_t ns) {
    t += gap_ns;
    records.push_back({name, t, t + ns, 1, 32});
    t += ns;
  };
  for (int step = 0; step < 2; ++step) {
    add(kEmbed, step == 0 ? 0 : 5000, 1000);  // 5 us of host time before step 1
    add(kFused, 0, 3000);
    add(kGemv, 200, 2000);  // qkv, 0.2 us gap
    add(kRope, 0, 1000);
    add(kAttn, 0, 4000);
    add(kGemv, 0, 2000);  // o_proj
    add(kFused, 0, 3000);
    add(kGateUp, 0, 6000);
    records.push_back({kGemv, t - 500, t + 3000, 1, 32});  // down_proj, PDL: 0.5 us overlap
    t += 3000;
    add(kLmHead, 0, 2000);
    add(kSample, 300, 1000);
  }
  const StepBreakdown b = BreakDownSteps(records, 2);
  auto find = [&](const std::string& name) {
    for (const KernelClassTime& c : b.classes) {
      if (c.name == name) return c;
    }
    ADD_FAILURE() << "no class " << name;
    return KernelClassTime{};
  };
  EXPECT_EQ(find("all-reduce + add + norm (fused)").calls, 4);
  EXPECT_DOUBLE_EQ(find("all-reduce + add + norm (fused)").total_us, 12.0);
  EXPECT_EQ(find("gemv qkv").calls, 2);
  EXPECT_EQ(find("gemv o_proj").calls, 2);
  EXPECT_DOUBLE_EQ(find("gemv down_proj").total_us, 7.0);
  EXPECT_DOUBLE_EQ(find("gemv down_proj").exclusive_us, 6.0);  // less its 0.5 us PDL wait
  EXPECT_DOUBLE_EQ(find("gemv gate_up + silu").exclusive_us, 12.0);
  EXPECT_DOUBLE_EQ(find("gemv lm_head").total_us, 4.0);
  EXPECT_DOUBLE_EQ(find("attention").total_us, 8.0);
  double exclusive = 0.0;
  for (size_t i = 0; i < b.classes.size(); ++i) {  // the largest first
    if (i > 0) {
      EXPECT_GE(b.classes[i - 1].exclusive_us, b.classes[i].exclusive_us);
    }
    exclusive += b.classes[i].exclusive_us;
  }
  // Per step: 28.5 us of kernels, 0.5 of them overlapped; 0.5 us of gaps inside each step and
  // 5 us before the second step's embedding.
  EXPECT_DOUBLE_EQ(b.kernel_us, 57.0);
  EXPECT_DOUBLE_EQ(b.busy_us, 56.0);
  EXPECT_DOUBLE_EQ(exclusive, b.busy_us);  // exclusive times partition the busy time
  EXPECT_DOUBLE_EQ(b.idle_within_steps_us, 1.0);
  EXPECT_DOUBLE_EQ(b.idle_between_steps_us, 5.0);
  EXPECT_DOUBLE_EQ(b.span_us, 62.0);
  const std::string table = FormatBreakdown(b, 0.031);
  EXPECT_NE(table.find("gemv down_proj"), std::string::npos) << table;
  EXPECT_NE(table.find("GPU idle between kernels"), std::string::npos) << table;
  EXPECT_TRUE(BreakDownSteps({}, 3).classes.empty());
}

// Three steps with their host events: each boundary's gap is split at the DtoH copy's end, the
// successful synchronising call, the next cudaMemcpyAsync, cudaGraphLaunch and the first kernel;
// polls that returned "not ready" (600) and the previous step's own DtoH cudaMemcpyAsync call
// are not marks; copies and calls do not count as kernels in BreakDownSteps.
TEST(StepBreakdownTest, HostGapsSplitAtTheCopiesAndCalls) {
  using Kind = KernelRecord::Kind;
  std::vector<KernelRecord> r;
  auto api = [&](const char* name, uint64_t from, uint64_t to, uint32_t result = 0) {
    r.push_back({name, from, to, 0, 0, Kind::kApi, result});
  };
  uint64_t t = 10000;
  for (int step = 0; step < 3; ++step) {
    api("cudaMemcpyAsync_v3020", t, t + 1000);  // metadata upload call
    r.push_back({"memcpy HtoD", t + 1500, t + 2000, 0, 0, Kind::kMemcpy});
    api("cudaGraphLaunch_v10000", t + 3000, t + 5000);
    api("cudaMemcpyAsync_v3020", t + 5500, t + 6000);  // the DtoH call, issued at once
    r.push_back({kEmbed, t + 9000, t + 10000, 1, 32});
    r.push_back({kGemv, t + 10000, t + 30000, 1, 32});
    r.push_back({"memcpy DtoH", t + 30500, t + 31500, 0, 0, Kind::kMemcpy});
    api("cudaEventQuery_v3020", t + 30000, t + 31000, 600);  // not ready
    api("cudaEventQuery_v3020", t + 31200, t + 33500);       // sees it
    t += 40000;  // the next upload call 6.5 us after the host saw the step
  }
  std::sort(r.begin(), r.end(),
            [](const KernelRecord& a, const KernelRecord& b) { return a.start_ns < b.start_ns; });
  const HostGapBreakdown g = BreakDownHostGaps(r);
  EXPECT_EQ(g.gaps, 2);
  // Per boundary: kernels end at +30 us, the next embedding starts at +49 us: 19 us idle.
  EXPECT_DOUBLE_EQ(g.total_us, 38.0);
  EXPECT_DOUBLE_EQ(g.copy_out_us, 3.0);          // DtoH done at +31.5
  EXPECT_DOUBLE_EQ(g.wake_us, 4.0);              // the successful query returns at +33.5
  EXPECT_DOUBLE_EQ(g.host_us, 13.0);             // next upload call at +40
  EXPECT_DOUBLE_EQ(g.upload_us, 6.0);            // cudaGraphLaunch at +43
  EXPECT_DOUBLE_EQ(g.launch_call_us, 4.0);       // returns at +45
  EXPECT_DOUBLE_EQ(g.launch_to_kernel_us, 8.0);  // the embedding at +49
  EXPECT_DOUBLE_EQ(g.unresolved_us, 0.0);
  EXPECT_NE(FormatHostGaps(g).find("cudaGraphLaunch"), std::string::npos);
  const StepBreakdown b = BreakDownSteps(r, 3);
  EXPECT_DOUBLE_EQ(b.kernel_us, 63.0);  // kernels only
  EXPECT_DOUBLE_EQ(b.idle_between_steps_us, 38.0);
  // Without host events the whole gap is unresolved.
  std::vector<KernelRecord> kernels;
  for (const KernelRecord& k : r) {
    if (k.kind == Kind::kKernel) kernels.push_back(k);
  }
  const HostGapBreakdown bare = BreakDownHostGaps(kernels);
  EXPECT_DOUBLE_EQ(bare.unresolved_us, 38.0);
  EXPECT_DOUBLE_EQ(bare.total_us, 38.0);
}

}  // namespace
}  // namespace tandem::runtime::cuda
