// agent_peer: the other process of two-process transfer tests and of the benchmark. Registers
// pattern-filled host memory with a UcxAgent and prints its TransferHandshake on stdout (format
// in peer_process.h). Then, by --mode:
//   source: serves reads until stdin reaches EOF.
//   reader: reads the source's TransferHandshake from stdin (same framing) and pulls the
//           source's region 0 into its own region 0 in a loop until killed (exit 3 on error).
//
//   agent_peer --region_bytes=8388608,1000003 --seed=42 [--transports=tcp,self,sm]
//              [--allocate]  (regions from UcxAgent::AllocateMemory instead of the heap)
//
// Region i is filled with pattern stream seed + i (agent_test_util.h), so the reader can
// regenerate every expected byte without reading the source.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "kvtransfer/agent_test_util.h"
#include "kvtransfer/ucx_agent.h"

ABSL_FLAG(std::string, mode, "source", "source or reader");
ABSL_FLAG(std::string, region_bytes, "1048576", "comma-separated sizes of the regions");
ABSL_FLAG(uint64_t, seed, 1, "pattern seed of region 0 (region i uses seed + i)");
ABSL_FLAG(bool, fill, true, "fill the regions with the pattern (false: leave them zeroed)");
ABSL_FLAG(bool, allocate, false,
          "allocate the regions with AllocateMemory (shared-memory readable) instead of the heap");
ABSL_FLAG(bool, separate_data_endpoint, true, "UcxAgentOptions::separate_data_endpoint");
ABSL_FLAG(std::string, transports, "tcp,self,sm", "UCX_TLS");
ABSL_FLAG(std::string, net_device, "lo", "UCX_NET_DEVICES");
ABSL_FLAG(uint64_t, tcp_segment_bytes, 0, "UcxAgentOptions::tcp_segment_bytes");

namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "agent_peer: %s\n", status.ToString().c_str());
  return 1;
}

bool ReadExactly(char* out, size_t n) {
  for (size_t done = 0; done < n;) {
    const ssize_t got = read(STDIN_FILENO, out + done, n - done);
    if (got <= 0) return false;
    done += static_cast<size_t>(got);
  }
  return true;
}

int ReadForever(tandem::kvtransfer::UcxAgent& agent) {
  char header[8];
  if (!ReadExactly(header, 8)) return Fail(absl::UnavailableError("no source descriptor"));
  uint64_t size = 0;
  for (int i = 7; i >= 0; --i) size = (size << 8) | static_cast<uint8_t>(header[i]);
  if (size > (uint64_t{16} << 20)) return Fail(absl::InvalidArgumentError("descriptor size"));
  std::string bytes(size, '\0');
  tandem::v1::TransferHandshake source;
  if (!ReadExactly(bytes.data(), size) || !source.ParseFromString(bytes) ||
      source.regions_size() == 0) {
    return Fail(absl::InvalidArgumentError("bad source descriptor"));
  }
  if (absl::Status s = agent.AddPeer("source", source); !s.ok()) return Fail(s);
  const std::vector<tandem::kvtransfer::CopyOp> all = {{0, 0, 0, 0, source.regions(0).length()}};
  while (true) {
    absl::StatusOr<tandem::kvtransfer::TransferId> id = agent.PostRead("source", all);
    if (!id.ok()) return Fail(id.status());
    if (absl::Status s = tandem::kvtransfer::testing::WaitForEnd(agent, *id); !s.ok()) {
      std::fprintf(stderr, "agent_peer: %s\n", s.ToString().c_str());
      return 3;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // stdout carries the descriptor; UCX logs to stdout by default, so give the descriptor its
  // own descriptor and point fd 1 at stderr.
  const int out_fd = dup(STDOUT_FILENO);
  FILE* out = out_fd >= 0 ? fdopen(out_fd, "w") : nullptr;
  if (out == nullptr || dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
    return Fail(absl::InternalError("cannot set up stdout"));
  }
  using tandem::kvtransfer::UcxAgent;
  auto agent =
      UcxAgent::Create({.transports = absl::GetFlag(FLAGS_transports),
                        .net_device = absl::GetFlag(FLAGS_net_device),
                        .tcp_segment_bytes = absl::GetFlag(FLAGS_tcp_segment_bytes),
                        .separate_data_endpoint = absl::GetFlag(FLAGS_separate_data_endpoint)});
  if (!agent.ok()) return Fail(agent.status());

  std::vector<std::vector<uint8_t>> heap;  // the regions' memory unless --allocate
  std::vector<absl::Span<uint8_t>> regions;
  for (absl::string_view size_text : absl::StrSplit(absl::GetFlag(FLAGS_region_bytes), ',')) {
    uint64_t size = 0;
    if (!absl::SimpleAtoi(size_text, &size) || size == 0) {
      return Fail(absl::InvalidArgumentError("bad --region_bytes"));
    }
    if (absl::GetFlag(FLAGS_allocate)) {
      auto allocated = (*agent)->AllocateMemory(size, tandem::v1::MEMORY_KIND_HOST);
      if (!allocated.ok()) return Fail(allocated.status());
      regions.emplace_back(static_cast<uint8_t*>(allocated->first), size);
      // Allocated memory is not promised to be zeroed; --fill=false means zeroed.
      if (!absl::GetFlag(FLAGS_fill)) std::fill(regions.back().begin(), regions.back().end(), 0);
    } else {
      heap.emplace_back(size);
      regions.push_back(absl::MakeSpan(heap.back()));
    }
  }
  for (size_t i = 0; i < regions.size(); ++i) {
    if (absl::GetFlag(FLAGS_fill)) {
      tandem::kvtransfer::testing::FillPattern(absl::GetFlag(FLAGS_seed) + i, 0, regions[i]);
    }
    if (absl::GetFlag(FLAGS_allocate)) continue;  // registered by AllocateMemory, in order
    auto index = (*agent)->RegisterMemory(regions[i].data(), regions[i].size(),
                                          tandem::v1::MEMORY_KIND_HOST);
    if (!index.ok()) return Fail(index.status());
  }
  tandem::v1::TransferHandshake descriptor;
  descriptor.set_worker_id(absl::StrCat("agent_peer-", getpid()));
  if (absl::Status s = (*agent)->FillLocalDescriptor(&descriptor); !s.ok()) return Fail(s);
  const std::string bytes = descriptor.SerializeAsString();
  unsigned char header[8];
  for (int i = 0; i < 8; ++i) header[i] = static_cast<unsigned char>(bytes.size() >> (8 * i));
  if (std::fwrite(header, 1, 8, out) != 8 ||
      std::fwrite(bytes.data(), 1, bytes.size(), out) != bytes.size() || std::fflush(out) != 0) {
    return Fail(absl::InternalError("cannot write the descriptor"));
  }
  if (absl::GetFlag(FLAGS_mode) == "reader") return ReadForever(**agent);
  // Serve (the agent's progress thread does the work) until the parent closes our stdin.
  char buf[64];
  while (read(STDIN_FILENO, buf, sizeof(buf)) > 0) {
  }
  return 0;
}
