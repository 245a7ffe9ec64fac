// dcp_bench's table (dcp_bench.cc): one row per (shape, batch, context, DCP size), printed by
// rank 0 as the rows complete; speedups are against the N = 1 row of the same shape, batch and
// context (run first: --dcp lists are sorted).
//
// Thread safety: not thread-safe; rank 0's main thread prints.
#ifndef TANDEM_RUNTIME_PARALLEL_DCP_BENCH_DCP_BENCH_TABLE_H_
#define TANDEM_RUNTIME_PARALLEL_DCP_BENCH_DCP_BENCH_TABLE_H_

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>

#include "runtime/parallel/dcp_bench/dcp_bench_layer.h"

namespace tandem::runtime::dcp_bench {

// A row's numbers: the slowest rank's times and the worst rank's check error.
struct RowResult {
  bool fits = false;  // false: some rank lacked the device memory and the row was skipped
  LayerTimes times;
};

struct TableSetup {
  std::string device;  // the GPU's name
  int world = 1;       // ranks in the run
  std::string comm;    // "nccl" or "gloo"
  bool graphs = true;
  bool share_device = false;  // every rank on one GPU: timings meaningless
};

// max |merged - unsharded| / max |unsharded| above this fails the row's check (bf16 partials
// and outputs round at 2^-8 relative; the merge adds one more rounding).
inline constexpr double kCheckTolerance = 2e-2;

class Table {
 public:
  explicit Table(TableSetup setup) : setup_(std::move(setup)) {}
  void PrintHeader() const;
  void PrintRow(const LayerConfig& c, const RowResult& row);
  void PrintFooter() const;
  // Rows whose check failed so far.
  int failures() const { return failures_; }

 private:
  TableSetup setup_;
  std::map<std::tuple<std::string, int64_t, int64_t>, LayerTimes> base_;  // the N = 1 rows
  int failures_ = 0;
};

}  // namespace tandem::runtime::dcp_bench

#endif  // TANDEM_RUNTIME_PARALLEL_DCP_BENCH_DCP_BENCH_TABLE_H_
