#include "comm/gloo_process_group.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/alltoallv.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/types.h"

namespace tandem::comm {
namespace {

std::chrono::milliseconds Ms(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

// Gloo's exceptions as statuses: a timeout is DEADLINE_EXCEEDED, any other I/O failure (a peer
// that closed its connections) UNAVAILABLE.
absl::Status FromGloo(const char* what, const std::exception& e) {
  const std::string message = e.what();
  if (message.find("Timed out") != std::string::npos ||
      message.find("timed out") != std::string::npos ||
      message.find("Timeout") != std::string::npos) {
    return absl::DeadlineExceededError(absl::StrCat(what, ": ", message));
  }
  return absl::UnavailableError(absl::StrCat(what, ": ", message));
}

}  // namespace

absl::StatusOr<std::unique_ptr<GlooProcessGroup>> GlooProcessGroup::Create(
    const GlooGroupOptions& options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", options.rank, " of world size ",
                                                   options.world_size, " is not a valid rank"));
  }
  auto group = std::unique_ptr<GlooProcessGroup>(
      new GlooProcessGroup(options.rank, options.world_size, options.timeout));
  group->store_port_ = options.store_port;
  group->name_ = options.name;
  if (options.rank == 0 && options.serve_store) {
    absl::StatusOr<std::unique_ptr<TcpStoreServer>> server =
        TcpStoreServer::Start(options.store_host, options.store_port);
    if (!server.ok()) return server.status();
    group->store_port_ = (*server)->port();
    group->server_ = *std::move(server);
  }
  absl::StatusOr<std::unique_ptr<TcpStoreClient>> client =
      TcpStoreClient::Connect(options.store_host, group->store_port_, options.timeout);
  if (!client.ok()) return client.status();
  group->client_ = *std::move(client);
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.bind_host;
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    group->context_ = std::make_shared<gloo::rendezvous::Context>(options.rank, options.world_size);
    group->context_->setTimeout(Ms(options.timeout));
    GlooStore store(group->client_.get(), options.name + "/", options.timeout);
    group->context_->connectFullMesh(store, device);
  } catch (const std::exception& e) {
    return FromGloo("process group rendezvous", e);
  }
  return group;
}

GlooProcessGroup::~GlooProcessGroup() {
  context_.reset();  // closes the pairs: peers still waiting on this rank see UNAVAILABLE
  client_.reset();
  server_.reset();
}

absl::Status GlooProcessGroup::status() const {
  absl::MutexLock lock(&mu_);
  return failure_;
}

template <typename Op>
absl::Status GlooProcessGroup::Run(const char* what, Op op, bool collective) {
  {
    absl::MutexLock lock(&mu_);
    if (!failure_.ok()) return failure_;
  }
  absl::Status result;
  try {
    op(collective ? next_tag_++ : 0);
    return absl::OkStatus();
  } catch (const std::exception& e) {
    result = FromGloo(what, e);
  }
  absl::MutexLock lock(&mu_);
  if (failure_.ok()) failure_ = result;
  return result;
}

absl::Status GlooProcessGroup::AllReduceSum(absl::Span<float> data) {
  if (size_ == 1 || data.empty()) return status();
  return Run("all-reduce", [&](uint32_t tag) {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(data.data(), data.size());
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    opts.setTag(tag);
    opts.setTimeout(Ms(timeout_));
    gloo::allreduce(opts);
  });
}

absl::Status GlooProcessGroup::AllGather(absl::Span<const float> in, absl::Span<float> out) {
  if (out.size() != in.size() * static_cast<size_t>(size_)) {
    return absl::InvalidArgumentError(absl::StrCat("all-gather: ", out.size(), " outputs for ",
                                                   in.size(), " inputs x ", size_, " ranks"));
  }
  // Nothing to gather (every rank has the same count: Gloo requires it): Gloo divides by the
  // input's size, so 0 floats would be a SIGFPE in every rank.
  if (size_ == 1 || in.empty()) {
    std::copy(in.begin(), in.end(), out.begin());
    return status();
  }
  return Run("all-gather", [&](uint32_t tag) {
    gloo::AllgatherOptions opts(context_);
    opts.setInput(const_cast<float*>(in.data()), in.size());
    opts.setOutput(out.data(), out.size());
    opts.setTag(tag);
    opts.setTimeout(Ms(timeout_));
    gloo::allgather(opts);
  });
}

absl::Status GlooProcessGroup::Broadcast(absl::Span<char> data, int root) {
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(absl::StrCat("broadcast root ", root, " of ", size_));
  }
  if (size_ == 1 || data.empty()) return status();
  return Run("broadcast", [&](uint32_t tag) {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(data.data(), data.size());
    opts.setRoot(root);
    opts.setTag(tag);
    opts.setTimeout(Ms(timeout_));
    gloo::broadcast(opts);
  });
}

absl::Status GlooProcessGroup::AllToAll(absl::Span<const float> in,
                                        absl::Span<const int64_t> send_counts,
                                        absl::Span<float> out,
                                        absl::Span<const int64_t> recv_counts) {
  if (send_counts.size() != static_cast<size_t>(size_) ||
      recv_counts.size() != static_cast<size_t>(size_)) {
    return absl::InvalidArgumentError(absl::StrCat("all-to-all: counts for ", send_counts.size(),
                                                   " / ", recv_counts.size(), " ranks, group of ",
                                                   size_));
  }
  int64_t sent = 0, received = 0;
  for (int r = 0; r < size_; ++r) {
    if (send_counts[r] < 0 || recv_counts[r] < 0) {
      return absl::InvalidArgumentError("all-to-all: negative count");
    }
    sent += send_counts[r];
    received += recv_counts[r];
  }
  if (sent != static_cast<int64_t>(in.size()) || received != static_cast<int64_t>(out.size())) {
    return absl::InvalidArgumentError(absl::StrCat("all-to-all: counts sum to ", sent, " / ",
                                                   received, " for buffers of ", in.size(), " / ",
                                                   out.size()));
  }
  if (size_ == 1) {
    std::copy(in.begin(), in.end(), out.begin());
    return status();
  }
  return Run("all-to-all", [&](uint32_t tag) {
    gloo::AlltoallvOptions opts(context_);
    opts.setInput(const_cast<float*>(in.data()),
                  std::vector<int64_t>(send_counts.begin(), send_counts.end()));
    opts.setOutput(out.data(), std::vector<int64_t>(recv_counts.begin(), recv_counts.end()));
    opts.setTag(tag);
    opts.setTimeout(Ms(timeout_));
    gloo::alltoallv(opts);
  });
}

absl::Status GlooProcessGroup::MeetWithProgress(const std::string& phase, absl::Duration limit,
                                                absl::Duration every,
                                                const ArrivalProgress& progress) {
  if (size_ == 1) return status();
  const std::string prefix = absl::StrCat(name_, "/meet/", phase, "/");
  RETURN_IF_ERROR(client_->Set(absl::StrCat(prefix, rank_), "1", timeout_));
  const absl::Time start = absl::Now();
  std::vector<int> missing;
  for (int r = 0; r < size_; ++r) missing.push_back(r);
  while (true) {
    // Who is still missing: a short wait per rank not seen yet.
    std::vector<int> still;
    for (int r : missing) {
      if (!client_->Get(absl::StrCat(prefix, r), absl::Milliseconds(1)).ok()) still.push_back(r);
    }
    missing = std::move(still);
    if (missing.empty()) return absl::OkStatus();
    const absl::Duration waited = absl::Now() - start;
    if (waited >= limit) {
      return absl::DeadlineExceededError(
          absl::StrCat(phase, ": rank(s) ", absl::StrJoin(missing, ", "), " did not arrive within ",
                       absl::FormatDuration(limit)));
    }
    if (waited > absl::ZeroDuration()) progress(missing, waited);
    std::vector<std::string> keys;
    for (int r : missing) keys.push_back(absl::StrCat(prefix, r));
    // Wait for all of them, at most until the next report (a timeout here is not an error).
    (void)client_->Wait(keys, std::min(every, limit - waited));
  }
}

absl::Status GlooProcessGroup::Barrier() {
  if (size_ == 1) return status();
  return Run("barrier", [&](uint32_t tag) {
    gloo::BarrierOptions opts(context_);
    opts.setTag(tag);
    opts.setTimeout(Ms(timeout_));
    gloo::barrier(opts);
  });
}

}  // namespace tandem::comm

namespace tandem::comm {
namespace {

// Point-to-point slots: a prefix of our own (Gloo's collectives use 0x01..0x0a) + sequence.
constexpr uint8_t kP2pSlotPrefix = 0x7e;

}  // namespace

absl::Status GlooProcessGroup::ReduceScatterSum(absl::Span<const float> in, absl::Span<float> out) {
  const int64_t n = static_cast<int64_t>(out.size());
  if (static_cast<int64_t>(in.size()) != n * size_) {
    return absl::InvalidArgumentError(absl::StrCat("reduce-scatter: ", in.size(), " inputs for ",
                                                   out.size(), " outputs x ", size_, " ranks"));
  }
  if (size_ == 1) {
    std::copy(in.begin(), in.end(), out.begin());
    return status();
  }
  // Every rank sends part j to rank j (one all-to-all, the bytes of a ring), then sums its
  // received parts in rank order (the same order on every rank).
  std::vector<float> parts(in.size());
  const std::vector<int64_t> counts(size_, n);
  RETURN_IF_ERROR(AllToAll(in, counts, absl::MakeSpan(parts), counts));
  std::copy_n(parts.begin(), n, out.begin());
  for (int r = 1; r < size_; ++r) {
    for (int64_t i = 0; i < n; ++i) out[i] += parts[r * n + i];
  }
  return absl::OkStatus();
}

absl::Status GlooProcessGroup::Send(absl::Span<const float> data, int peer) {
  if (peer < 0 || peer >= size_ || peer == rank_) {
    return absl::InvalidArgumentError(absl::StrCat("send: peer ", peer, " of ", size_));
  }
  const uint32_t seq = send_seq_[peer]++;
  if (data.empty()) return status();
  return Run(
      "send",
      [&](uint32_t) {
        auto buffer = context_->createUnboundBuffer(const_cast<float*>(data.data()),
                                                    data.size() * sizeof(float));
        buffer->send(peer, gloo::Slot::build(kP2pSlotPrefix, seq));
        if (!buffer->waitSend(Ms(timeout_))) throw std::runtime_error("send aborted");
      },
      /*collective=*/false);
}

absl::Status GlooProcessGroup::Recv(absl::Span<float> data, int peer) {
  if (peer < 0 || peer >= size_ || peer == rank_) {
    return absl::InvalidArgumentError(absl::StrCat("recv: peer ", peer, " of ", size_));
  }
  const uint32_t seq = recv_seq_[peer]++;
  if (data.empty()) return status();
  return Run(
      "recv",
      [&](uint32_t) {
        auto buffer = context_->createUnboundBuffer(data.data(), data.size() * sizeof(float));
        buffer->recv(peer, gloo::Slot::build(kP2pSlotPrefix, seq));
        if (!buffer->waitRecv(Ms(timeout_))) throw std::runtime_error("recv aborted");
      },
      /*collective=*/false);
}

}  // namespace tandem::comm
