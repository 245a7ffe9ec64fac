#include "runtime/cuda/step_breakdown.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_format.h"

namespace tandem::runtime::cuda {
namespace {

bool Has(std::string_view name, std::string_view part) {
  return name.find(part) != std::string_view::npos;
}

// "void ns::(anonymous namespace)::Kernel<...>(args)" -> "Kernel".
std::string ShortName(std::string_view full) {
  std::string name(full);
  constexpr std::string_view kAnon = "(anonymous namespace)::";
  for (size_t at; (at = name.find(kAnon)) != std::string::npos;) name.erase(at, kAnon.size());
  std::string_view head(name);
  head = head.substr(0, head.find_first_of("<("));
  const size_t colon = head.rfind("::");
  if (colon != std::string_view::npos) head = head.substr(colon + 2);
  const size_t space = head.rfind(' ');
  if (space != std::string_view::npos) head = head.substr(space + 1);
  return std::string(head);
}

}  // namespace

std::string KernelClass(std::string_view name, std::string_view previous) {
  if (Has(name, "AddNormKernel")) return "all-reduce + add + norm (fused)";
  if (Has(name, "OneShotKernel") || Has(name, "TwoShotKernel")) return "all-reduce (custom)";
  if (Has(name, "nccl") || Has(name, "NCCL")) return "NCCL";
  if (Has(name, "SmallMLinearKernel")) {
    // SmallMLinearKernel<T, TOut, M, kRows>: kRows 2 is gate_up with SiLU*up; TOut float is
    // the logits.
    const size_t open = name.find('<');
    const std::string_view args =
        open == std::string_view::npos ? std::string_view() : name.substr(open);
    const std::string_view targs = args.substr(0, args.find('>') + 1);
    if (targs.ends_with(", 2>")) return "gemv gate_up + silu";
    if (targs.substr(targs.find(',') + 1).starts_with(" float")) return "gemv lm_head";
    if (previous == "attention") return "gemv o_proj";
    if (previous == "gemv gate_up + silu") return "gemv down_proj";
    return "gemv qkv";
  }
  if (Has(name, "gemm") || Has(name, "Gemm") || Has(name, "cutlass") || Has(name, "xmma")) {
    return "cuBLAS GEMM";
  }
  if (Has(name, "PagedDecode") || Has(name, "Splits") || Has(name, "Prefill") ||
      Has(name, "MergeKernel") || Has(name, "MergeNKernel")) {
    return "attention";
  }
  if (Has(name, "Rope")) return "rope + KV write";
  if (Has(name, "RmsNorm")) return "rmsnorm (+ add)";
  if (Has(name, "EmbeddingKernel")) return "embedding";
  if (Has(name, "RowMax") || Has(name, "SampleRow") || Has(name, "PickKernel") ||
      Has(name, "ShardArgmax")) {
    return "sampling";
  }
  if (Has(name, "GatherKernel")) return "gather logit rows";
  return "other: " + ShortName(name);
}

StepBreakdown BreakDownSteps(const std::vector<KernelRecord>& records, int steps) {
  StepBreakdown out;
  out.steps = steps;
  if (records.empty()) return out;
  std::map<std::string, KernelClassTime> by_class;
  std::string previous;
  uint64_t busy_from = records[0].start_ns, busy_to = records[0].start_ns;
  double busy_ns = 0.0;
  uint64_t last_end = 0;
  for (const KernelRecord& r : records) {
    const std::string c = KernelClass(r.name, previous);
    KernelClassTime& t = by_class[c];
    t.name = c;
    ++t.calls;
    const uint64_t end = std::max(r.end_ns, r.start_ns);
    t.total_us += static_cast<double>(end - r.start_ns) / 1e3;
    out.kernel_us += static_cast<double>(end - r.start_ns) / 1e3;
    const uint64_t own_from = std::max(r.start_ns, last_end);
    if (end > own_from) t.exclusive_us += static_cast<double>(end - own_from) / 1e3;
    // Union of the intervals (sorted by start): extend the current busy run or close it.
    if (r.start_ns > busy_to) {
      busy_ns += static_cast<double>(busy_to - busy_from);
      const double gap_us = static_cast<double>(r.start_ns - busy_to) / 1e3;
      (c == "embedding" ? out.idle_between_steps_us : out.idle_within_steps_us) += gap_us;
      busy_from = r.start_ns;
    }
    busy_to = std::max(busy_to, end);
    last_end = std::max(last_end, end);
    previous = c;
  }
  busy_ns += static_cast<double>(busy_to - busy_from);
  out.busy_us = busy_ns / 1e3;
  out.span_us = static_cast<double>(last_end - records[0].start_ns) / 1e3;
  for (auto& [name, t] : by_class) out.classes.push_back(t);
  std::sort(out.classes.begin(), out.classes.end(),
            [](const KernelClassTime& a, const KernelClassTime& b) {
              return a.exclusive_us > b.exclusive_us;
            });
  return out;
}

std::string FormatBreakdown(const StepBreakdown& b, double step_ms) {
  const double steps = b.steps > 0 ? b.steps : 1;
  const double step_us = step_ms * 1e3;
  auto share = [&](double us) { return step_us > 0 ? 100.0 * us / step_us : 0.0; };
  std::string out = absl::StrFormat("  %-34s %9s %11s %11s %8s\n", "kernel class", "calls/st",
                                    "us/step", "excl us/st", "% step");
  for (const KernelClassTime& c : b.classes) {
    absl::StrAppendFormat(&out, "  %-34s %9.1f %11.1f %11.1f %7.1f%%\n", c.name, c.calls / steps,
                          c.total_us / steps, c.exclusive_us / steps,
                          share(c.exclusive_us / steps));
  }
  auto line = [&](const char* what, double us) {
    absl::StrAppendFormat(&out, "  %-34s %9s %11s %11.1f %7.1f%%\n", what, "", "", us / steps,
                          share(us / steps));
  };
  line("sum of kernel durations", b.kernel_us);
  line("GPU busy (some kernel running)", b.busy_us);
  line("GPU idle between kernels", b.idle_within_steps_us);
  line("GPU idle before a step's first", b.idle_between_steps_us);
  return out;
}

}  // namespace tandem::runtime::cuda
