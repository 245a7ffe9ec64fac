#include "runtime/cuda/step_breakdown.h"

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

}  // namespace
}  // namespace tandem::runtime::cuda
