#include "tests/reliability/raw_wire.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "google/protobuf/stubs/logging.h"
#include "grpcpp/generic/generic_stub.h"
#include "tandem/v1/kv.pb.h"
#include "tandem/v1/router.pb.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::reliability {
namespace {

template <typename T>
RawMethod Method(std::string path, const T& sample = T()) {
  // Who may call it (common/security/internal_policy.h); a KV reader is a decode worker with its
  // own certificate (kvtransfer/kv_transfer_service.h: role certificates use no lease); the
  // registry admits a worker id only from a certificate naming it (kRawWorkerCert's).
  std::string cert = path.starts_with("/tandem.v1.Router/")              ? ""
                     : path.starts_with("/tandem.v1.WorkerRegistry/")    ? kRawWorkerId
                     : path.starts_with("/tandem.v1.KvTransferService/") ? "decode-0"
                                                                         : "router";
  return RawMethod{std::move(path), std::make_shared<T>(), sample.SerializeAsString(),
                   std::move(cert)};
}

v1::GenerateRequest SampleGenerate() {
  v1::GenerateRequest r;
  r.set_request_id("raw-sample");
  for (uint32_t t = 3; t < 40; ++t) r.add_prompt_token_ids(t);
  // One token: a truncation that still parses is served with ONE stream message. CallRaw frames
  // every call as unary; a stream of two messages never delivers its status to such a call (the
  // second message is never read), which ended in the call's deadline (~6% of runs, whenever a
  // truncation fell right after the sampling field).
  r.mutable_sampling()->set_max_tokens(1);
  r.set_cache_salt("salt");
  return r;
}

std::string Varint(uint64_t v) {
  std::string out;
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
  return out;
}

bool Refused(const google::protobuf::Message& prototype, const std::string& bytes) {
  google::protobuf::LogSilencer quiet;  // the refusals are the point, not news
  std::unique_ptr<google::protobuf::Message> m(prototype.New());
  return !m->ParseFromString(bytes);
}

}  // namespace

std::vector<RawMethod> RouterMethods() {
  v1::RegisterWorkerRequest reg;
  reg.mutable_info()->set_worker_id(kRawWorkerId);
  reg.mutable_info()->set_address("127.0.0.1:1");
  v1::HeartbeatRequest hb;
  hb.set_worker_id(kRawWorkerId);
  hb.add_added_block_hashes(42);
  v1::AbortRequest abort;
  abort.set_request_id("raw-abort");
  return {Method<v1::GenerateRequest>("/tandem.v1.Router/Generate", SampleGenerate()),
          Method<v1::AbortRequest>("/tandem.v1.Router/Abort", abort),
          Method<v1::ListWorkersRequest>("/tandem.v1.Router/ListWorkers"),
          Method<v1::HealthRequest>("/tandem.v1.Router/Health"),
          Method<v1::RegisterWorkerRequest>("/tandem.v1.WorkerRegistry/RegisterWorker", reg),
          Method<v1::HeartbeatRequest>("/tandem.v1.WorkerRegistry/Heartbeat", hb)};
}

std::vector<RawMethod> WorkerMethods() {
  v1::PrefillRequest prefill;
  *prefill.mutable_request() = SampleGenerate();
  prefill.set_remote_decode(true);
  prefill.set_decode_worker_id("decode-0");
  v1::DecodeRequest decode;
  *decode.mutable_request() = SampleGenerate();
  decode.mutable_kv_handle()->set_worker_id("raw-p");
  for (uint32_t b = 0; b < 3; ++b) decode.mutable_kv_handle()->add_block_ids(b);
  decode.mutable_kv_handle()->set_transfer_endpoint("127.0.0.1:1");
  v1::AbortRequest abort;
  abort.set_request_id("raw-abort");
  v1::TransferHandshake hs;
  hs.set_worker_id("decode-0");  // the caller's own id (its certificate's): else refused
  hs.set_transport("ucx");
  hs.set_worker_address(std::string(64, 'x'));
  v1::ReleaseLeaseRequest release;
  release.set_worker_id("raw-d");
  release.set_lease_id(7);
  v1::RenewLeaseRequest renew;
  renew.set_worker_id("raw-d");
  renew.set_lease_id(7);
  renew.set_extend_ms(1000);
  v1::AuthorizeReadRequest authorize;
  *authorize.mutable_handle() = decode.kv_handle();
  v1::ReassignLeaseRequest reassign;
  reassign.set_request_id("raw-sample");
  reassign.set_lease_id(7);
  reassign.set_decode_worker_id("raw-d");
  return {
      Method<v1::PrefillRequest>("/tandem.v1.WorkerService/Prefill", prefill),
      Method<v1::DecodeRequest>("/tandem.v1.WorkerService/Decode", decode),
      Method<v1::GenerateRequest>("/tandem.v1.WorkerService/Generate", SampleGenerate()),
      Method<v1::AbortRequest>("/tandem.v1.WorkerService/Abort", abort),
      Method<v1::ReassignLeaseRequest>("/tandem.v1.WorkerService/ReassignLease", reassign),
      Method<v1::WorkerHealthRequest>("/tandem.v1.WorkerService/Health"),
      Method<v1::WorkerStatsRequest>("/tandem.v1.WorkerService/Stats"),
      Method<v1::TransferHandshake>("/tandem.v1.KvTransferService/Handshake", hs),
      Method<v1::ReleaseLeaseRequest>("/tandem.v1.KvTransferService/ReleaseLease", release),
      Method<v1::RenewLeaseRequest>("/tandem.v1.KvTransferService/RenewLease", renew),
      Method<v1::AuthorizeReadRequest>("/tandem.v1.KvTransferService/AuthorizeRead", authorize)};
}

grpc::Status CallRaw(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                     const std::string& bytes, absl::Duration deadline) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
    status = std::move(s);
    done.Notify();
  });
  // The call's own deadline ends it; the extra second only guards against a lost callback.
  if (!done.WaitForNotificationWithTimeout(deadline + absl::Seconds(1))) {
    ctx.TryCancel();
    done.WaitForNotification();
  }
  return status;
}

std::vector<Payload> MalformedPayloads(const RawMethod& method, std::mt19937& rng) {
  std::vector<Payload> out;
  for (int i = 0; i < 8; ++i) {
    std::string garbage(1 + rng() % 300, '\0');
    for (char& c : garbage) c = static_cast<char>(rng());
    out.push_back({absl::StrCat("random garbage #", i, " (", garbage.size(), " bytes)"), garbage});
  }
  const std::string& sample = method.sample;
  for (int i = 0; i < 4 && sample.size() > 2; ++i) {
    const size_t cut = 1 + rng() % (sample.size() - 1);
    out.push_back({absl::StrCat("valid request truncated at ", cut, "/", sample.size()),
                   sample.substr(0, cut)});
  }
  out.push_back({"overlong varint (field 1, 11 bytes of 0xff)", "\x08" + std::string(11, '\xff')});
  out.push_back({"wire type 7", std::string("\x0f\x01", 2)});
  out.push_back({"field number 0", std::string("\x00\x01", 2)});
  out.push_back({"length past the end", "\x0a" + Varint(0x7fffffff) + "ab"});
  out.push_back({"invalid UTF-8 in field 1", std::string("\x0a\x02\xff\xfe", 4)});
  std::string groups;
  for (int i = 0; i < 200; ++i) groups += "\x7b";  // field 15, start group
  out.push_back({"200 nested unterminated groups", groups});
  out.push_back({"end group without start", "\x7c"});
  for (Payload& p : out) p.malformed = Refused(*method.request, p.bytes);
  return out;
}

namespace {

// An address of /proc/net/tcp{,6}: 8 or 32 hex digits, each 32-bit word printed in host order.
std::string ProcNetAddress(absl::string_view hex) {
  unsigned char bytes[16] = {};
  const size_t words = hex.size() / 8;
  if ((words != 1 && words != 4) || hex.size() % 8 != 0) return std::string(hex);
  for (size_t w = 0; w < words; ++w) {
    uint32_t word = 0;
    if (!absl::SimpleHexAtoi(hex.substr(w * 8, 8), &word)) return std::string(hex);
    std::memcpy(bytes + w * 4, &word, 4);  // back to network order (the kernel's bytes)
  }
  char text[INET6_ADDRSTRLEN] = {};
  static constexpr unsigned char kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (words == 1 || std::memcmp(bytes, kMapped, sizeof(kMapped)) == 0) {
    inet_ntop(AF_INET, words == 1 ? bytes : bytes + 12, text, sizeof(text));
  } else {
    inet_ntop(AF_INET6, bytes, text, sizeof(text));
  }
  return text;
}

}  // namespace

std::vector<TcpListener> ListeningTcpSockets(pid_t pid) {
  std::set<std::string> inodes;
  const std::string fd_dir = absl::StrCat("/proc/", pid, "/fd");
  if (DIR* d = opendir(fd_dir.c_str())) {
    while (dirent* e = readdir(d)) {
      char target[256];
      const std::string link = absl::StrCat(fd_dir, "/", e->d_name);
      const ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
      if (n <= 0) continue;
      target[n] = '\0';
      absl::string_view t(target);
      if (absl::ConsumePrefix(&t, "socket:[") && absl::ConsumeSuffix(&t, "]")) {
        inodes.insert(std::string(t));
      }
    }
    closedir(d);
  }
  std::vector<TcpListener> out;
  for (const char* table : {"tcp", "tcp6"}) {
    std::ifstream in(absl::StrCat("/proc/", pid, "/net/", table));
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
      std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (f.size() < 10 || f[3] != "0A" || !inodes.contains(f[9])) continue;  // 0A: LISTEN
      const size_t colon = f[1].rfind(':');
      TcpListener l;
      if (colon == std::string::npos ||
          !absl::SimpleHexAtoi(absl::string_view(f[1]).substr(colon + 1), &l.port)) {
        continue;
      }
      l.address = ProcNetAddress(absl::string_view(f[1]).substr(0, colon));
      out.push_back(std::move(l));
    }
  }
  return out;
}

std::vector<int> ListeningTcpPorts(pid_t pid) {
  std::set<int> ports;
  for (const TcpListener& l : ListeningTcpSockets(pid)) ports.insert(l.port);
  return {ports.begin(), ports.end()};
}

std::string SendRawTcp(int port, const std::string& bytes, absl::Duration wait) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::StrCat("error: socket: ", strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const std::string err = errno == ECONNREFUSED ? "refused" : strerror(errno);
    close(fd);
    return err;
  }
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the peer may close before reading everything: that is an answer too
    sent += static_cast<size_t>(n);
  }
  const absl::Time deadline = absl::Now() + wait;
  std::string result = "open";
  char buf[4096];
  while (absl::Now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    const int ms = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    if (poll(&p, 1, std::max(ms, 1)) <= 0) continue;
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) {
      result = "closed";
      break;
    }
  }
  close(fd);
  return result;
}

}  // namespace tandem::reliability
