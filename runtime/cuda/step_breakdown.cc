#include "runtime/cuda/step_breakdown.h"

#include <algorithm>
#include <map>
#include <vector>

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

// "Kernel<a, b, c>(...)" -> {"a", "b", "c"} (empty without template arguments).
std::vector<std::string_view> TemplateArgs(std::string_view name) {
  std::vector<std::string_view> targs;
  const size_t open = name.find('<');
  if (open == std::string_view::npos) return targs;
  for (std::string_view rest = name.substr(open + 1, name.find('>') - open - 1);;) {
    const size_t comma = rest.find(", ");
    targs.push_back(rest.substr(0, comma));
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 2);
  }
  return targs;
}

// The projection of a batch-1 GEMV by its place in the layer (`prefix` + qkv, o_proj, down_proj;
// gate_up when `gate_up`).
std::string GemvClass(std::string_view prefix, bool gate_up, std::string_view previous) {
  const std::string p(prefix), gate_up_class = p + "gate_up + silu";
  if (gate_up) return gate_up_class;
  if (previous == "attention") return p + "o_proj";
  if (previous == gate_up_class) return p + "down_proj";
  return p + "qkv";
}

}  // namespace

std::string KernelClass(std::string_view name, std::string_view previous) {
  if (Has(name, "AddNormKernel")) return "all-reduce + add + norm (fused)";
  if (Has(name, "OneShotKernel") || Has(name, "TwoShotKernel")) return "all-reduce (custom)";
  if (Has(name, "nccl") || Has(name, "NCCL")) return "NCCL";
  if (Has(name, "SmallMLinearNormInRopeKvKernel")) return "gemv qkv + rope + KV write";
  if (Has(name, "SmallMLinearKernel")) {
    // SmallMLinearKernel<T, TOut, M, kRows[, Fold]> (kernels/gemm/cuda/gemv_cuda.cu): kRows 2 is
    // gate_up with SiLU*up; TOut float is the logits.
    const std::vector<std::string_view> targs = TemplateArgs(name);
    if (targs.size() >= 2 && targs[1] == "float") return "gemv lm_head";
    return GemvClass("gemv ", targs.size() >= 4 && targs[3] == "2", previous);
  }
  if (Has(name, "Fp8W16Kernel") || Has(name, "Fp8W16MmaKernel") || Has(name, "Fp8W16RingKernel")) {
    // Fp8W16[Mma|Ring]Kernel<TOut, R, Fold> (kernels/fp8/fp8_w8a16_gemv_cuda.cu,
    // fp8_w8a16_ring_cuda.cu): R 2 is gate_up + SiLU; TOut float is an FP8 lm_head's logits.
    const std::vector<std::string_view> targs = TemplateArgs(name);
    if (!targs.empty() && targs[0] == "float") return "fp8 w8a16 gemv lm_head";
    return GemvClass("fp8 w8a16 gemv ", targs.size() >= 2 && targs[1] == "2", previous);
  }
  if (Has(name, "gemm") || Has(name, "Gemm") || Has(name, "cutlass") || Has(name, "xmma") ||
      Has(name, "nvjet")) {
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
  uint64_t first = records[0].start_ns;
  for (const KernelRecord& r : records) {
    if (r.kind == KernelRecord::Kind::kKernel) {
      first = r.start_ns;
      break;
    }
  }
  uint64_t busy_from = first, busy_to = first;
  double busy_ns = 0.0;
  uint64_t last_end = 0;
  for (const KernelRecord& r : records) {
    if (r.kind != KernelRecord::Kind::kKernel) continue;
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
      // (the first record may be a copy or a call: the span starts at the first kernel's start)
      const double gap_us = static_cast<double>(r.start_ns - busy_to) / 1e3;
      (c == "embedding" ? out.idle_between_steps_us : out.idle_within_steps_us) += gap_us;
      busy_from = r.start_ns;
    }
    busy_to = std::max(busy_to, end);
    last_end = std::max(last_end, end);
    previous = c;
  }
  busy_ns += static_cast<double>(busy_to - busy_from);
  // (the first record may be a copy or a call: the span starts at the first kernel's start)
  out.busy_us = busy_ns / 1e3;
  out.span_us = static_cast<double>(last_end - first) / 1e3;
  for (auto& [name, t] : by_class) out.classes.push_back(t);
  std::sort(out.classes.begin(), out.classes.end(),
            [](const KernelClassTime& a, const KernelClassTime& b) {
              return a.exclusive_us > b.exclusive_us;
            });
  return out;
}

namespace {

bool IsSyncCall(const KernelRecord& r) {
  return r.kind == KernelRecord::Kind::kApi &&
         (r.name.starts_with("cudaEventQuery") || r.name.starts_with("cudaStreamSynchronize") ||
          r.name.starts_with("cudaEventSynchronize"));
}

// The first record at or after index `from` (records sorted by start) that starts at or after
// `t`, before `until`, and satisfies `match`; null if none.
template <typename Match>
const KernelRecord* FirstFrom(const std::vector<KernelRecord>& records, size_t from, uint64_t t,
                              uint64_t until, Match match) {
  for (size_t i = from; i < records.size() && records[i].start_ns < until; ++i) {
    if (records[i].start_ns >= t && match(records[i])) return &records[i];
  }
  return nullptr;
}

}  // namespace

HostGapBreakdown BreakDownHostGaps(const std::vector<KernelRecord>& records) {
  HostGapBreakdown g;
  uint64_t kernels_end = 0;  // the latest end of the kernels seen so far
  size_t step_from = 0;      // index of the record after the previous step's first kernel
  bool seen_step = false;
  for (size_t i = 0; i < records.size(); ++i) {
    const KernelRecord& e = records[i];
    if (e.kind != KernelRecord::Kind::kKernel) continue;
    if (KernelClass(e.name, "") != "embedding") {
      kernels_end = std::max(kernels_end, e.end_ns);
      continue;
    }
    if (seen_step && e.start_ns > kernels_end) {
      const uint64_t k_end = kernels_end, first = e.start_ns;
      ++g.gaps;
      g.total_us += static_cast<double>(first - k_end) / 1e3;
      // DtoH copies that end inside the gap (the sampled tokens).
      uint64_t copied = k_end;
      for (size_t j = step_from; j < i; ++j) {
        const KernelRecord& r = records[j];
        if (r.kind == KernelRecord::Kind::kMemcpy && r.name == "memcpy DtoH" && r.end_ns > k_end &&
            r.end_ns <= first) {
          copied = std::max(copied, r.end_ns);
        }
      }
      auto us = [](uint64_t a, uint64_t b) {
        return b > a ? static_cast<double>(b - a) / 1e3 : 0.0;
      };
      const KernelRecord* upload = FirstFrom(records, step_from, copied, first, [](const auto& r) {
        return r.kind == KernelRecord::Kind::kApi && r.name.starts_with("cudaMemcpyAsync");
      });
      const KernelRecord* seen = nullptr;  // the synchronising call that saw the copy done
      for (size_t j = step_from; j < records.size() && records[j].start_ns < first; ++j) {
        const KernelRecord& r = records[j];
        if (IsSyncCall(r) && r.api_result == 0 && r.end_ns >= copied) {
          seen = &r;
          break;
        }
      }
      const KernelRecord* launch =
          upload == nullptr
              ? nullptr
              : FirstFrom(records, step_from, upload->start_ns, first, [](const auto& r) {
                  return r.kind == KernelRecord::Kind::kApi &&
                         r.name.starts_with("cudaGraphLaunch");
                });
      g.copy_out_us += us(k_end, copied);
      if (seen == nullptr || upload == nullptr || launch == nullptr ||
          seen->end_ns > upload->start_ns) {
        g.unresolved_us += us(copied, first);
      } else {
        g.wake_us += us(copied, seen->end_ns);
        g.host_us += us(seen->end_ns, upload->start_ns);
        g.upload_us += us(upload->start_ns, launch->start_ns);
        g.launch_call_us += us(launch->start_ns, launch->end_ns);
        g.launch_to_kernel_us += us(launch->end_ns, first);
      }
    }
    seen_step = true;
    step_from = i + 1;
    kernels_end = std::max(kernels_end, e.end_ns);
  }
  return g;
}

std::string FormatHostGaps(const HostGapBreakdown& g) {
  const double n = g.gaps > 0 ? g.gaps : 1;
  std::string out =
      absl::StrFormat("  GPU idle before a step's first kernel, %d steps, us/step:\n", g.gaps);
  auto line = [&](const char* what, double us) {
    absl::StrAppendFormat(&out, "    %-52s %9.1f\n", what, us / n);
  };
  line("last kernel -> sampled tokens' DtoH copy done", g.copy_out_us);
  line("-> host's synchronising call returned", g.wake_us);
  line("-> next step's metadata cudaMemcpyAsync (engine work)", g.host_us);
  line("-> cudaGraphLaunch called (upload call, planning)", g.upload_us);
  line("cudaGraphLaunch's own duration", g.launch_call_us);
  line("its return -> the step's first kernel", g.launch_to_kernel_us);
  line("unresolved (a mark missing)", g.unresolved_us);
  line("total", g.total_us);
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
