#include "kvtransfer/ucx/agent_peer.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "kvtransfer/cuda_staging.h"
#include "kvtransfer/testing/agent_test_util.h"
#include "kvtransfer/testing/quantized_kv_test_util.h"
#include "kvtransfer/ucx/ucx_agent.h"

namespace tandem::kvtransfer {
namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "agent_peer: %s\n", status.ToString().c_str());
  return 1;
}

// --name=value arguments with defaults; every given name must be known.
class Args {
 public:
  absl::Status Parse(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
      absl::string_view a = argv[i];
      if (a.substr(0, 2) != "--") return absl::InvalidArgumentError(absl::StrCat("bad arg ", a));
      a.remove_prefix(2);
      const size_t eq = a.find('=');
      const std::string name(a.substr(0, eq));
      if (!values_.contains(name)) {
        return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
      }
      values_[name] = eq == absl::string_view::npos ? "true" : std::string(a.substr(eq + 1));
    }
    return absl::OkStatus();
  }
  const std::string& Str(const std::string& name) const { return values_.at(name); }
  bool Bool(const std::string& name) const { return Str(name) == "true" || Str(name) == "1"; }
  uint64_t U64(const std::string& name) const {
    uint64_t v = 0;
    return absl::SimpleAtoi(Str(name), &v) ? v : 0;
  }

 private:
  absl::flat_hash_map<std::string, std::string> values_ = {
      {"mode", "source"},
      {"strided_row_bytes", "0"},
      {"region_bytes", "1048576"},
      {"seed", "1"},
      {"fill", "true"},
      {"allocate", "false"},
      {"cuda", "false"},
      {"kv_quant", ""},
      {"kv_shape", "2,16,2,64"},
      {"kv_blocks", "64"},
      {"transports", "tcp,self,sm"},
      {"net_device", "lo"},
      {"tcp_segment_bytes", "0"},
      {"separate_data_endpoint", "true"},
      {"direct_copy", "true"},
      {"copy_threads", "2"},
      {"min_streaming_transfer_bytes", absl::StrCat(uint64_t{16} << 20)},
      {"cuda_mirror_pin_granule_bytes",
       absl::StrCat(UcxAgentOptions{}.cuda_mirror_pin_granule_bytes)},
  };
};

bool ReadExactly(char* out, size_t n) {
  for (size_t done = 0; done < n;) {
    const ssize_t got = read(STDIN_FILENO, out + done, n - done);
    if (got <= 0) return false;
    done += static_cast<size_t>(got);
  }
  return true;
}

// row_bytes > 0: strided reads of the first row_bytes of every 2 * row_bytes (a re-shard's head
// slices), else the whole region.
int ReadForever(UcxAgent& agent, uint64_t row_bytes) {
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
  const uint64_t length = source.regions(0).length();
  const std::vector<CopyOp> all = {{0, 0, 0, 0, length}};
  const std::vector<StridedCopyOp> rows = {{.local_stride = row_bytes,
                                            .remote_stride = 2 * row_bytes,
                                            .row_bytes = row_bytes,
                                            .rows = row_bytes > 0 ? length / (2 * row_bytes) : 0}};
  while (true) {
    absl::StatusOr<TransferId> id =
        row_bytes > 0 ? agent.PostStridedRead("source", rows) : agent.PostRead("source", all);
    if (!id.ok()) return Fail(id.status());
    if (absl::Status s = testing::WaitForEnd(agent, *id); !s.ok()) {
      std::fprintf(stderr, "agent_peer: %s\n", s.ToString().c_str());
      return 3;
    }
  }
}

// The regions' memory; freed after the agent (declared before it in RunAgentPeer).
struct Memory {
  std::vector<std::vector<uint8_t>> heap;
  std::vector<void*> device;
  ~Memory() {
    for (void* p : device) CudaDeviceFree(p);
  }
};

// Region contents: pattern streams, or a quantized KV pool (values, scales).
absl::StatusOr<std::vector<std::vector<uint8_t>>> RegionContents(const Args& args) {
  std::vector<std::vector<uint8_t>> contents;
  const uint64_t seed = args.U64("seed");
  if (!args.Str("kv_quant").empty()) {
    absl::StatusOr<testing::QuantizedKvShape> shape =
        testing::ParseQuantizedKvShape(args.Str("kv_quant"), args.Str("kv_shape"));
    if (!shape.ok()) return shape.status();
    const uint64_t blocks = args.U64("kv_blocks");
    if (blocks == 0) return absl::InvalidArgumentError("bad --kv_blocks");
    contents.emplace_back(blocks * shape->ValueBlockBytes());
    contents.emplace_back(blocks * shape->ScaleBlockBytes());
    for (uint64_t b = 0; b < blocks; ++b) {
      testing::FillQuantizedKvBlock(
          *shape, seed, b,
          absl::MakeSpan(&contents[0][b * shape->ValueBlockBytes()], shape->ValueBlockBytes()),
          absl::MakeSpan(&contents[1][b * shape->ScaleBlockBytes()], shape->ScaleBlockBytes()));
    }
    return contents;
  }
  for (absl::string_view size_text : absl::StrSplit(args.Str("region_bytes"), ',')) {
    uint64_t size = 0;
    if (!absl::SimpleAtoi(size_text, &size) || size == 0) {
      return absl::InvalidArgumentError("bad --region_bytes");
    }
    contents.emplace_back(size, 0);
    if (args.Bool("fill")) {
      testing::FillPattern(seed + contents.size() - 1, 0, absl::MakeSpan(contents.back()));
    }
  }
  return contents;
}

// Registers each region's contents with `agent` in the memory kind the args ask for.
absl::Status RegisterRegions(const Args& args, UcxAgent& agent,
                             std::vector<std::vector<uint8_t>>& contents, Memory& memory) {
  for (std::vector<uint8_t>& c : contents) {
    if (args.Bool("cuda")) {
      absl::StatusOr<void*> dev = CudaDeviceAlloc(c.size());
      if (!dev.ok()) return dev.status();
      memory.device.push_back(*dev);
      if (absl::Status s = CudaCopy(*dev, c.data(), c.size()); !s.ok()) return s;
      absl::StatusOr<uint32_t> index =
          agent.RegisterMemory(*dev, c.size(), tandem::v1::MEMORY_KIND_CUDA);
      if (!index.ok()) return index.status();
      // The source's part of the staging contract: publish the contents to readers.
      const ByteRange all{0, c.size()};
      if (absl::Status s = agent.SyncForRemoteRead(*index, {&all, 1}); !s.ok()) return s;
    } else if (args.Bool("allocate")) {
      auto allocated = agent.AllocateMemory(c.size(), tandem::v1::MEMORY_KIND_HOST);
      if (!allocated.ok()) return allocated.status();
      std::memcpy(allocated->first, c.data(), c.size());
    } else {
      memory.heap.push_back(std::move(c));  // the buffer itself moves: pointers stay valid
      std::vector<uint8_t>& h = memory.heap.back();
      absl::StatusOr<uint32_t> index =
          agent.RegisterMemory(h.data(), h.size(), tandem::v1::MEMORY_KIND_HOST);
      if (!index.ok()) return index.status();
    }
  }
  return absl::OkStatus();
}

}  // namespace

int RunAgentPeer(int argc, char** argv) {
  Args args;
  if (absl::Status s = args.Parse(argc, argv); !s.ok()) return Fail(s);
  // stdout carries the descriptor; UCX logs to stdout by default, so give the descriptor its
  // own descriptor and point fd 1 at stderr.
  const int out_fd = dup(STDOUT_FILENO);
  FILE* out = out_fd >= 0 ? fdopen(out_fd, "w") : nullptr;
  if (out == nullptr || dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
    return Fail(absl::InternalError("cannot set up stdout"));
  }
  absl::StatusOr<std::vector<std::vector<uint8_t>>> contents = RegionContents(args);
  if (!contents.ok()) return Fail(contents.status());
  Memory memory;  // outlives the agent: freed after ~UcxAgent
  auto agent = UcxAgent::Create(
      {.transports = args.Str("transports"),
       .net_device = args.Str("net_device"),
       .tcp_segment_bytes = args.U64("tcp_segment_bytes"),
       .separate_data_endpoint = args.Bool("separate_data_endpoint"),
       .direct_copy = args.Bool("direct_copy"),
       .copy_threads = static_cast<int>(args.U64("copy_threads")),
       .min_streaming_transfer_bytes = args.U64("min_streaming_transfer_bytes"),
       .stage_cuda_memory = args.Bool("cuda"),
       .cuda_mirror_pin_granule_bytes = args.U64("cuda_mirror_pin_granule_bytes")});
  if (!agent.ok()) return Fail(agent.status());
  if (absl::Status s = RegisterRegions(args, **agent, *contents, memory); !s.ok()) return Fail(s);
  contents->clear();
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
  if (args.Str("mode") == "reader") return ReadForever(**agent, args.U64("strided_row_bytes"));
  // Serve (the agent's progress thread does the work) until the parent closes our stdin.
  char buf[64];
  while (read(STDIN_FILENO, buf, sizeof(buf)) > 0) {
  }
  return 0;
}

bool MaybeRunAsAgentPeer(int argc, char** argv, int* exit_code) {
  if (argc < 2 || std::strcmp(argv[1], kAgentPeerFlag) != 0) return false;
  *exit_code = RunAgentPeer(argc - 1, argv + 1);
  return true;
}

std::pair<std::string, std::vector<std::string>> ReexecAsAgentPeer(std::vector<std::string> args) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string path = n > 0 ? std::string(self, static_cast<size_t>(n)) : "/proc/self/exe";
  args.insert(args.begin(), kAgentPeerFlag);
  return {std::move(path), std::move(args)};
}

}  // namespace tandem::kvtransfer
