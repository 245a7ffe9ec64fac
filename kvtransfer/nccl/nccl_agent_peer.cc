#include "kvtransfer/nccl/nccl_agent_peer.h"

#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <nccl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "kvtransfer/nccl/nccl_agent.h"
#include "kvtransfer/nccl/nccl_agent_auth.h"
#include "kvtransfer/nccl/nccl_agent_socket.h"
#include "kvtransfer/nccl/nccl_agent_wire.h"

extern char** environ;

namespace tandem::kvtransfer::nccl_peer {
namespace {

bool WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool ReadAll(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t EnvU64(const char* name) {
  const char* v = std::getenv(name);
  uint64_t out = 0;
  if (v == nullptr || !absl::SimpleAtoi(v, &out)) return 0;
  return out;
}

// PeerMode::kStallAfterAck. Speaks the control protocol by hand (nccl_agent_wire.h).
int RunStalledSource(int device, uint64_t bytes, int in, int out) {
  if (cudaSetDevice(device) != cudaSuccess) return 3;
  char* buf = nullptr;
  if (cudaMalloc(reinterpret_cast<void**>(&buf), bytes) != cudaSuccess) return 4;
  int port = 0;
  absl::StatusOr<int> listen_fd = nccl_socket::Listen("127.0.0.1", 0, &port);
  if (!listen_fd.ok()) return 6;
  tandem::v1::TransferHandshake desc;
  desc.set_transport("nccl");
  desc.set_worker_address(nccl_wire::FormatAddress("127.0.0.1", port));
  tandem::v1::MemoryRegion* region = desc.add_regions();
  region->set_base_address(reinterpret_cast<uint64_t>(buf));
  region->set_length(bytes);
  region->set_kind(tandem::v1::MEMORY_KIND_CUDA);
  std::string wire = desc.SerializeAsString();
  uint32_t len = static_cast<uint32_t>(wire.size());
  if (!WriteAll(out, &len, 4) || !WriteAll(out, wire.data(), len)) return 9;
  // Accept the reader, or leave when the parent closes the pipe first.
  pollfd fds[2] = {{*listen_fd, POLLIN, 0}, {in, POLLIN, 0}};
  while (poll(fds, 2, -1) < 0) {
  }
  if ((fds[0].revents & POLLIN) == 0) _exit(0);
  const int conn = accept(*listen_fd, nullptr, nullptr);
  std::atomic<bool> stop{false};
  nccl_wire::MessageType type;
  // The opening exchange as a real source does it (challenge, then the reader's hello; no key:
  // nothing checked), giving one ncclUniqueId per communicator of the pair (the reader's
  // num_comms): join each in turn (the reader inits them concurrently) and answer its warm-up.
  if (conn < 0) return 17;
  const nccl_auth::ControlTokenAuthority no_auth("");
  absl::StatusOr<std::string> hello =
      nccl_auth::AcceptHello(conn, no_auth, stop, absl::Seconds(30));
  if (!hello.ok() || hello->empty() || hello->size() % sizeof(ncclUniqueId) != 0) return 17;
  std::string payload = *std::move(hello);
  std::vector<ncclUniqueId> ids(payload.size() / sizeof(ncclUniqueId));
  std::memcpy(ids.data(), payload.data(), payload.size());
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  std::vector<ncclComm_t> comms(ids.size(), nullptr);
  for (size_t c = 0; c < ids.size(); ++c) {
    if (ncclCommInitRank(&comms[c], 2, ids[c], 1) != ncclSuccess) return 18;
  }
  for (ncclComm_t comm : comms) {
    if (ncclSend(buf, 1, ncclInt8, 0, comm, stream) != ncclSuccess ||
        cudaStreamSynchronize(stream) != cudaSuccess) {
      return 19;
    }
  }
  if (!nccl_socket::RecvFrame(conn, stop, absl::Seconds(30), &type, &payload).ok()) return 20;
  absl::StatusOr<nccl_wire::ReadRequest> req = nccl_wire::DecodeReadRequest(payload);
  if (!req.ok()) return 21;
  if (!nccl_socket::SendFrame(
           conn, nccl_wire::MessageType::kReadAck,
           nccl_wire::EncodeReadAck({req->id, req->params.chunk_bytes, absl::OkStatus()}))
           .ok()) {
    return 22;
  }
  char c;
  while (ReadAll(in, &c, 1)) {  // stalled until the parent is done
  }
  _exit(0);  // no NCCL teardown: the reader aborted its side long ago
}

int RunPeer() {
  const int device = static_cast<int>(EnvU64("TANDEM_NCCL_PEER_DEVICE"));
  const uint64_t bytes = EnvU64("TANDEM_NCCL_PEER_BYTES");
  const uint64_t seed = EnvU64("TANDEM_NCCL_PEER_SEED");
  const int in = static_cast<int>(EnvU64("TANDEM_NCCL_PEER_IN"));
  const int out = static_cast<int>(EnvU64("TANDEM_NCCL_PEER_OUT"));
  const uint64_t chunk = EnvU64("TANDEM_NCCL_PEER_CHUNK");
  if (EnvU64("TANDEM_NCCL_PEER_STALL") != 0) return RunStalledSource(device, bytes, in, out);
  if (cudaSetDevice(device) != cudaSuccess) return 3;
  char* buf = nullptr;
  if (cudaMalloc(&buf, bytes) != cudaSuccess) return 4;
  {
    std::vector<char> host(bytes);
    FillPattern(seed, 0, bytes, host.data());
    if (cudaMemcpy(buf, host.data(), bytes, cudaMemcpyHostToDevice) != cudaSuccess) return 5;
  }
  std::unique_ptr<NcclAgent> agent;
  // Creates the agent (the old one first ends its connections) and sends its descriptor.
  auto start_agent = [&](const PeerAgentConfig& config) -> int {
    agent.reset();
    NcclAgentOptions options;
    options.device = device;
    if (config.staging_chunk_bytes != 0) options.staging_chunk_bytes = config.staging_chunk_bytes;
    if (config.copy_ctas != 0) options.copy_ctas = config.copy_ctas;
    if (config.staging_buffers != 0) options.staging_buffers = config.staging_buffers;
    if (config.copy_mode >= 0)
      options.copy_mode = static_cast<nccl_copy::CopyMode>(config.copy_mode);
    auto created = NcclAgent::Create(options);
    if (!created.ok()) return 6;
    agent = std::move(*created);
    if (!agent->RegisterMemory(buf, bytes, tandem::v1::MEMORY_KIND_CUDA).ok()) return 7;
    tandem::v1::TransferHandshake desc;
    if (!agent->FillLocalDescriptor(&desc).ok()) return 8;
    std::string wire = desc.SerializeAsString();
    uint32_t len = static_cast<uint32_t>(wire.size());
    if (!WriteAll(out, &len, 4) || !WriteAll(out, wire.data(), len)) return 9;
    return 0;
  };
  PeerAgentConfig first;
  first.staging_chunk_bytes = chunk;
  if (int rc = start_agent(first); rc != 0) return rc;
  ncclComm_t raw = nullptr;
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  char cmd;
  while (ReadAll(in, &cmd, 1)) {  // EOF: the parent is done
    if (cmd == 'I') {
      ncclUniqueId id;
      if (!ReadAll(in, &id, sizeof(id))) return 10;
      if (ncclCommInitRank(&raw, 2, id, 1) != ncclSuccess) return 11;
    } else if (cmd == 'S') {
      uint64_t n = 0;
      uint32_t iters = 0;
      if (!ReadAll(in, &n, 8) || !ReadAll(in, &iters, 4) || raw == nullptr) return 12;
      for (uint32_t i = 0; i < iters; ++i) {
        if (ncclSend(buf, n, ncclInt8, 0, raw, stream) != ncclSuccess) return 13;
      }
      if (cudaStreamSynchronize(stream) != cudaSuccess) return 14;
      if (!WriteAll(out, "D", 1)) return 15;
    } else if (cmd == 'R') {
      PeerAgentConfig config;
      if (!ReadAll(in, &config.staging_chunk_bytes, 8) || !ReadAll(in, &config.copy_ctas, 4) ||
          !ReadAll(in, &config.staging_buffers, 4) || !ReadAll(in, &config.copy_mode, 4)) {
        return 12;
      }
      if (int rc = start_agent(config); rc != 0) return rc;
    } else {
      return 16;
    }
  }
  agent.reset();
  if (raw != nullptr) ncclCommAbort(raw);  // local; the parent may be gone already
  cudaFree(buf);
  return 0;
}

}  // namespace

void FillPattern(uint64_t seed, uint64_t offset, uint64_t n, char* out) {
  for (uint64_t i = 0; i < n;) {
    const uint64_t pos = offset + i;
    const uint64_t word = SplitMix(seed ^ SplitMix(pos / 8));
    for (uint64_t b = pos % 8; b < 8 && i < n; ++b, ++i) {
      out[i] = static_cast<char>(word >> (8 * b));
    }
  }
}

int MaybeRunPeer() {
  if (std::getenv("TANDEM_NCCL_PEER") == nullptr) return -1;
  return RunPeer();
}

absl::StatusOr<PeerProcess> PeerProcess::Spawn(int device, uint64_t bytes, uint64_t seed,
                                               uint64_t staging_chunk_bytes, PeerMode mode) {
  int to_child[2], from_child[2];
  if (pipe(to_child) != 0 || pipe(from_child) != 0) return absl::InternalError("pipe failed");
  // Parent ends must not leak into the child (its EOF detection depends on it).
  fcntl(to_child[1], F_SETFD, FD_CLOEXEC);
  fcntl(from_child[0], F_SETFD, FD_CLOEXEC);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  env_strings.push_back("TANDEM_NCCL_PEER=1");
  env_strings.push_back(absl::StrCat("TANDEM_NCCL_PEER_DEVICE=", device));
  env_strings.push_back(absl::StrCat("TANDEM_NCCL_PEER_BYTES=", bytes));
  env_strings.push_back(absl::StrCat("TANDEM_NCCL_PEER_SEED=", seed));
  env_strings.push_back(absl::StrCat("TANDEM_NCCL_PEER_CHUNK=", staging_chunk_bytes));
  env_strings.push_back(
      absl::StrCat("TANDEM_NCCL_PEER_STALL=", mode == PeerMode::kStallAfterAck ? 1 : 0));
  env_strings.push_back(absl::StrCat("TANDEM_NCCL_PEER_IN=", to_child[0]));
  env_strings.push_back(absl::StrCat("TANDEM_NCCL_PEER_OUT=", from_child[1]));
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  char arg0[] = "nccl_agent_peer";
  char* argv[] = {arg0, nullptr};
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    execve("/proc/self/exe", argv, envp.data());
    _exit(127);
  }
  close(to_child[0]);
  close(from_child[1]);
  PeerProcess p;
  p.pid_ = pid;
  p.to_child_ = to_child[1];
  p.from_child_ = from_child[0];
  uint32_t len = 0;
  std::string wire;
  if (!ReadAll(p.from_child_, &len, 4) ||
      (wire.resize(len), !ReadAll(p.from_child_, wire.data(), len)) ||
      !p.descriptor_.ParseFromString(wire)) {
    return absl::InternalError("nccl peer process died before sending its descriptor");
  }
  return p;
}

PeerProcess::PeerProcess(PeerProcess&& o) noexcept
    : pid_(o.pid_),
      to_child_(o.to_child_),
      from_child_(o.from_child_),
      descriptor_(std::move(o.descriptor_)) {
  o.pid_ = -1;
  o.to_child_ = o.from_child_ = -1;
}

PeerProcess::~PeerProcess() {
  if (to_child_ >= 0) close(to_child_);
  if (pid_ > 0) kill(pid_, SIGCONT);  // a stopped child would never see the EOF
  if (pid_ > 0) waitpid(pid_, nullptr, 0);
  if (from_child_ >= 0) close(from_child_);
}

void PeerProcess::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

void PeerProcess::Stop() {
  if (pid_ > 0) kill(pid_, SIGSTOP);
}

void PeerProcess::Continue() {
  if (pid_ > 0) kill(pid_, SIGCONT);
}

absl::Status PeerProcess::RawInit(const std::string& unique_id) {
  std::string cmd = "I" + unique_id;
  if (!WriteAll(to_child_, cmd.data(), cmd.size())) return absl::UnavailableError("peer gone");
  return absl::OkStatus();
}

absl::Status PeerProcess::RawSend(uint64_t bytes, uint32_t iters) {
  char cmd[13];
  cmd[0] = 'S';
  std::memcpy(cmd + 1, &bytes, 8);
  std::memcpy(cmd + 9, &iters, 4);
  if (!WriteAll(to_child_, cmd, sizeof(cmd))) return absl::UnavailableError("peer gone");
  return absl::OkStatus();
}

absl::Status PeerProcess::RestartAgent(const PeerAgentConfig& config) {
  char cmd[21];
  cmd[0] = 'R';
  std::memcpy(cmd + 1, &config.staging_chunk_bytes, 8);
  std::memcpy(cmd + 9, &config.copy_ctas, 4);
  std::memcpy(cmd + 13, &config.staging_buffers, 4);
  std::memcpy(cmd + 17, &config.copy_mode, 4);
  if (!WriteAll(to_child_, cmd, sizeof(cmd))) return absl::UnavailableError("peer gone");
  uint32_t len = 0;
  std::string wire;
  if (!ReadAll(from_child_, &len, 4) ||
      (wire.resize(len), !ReadAll(from_child_, wire.data(), len)) ||
      !descriptor_.ParseFromString(wire)) {
    return absl::UnavailableError("nccl peer process died restarting its agent");
  }
  return absl::OkStatus();
}

absl::Status PeerProcess::WaitRawDone() {
  char c = 0;
  if (!ReadAll(from_child_, &c, 1) || c != 'D') return absl::UnavailableError("peer gone");
  return absl::OkStatus();
}

}  // namespace tandem::kvtransfer::nccl_peer
