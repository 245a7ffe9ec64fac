#include "runtime/parallel/dcp_bench/dcp_bench_table.h"

#include <cstdio>
#include <string>

#include "absl/strings/str_format.h"

namespace tandem::runtime::dcp_bench {
namespace {

// "-" for values that were not measured.
std::string Num(double v, int precision = 1) {
  return v < 0 ? std::string("-") : absl::StrFormat("%.*f", precision, v);
}

}  // namespace

void Table::PrintHeader() const {
  std::printf("dcp_bench: %s, %d rank(s), device collectives %s, %s\n", setup_.device.c_str(),
              setup_.world, setup_.comm.c_str(),
              setup_.graphs ? "CUDA-graph replay (device time)" : "eager calls");
  if (setup_.share_device) {
    std::printf(
        "NOTE: --share_device: every rank runs on ONE GPU and exchanges through host memory "
        "(gloo host-staged): the N > 1 TIMINGS ARE MEANINGLESS; this is a smoke test of the "
        "ranks, the exchange and the check. The N = 1 rows are real.\n");
  }
  std::printf(
      "per simulated layer: bf16 KV (MLA: the latent), block 16 = DCP interleave, q_len 1, TP_A 1 "
      "(every rank attends all q heads, merges H/N); times: slowest rank, us per layer\n");
  std::printf(
      "%-11s %5s %7s %3s %6s %4s %8s %8s %6s %6s %8s %6s %8s %6s %6s %6s %5s %8s %5s %8s %8s %s\n",
      "shape", "batch", "context", "dcp", "local", "spl", "attn_us", "lat_us", "lat_x", "pack",
      "a2a_us", "merge", "layer_us", "attn_x", "%goal", "layer_x", "a2a%", "kvGiB/rk", "cap_x",
      "step_ms", "tok/s/rq", "check");
}

void Table::PrintRow(const LayerConfig& c, const RowResult& row) {
  const auto key = std::make_tuple(c.shape.name, c.batch, c.context);
  const int64_t local = LocalTokens(c);
  std::printf("%-11s %5lld %7lld %3lld %6lld ", c.shape.name.c_str(),
              static_cast<long long>(c.batch), static_cast<long long>(c.context),
              static_cast<long long>(c.dcp), static_cast<long long>(local));
  if (!row.fits) {
    std::printf("skipped: a rank lacks %.1f GiB of free device memory\n",
                DeviceBytesNeeded(c) / double(int64_t{1} << 30));
    std::fflush(stdout);
    return;
  }
  const LayerTimes& t = row.times;
  if (c.dcp == 1) base_[key] = t;
  const auto base = base_.find(key);
  const bool has_base = base != base_.end();
  const double attn_x = has_base ? base->second.attention_us / t.attention_us : -1;
  const double layer_x = has_base ? base->second.layer_us / t.layer_us : -1;
  const double lat_x = has_base && t.latent_us > 0 ? base->second.latent_us / t.latent_us : -1;
  const double goal = c.dcp > 1 && has_base ? 100 * attn_x / (0.85 * c.dcp) : -1;
  const double a2a_share = c.dcp > 1 ? 100 * t.all_to_all_us / t.layer_us : -1;
  LayerConfig one = c;
  one.dcp = 1;
  const double kv_gib = static_cast<double>(KvBytesPerRank(c)) * c.shape.num_layers / (1 << 30);
  const double cap_x = static_cast<double>(KvBytesPerRank(one)) / KvBytesPerRank(c);
  const double step_ms = t.layer_us * c.shape.num_layers / 1e3;
  std::string check = "-";
  if (t.max_rel_err >= 0) {
    const bool ok = t.max_rel_err <= kCheckTolerance;
    if (!ok) ++failures_;
    check = absl::StrFormat("%s %.1e", ok ? "ok" : "FAIL", t.max_rel_err);
  }
  std::printf("%4d %8s %8s %5sx %6s %8s %6s %8s %5sx %6s %6sx %5s %8.2f %4.1fx %8.2f %8.1f %s\n",
              t.num_splits, Num(t.attention_us).c_str(), Num(t.latent_us).c_str(),
              Num(lat_x, 2).c_str(), Num(t.pack_us).c_str(), Num(t.all_to_all_us).c_str(),
              Num(t.merge_us).c_str(), Num(t.layer_us).c_str(), Num(attn_x, 2).c_str(),
              Num(goal, 0).c_str(), Num(layer_x, 2).c_str(), Num(a2a_share, 1).c_str(), kv_gib,
              cap_x, step_ms, 1e3 / step_ms, check.c_str());
  std::fflush(stdout);
}

void Table::PrintFooter() const {
  std::printf(
      "local: tokens per request on rank 0; spl: attention KV splits; attn_us/pack/a2a_us/merge: "
      "each part alone, many layers back to back (MLA: attn_us is the whole absorbed attention, "
      "W_UK / W_UV GEMMs included; lat_us the latent kernel alone, lat_x its dcp-1 time / this); "
      "layer_us: the four in sequence (attention "
      "alone for dcp 1); attn_x / layer_x: dcp-1 time / this; %%goal: attn_x / (0.85 dcp) "
      "(>= 100 meets issue 17's goal); a2a%%: a2a_us / layer_us; kvGiB/rk: one rank's KV for the "
      "batch over all the model's layers, cap_x: capacity vs dcp 1; step_ms, tok/s/rq: the "
      "ATTENTION part of a decode step (layer_us x layers; GEMMs not included) and its tokens "
      "per second per request; check: max |merged - unsharded| / max |unsharded| over the "
      "rank's heads (ok <= %.0e). %d check(s) failed.\n",
      kCheckTolerance, failures_);
}

}  // namespace tandem::runtime::dcp_bench
