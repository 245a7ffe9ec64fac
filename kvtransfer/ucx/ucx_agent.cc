#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/ucx_status.h"
#include "glog/logging.h"
#include "kvtransfer/copy_ops.h"
#include "kvtransfer/ucx/ucx_agent_impl.h"
#include "tandem/v1/limits.h"

// Converted UCX error naming the call and the line it failed at.
#define UCX_ERROR(status, call) ::tandem::UcxStatus((status), {(call), __FILE__, __LINE__})

namespace tandem::kvtransfer {
namespace {

// A draining endpoint whose requests do not complete within this time is force-closed anyway
// (which completes them as cancelled), so a misbehaving transport cannot hang a transfer.
constexpr absl::Duration kDrainForceAfter = absl::Seconds(3);

absl::Status ErrnoError(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, " failed: ", std::strerror(errno)));
}

// Populates the page tables of [ptr, ptr + bytes) of a mapping for reading; best effort (older
// kernels lack MADV_POPULATE_READ).
absl::Status PopulateMapping(void* ptr, uint64_t bytes) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(ptr) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(ptr) + bytes;
  if (madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_READ) != 0) {
    return ErrnoError("madvise(MADV_POPULATE_READ)");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<UcxAgent>> UcxAgent::Create(UcxAgentOptions options) {
  if (options.copy_threads < 1 || options.copy_threads > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "UcxAgentOptions::copy_threads must be in [1, 64], got ", options.copy_threads));
  }
  std::unique_ptr<UcxAgentImpl> agent(new UcxAgentImpl(std::move(options)));
  if (absl::Status s = agent->Init(); !s.ok()) return s;
  return agent;
}

absl::Status UcxAgentImpl::Init() {
  ucp_config_t* config = nullptr;
  UCX_RETURN_IF_ERROR(ucp_config_read(nullptr, nullptr, &config));
  std::vector<std::pair<std::string, std::string>> settings = {
      {"TLS", options_.transports},
      {"KEEPALIVE_INTERVAL",
       absl::StrCat(absl::ToInt64Microseconds(options_.keepalive_interval), "us")},
  };
  if (!options_.net_device.empty()) settings.emplace_back("NET_DEVICES", options_.net_device);
  if (options_.tcp_segment_bytes > 0) {
    const std::string seg = absl::StrCat(options_.tcp_segment_bytes);
    settings.emplace_back("TCP_TX_SEG_SIZE", seg);
    settings.emplace_back("TCP_RX_SEG_SIZE", seg);
  }
  settings.insert(settings.end(), options_.extra_config.begin(), options_.extra_config.end());
  for (const auto& [name, value] : settings) {
    if (ucs_status_t s = ucp_config_modify(config, name.c_str(), value.c_str()); s != UCS_OK) {
      ucp_config_release(config);
      return absl::InvalidArgumentError(
          absl::StrCat("UCX setting ", name, "=", value, ": ", ucs_status_string(s)));
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  if (options_.enable_am) params.features |= UCP_FEATURE_AM;
  const ucs_status_t init = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (init != UCS_OK) {
    context_ = nullptr;
    return UCX_ERROR(init, "ucp_init");
  }
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  UCX_RETURN_IF_ERROR(ucp_context_query(context_, &attr));
  cuda_supported_ = (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;

  absl::MutexLock lock(&mu_);
  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // we serialize every call under mu_
  UCX_RETURN_IF_ERROR(ucp_worker_create(context_, &wparams, &worker_));
  if (options_.enable_am) RETURN_IF_ERROR(RegisterGatherHandlersLocked());
  if (options_.enable_am && options_.remote_gather) {
    ASSIGN_OR_RETURN(gather_key_, NewGatherKey());
  }
  ucp_address_t* address = nullptr;
  size_t address_length = 0;
  UCX_RETURN_IF_ERROR(ucp_worker_get_address(worker_, &address, &address_length));
  worker_address_.assign(reinterpret_cast<const char*>(address), address_length);
  ucp_worker_release_address(worker_, address);
  if (worker_address_.size() > static_cast<size_t>(tandem::v1::kMaxTransportAddressBytes)) {
    return absl::InternalError(absl::StrCat("UCX worker address of ", worker_address_.size(),
                                            " bytes exceeds the handshake limit"));
  }
  int fd = -1;
  if (ucp_worker_get_efd(worker_, &fd) == UCS_OK) worker_fd_ = fd;  // else: short sleeps

  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) return ErrnoError("epoll_create1");
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return ErrnoError("eventfd");
  for (int f : {wake_fd_, worker_fd_}) {
    if (f < 0) continue;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = f;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, f, &ev) != 0) return ErrnoError("epoll_ctl");
  }
  progress_thread_ = std::thread([this] { ProgressLoop(); });
  for (int i = 1; i < options_.copy_threads; ++i) {
    copy_threads_.emplace_back([this] { CopyLoop(); });
  }
  return absl::OkStatus();
}

UcxAgentImpl::~UcxAgentImpl() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (progress_thread_.joinable()) {
    Wake();
    progress_thread_.join();
  }
  // Helpers finish the copy they run (bounded by max_request_bytes) and leave; stopping the
  // transfers below drops the copies still queued.
  for (std::thread& helper : copy_threads_) helper.join();
  absl::MutexLock lock(&mu_);
  if (worker_ != nullptr) {
    transfers_.ForEach([this](Transfer& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (!t.ended) StopTransferLocked(t, absl::CancelledError("transfer agent destroyed"));
    });
    // Let cancelled requests finish, then close every endpoint; all bounded in time.
    const absl::Time give_up = absl::Now() + kDrainForceAfter;
    peers_.clear();  // no tombstones: every Conn may be freed
    for (auto& conn : conns_) {
      if (conn->state == Conn::State::kActive) conn->state = Conn::State::kDraining;
      conn->draining_since = absl::InfinitePast();  // force-close stuck requests right away
    }
    while (!conns_.empty() && absl::Now() < give_up) {
      ucp_worker_progress(worker_);
      PollStagingLocked();  // device copies of staged requests end their requests
      ReapConnsLocked();
    }
    const bool answers_drained = DrainGatherAnswersLocked(kDrainForceAfter);
    // Endpoints that peers created to us (wireup) may still have protocol messages queued;
    // UCX 1.13 asserts when ucp_worker_destroy purges a queued wireup reply, so flush the
    // worker first (bounded: a dead peer's endpoint fails instead of blocking the flush).
    ucp_request_param_t flush_param{};
    ucs_status_ptr_t flush = ucp_worker_flush_nbx(worker_, &flush_param);
    if (flush != nullptr && !UCS_PTR_IS_ERR(flush)) {
      const absl::Time flush_deadline = absl::Now() + kDrainForceAfter;
      while (ucp_request_check_status(flush) == UCS_INPROGRESS && absl::Now() < flush_deadline) {
        ucp_worker_progress(worker_);
      }
      if (ucp_request_check_status(flush) != UCS_INPROGRESS) ucp_request_free(flush);
    }
    DestroyStagingLocked();
    for (LocalRegion& r : regions_) {
      r.mirror_pins.reset();  // unpins the mirror before it is unmapped
      ucp_mem_unmap(context_, r.memh);
    }
    regions_.clear();
    if (!answers_drained) {
      // UCX 1.13 would abort the process in ucp_worker_destroy: leave the worker, the context
      // and the answers' buffers to the process exit instead.
      LOG(WARNING) << answers_.size()
                   << " gather answers to vanished readers never completed: the UCX worker is "
                      "left to the process exit";
      for (auto& [raw, answer] : answers_) answer.release();
      worker_ = nullptr;
      context_ = nullptr;
    } else {
      ucp_worker_destroy(worker_);  // also drops endpoints that did not close in time
      worker_ = nullptr;
    }
    gathers_.clear();  // receives the worker dropped unfinished
    answers_.clear();
  }
  if (context_ != nullptr) ucp_cleanup(context_);
  if (wake_fd_ >= 0) close(wake_fd_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
}

absl::StatusOr<uint32_t> UcxAgentImpl::RegisterMemory(void* base, uint64_t length,
                                                      tandem::v1::MemoryKind kind) {
  if (base == nullptr || length == 0) {
    return absl::InvalidArgumentError("RegisterMemory: null base or zero length");
  }
  ucs_memory_type_t memory_type = UCS_MEMORY_TYPE_HOST;
  if (kind == tandem::v1::MEMORY_KIND_CUDA) {
    memory_type = UCS_MEMORY_TYPE_CUDA;
  } else if (kind != tandem::v1::MEMORY_KIND_HOST) {
    return absl::InvalidArgumentError("RegisterMemory: unspecified memory kind");
  }
  absl::MutexLock lock(&mu_);
  if (regions_.size() >= static_cast<size_t>(tandem::v1::kMaxMemoryRegions)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("at most ", tandem::v1::kMaxMemoryRegions, " memory regions"));
  }
  if (kind == tandem::v1::MEMORY_KIND_CUDA && !cuda_supported_) {
    if (!options_.stage_cuda_memory) {
      return absl::UnimplementedError(
          "UCX reports no CUDA memory support: set UcxAgentOptions::stage_cuda_memory to stage "
          "GPU memory through host buffers (the source must then SyncForRemoteRead its blocks)");
    }
    return RegisterStagedCudaLocked(static_cast<char*>(base), length);
  }
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
  params.address = base;
  params.length = length;
  params.memory_type = memory_type;
  ucp_mem_h memh = nullptr;
  UCX_RETURN_IF_ERROR(ucp_mem_map(context_, &params, &memh));
  return AddRegionLocked(static_cast<char*>(base), length, memh, kind);
}

absl::StatusOr<std::pair<void*, uint32_t>> UcxAgentImpl::AllocateMemory(
    uint64_t length, tandem::v1::MemoryKind kind) {
  if (length == 0) return absl::InvalidArgumentError("AllocateMemory: zero length");
  if (kind == tandem::v1::MEMORY_KIND_CUDA) {
    return absl::UnimplementedError("AllocateMemory: host memory only");
  }
  if (kind != tandem::v1::MEMORY_KIND_HOST) {
    return absl::InvalidArgumentError("AllocateMemory: unspecified memory kind");
  }
  absl::MutexLock lock(&mu_);
  if (regions_.size() >= static_cast<size_t>(tandem::v1::kMaxMemoryRegions)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("at most ", tandem::v1::kMaxMemoryRegions, " memory regions"));
  }
  ucp_mem_h memh = nullptr;
  ASSIGN_OR_RETURN(char* base, MapSharedHostMemory(length, &memh));
  absl::StatusOr<uint32_t> index = AddRegionLocked(base, length, memh, kind);
  if (!index.ok()) return index.status();
  return std::make_pair(static_cast<void*>(base), *index);
}

absl::StatusOr<char*> UcxAgentImpl::MapSharedHostMemory(uint64_t length, ucp_mem_h* memh) {
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS | UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
  params.address = nullptr;
  params.length = length;
  params.flags = UCP_MEM_MAP_ALLOCATE;
  params.memory_type = UCS_MEMORY_TYPE_HOST;
  *memh = nullptr;
  UCX_RETURN_IF_ERROR(ucp_mem_map(context_, &params, memh));
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  if (ucs_status_t s = ucp_mem_query(*memh, &attr); s != UCS_OK || attr.length < length) {
    ucp_mem_unmap(context_, *memh);
    *memh = nullptr;
    return s != UCS_OK ? UCX_ERROR(s, "ucp_mem_query")
                       : absl::InternalError("ucp_mem_map allocated less than asked");
  }
  return static_cast<char*>(attr.address);
}

absl::StatusOr<uint32_t> UcxAgentImpl::AddRegionLocked(char* base, uint64_t length, ucp_mem_h memh,
                                                       tandem::v1::MemoryKind kind) {
  void* packed = nullptr;
  size_t packed_size = 0;
  if (ucs_status_t s = ucp_rkey_pack(context_, memh, &packed, &packed_size); s != UCS_OK) {
    ucp_mem_unmap(context_, memh);
    return UCX_ERROR(s, "ucp_rkey_pack");
  }
  std::string rkey(static_cast<const char*>(packed), packed_size);
  ucp_rkey_buffer_release(packed);
  regions_.push_back({base, length, memh, std::move(rkey), kind});
  return static_cast<uint32_t>(regions_.size() - 1);
}

absl::Status UcxAgentImpl::FillLocalDescriptor(tandem::v1::TransferHandshake* handshake) {
  absl::MutexLock lock(&mu_);
  handshake->set_transport(transport());
  handshake->set_worker_address(worker_address_);
  handshake->set_ucx_gather_key(AnswersGathersLocked() ? gather_key_ : "");
  handshake->clear_regions();
  for (const LocalRegion& r : regions_) {
    tandem::v1::MemoryRegion* region = handshake->add_regions();
    region->set_base_address(reinterpret_cast<uint64_t>(r.base));
    region->set_length(r.length);
    region->set_kind(r.kind);
    region->set_packed_rkey(r.packed_rkey);
  }
  return absl::OkStatus();
}

absl::Status UcxAgentImpl::AddPeer(const std::string& peer_name,
                                   const tandem::v1::TransferHandshake& peer) {
  const std::string who = absl::StrCat("peer ", peer_name);
  if (peer.transport() != transport()) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, " speaks transport '", peer.transport(), "', not 'ucx'"));
  }
  if (peer.worker_address().empty() ||
      peer.worker_address().size() > static_cast<size_t>(tandem::v1::kMaxTransportAddressBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": bad worker_address size ", peer.worker_address().size()));
  }
  if (peer.regions_size() > tandem::v1::kMaxMemoryRegions) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": too many regions"));
  }
  for (int i = 0; i < peer.regions_size(); ++i) {
    const tandem::v1::MemoryRegion& r = peer.regions(i);
    if (r.packed_rkey().empty() ||
        r.packed_rkey().size() > static_cast<size_t>(tandem::v1::kMaxPackedRkeyBytes) ||
        r.length() == 0 || r.base_address() + r.length() < r.base_address()) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": malformed region ", i));
    }
  }

  absl::MutexLock lock(&mu_);
  auto conn = std::make_unique<Conn>();
  conn->agent = this;
  conn->name = peer_name;
  conn->gather_key = peer.ucx_gather_key();
  conn->gather =
      conn->gather_key.size() == kGatherKeyBytes && options_.remote_gather && options_.enable_am;
  const ucp_address_t* address =
      reinterpret_cast<const ucp_address_t*>(peer.worker_address().data());
  // The endpoint that detects the peer's death: the data endpoint itself, or a separate
  // monitor (then the data endpoint has no error handling, so UCX may use shared memory).
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = address;
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &UcxAgentImpl::OnEndpointError;
  params.err_handler.arg = conn.get();
  ucp_ep_h* watched = options_.separate_data_endpoint ? &conn->monitor_ep : &conn->ep;
  if (ucs_status_t s = ucp_ep_create(worker_, &params, watched); s != UCS_OK) {
    return UCX_ERROR(s, "ucp_ep_create");
  }
  if (options_.separate_data_endpoint) {
    ucp_ep_params_t data{};
    data.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    data.address = address;
    data.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    if (ucs_status_t s = ucp_ep_create(worker_, &data, &conn->ep); s != UCS_OK) {
      conn->ep = nullptr;
      Conn* raw = conn.get();
      conns_.push_back(std::move(conn));
      const absl::Status error = UCX_ERROR(s, "ucp_ep_create");
      StopConnLocked(raw, error);  // the reaper closes the monitor
      Wake();
      return error;
    }
  }
  absl::Status unpacked = absl::OkStatus();
  for (const tandem::v1::MemoryRegion& r : peer.regions()) {
    ucp_rkey_h rkey = nullptr;
    ucp_ep_h ep = conn->ep;
    ucs_status_t s = ucp_ep_rkey_unpack(ep, r.packed_rkey().data(), &rkey);
    void* mapped = nullptr;
    if (s == UCS_OK && conn->monitor_ep != nullptr &&
        ucp_rkey_ptr(rkey, r.base_address(), &mapped) != UCS_OK) {
      // Not directly mapped: a GET on the data endpoint would be an active-message exchange
      // that never fails if the peer dies. Such regions are read through the monitor.
      ucp_rkey_destroy(rkey);
      ep = conn->monitor_ep;
      s = ucp_ep_rkey_unpack(ep, r.packed_rkey().data(), &rkey);
    }
    const bool direct = s == UCS_OK && ep == conn->ep && mapped != nullptr;
    // The peer's segment is mapped here lazily: the first GET of each page would take a page
    // fault (about as long as copying the page). Map the page tables ahead: all of it now, once
    // per connection, or granule by granule as requests first read them (a peer's CUDA mirror
    // holds only the blocks it synced; populating the rest would allocate it).
    const uint64_t granule = options_.cuda_mirror_pin_granule_bytes;
    if (direct && granule == 0) PopulateMapping(mapped, r.length()).IgnoreError();
    if (s != UCS_OK) {
      unpacked = absl::InvalidArgumentError(
          absl::StrCat(who, ": cannot unpack rkey: ", ucs_status_string(s)));
      break;
    }
    conn->regions.push_back(
        {r.base_address(), r.length(), rkey, ep, direct ? static_cast<char*>(mapped) : nullptr});
    if (direct && granule > 0) {
      conn->regions.back().populated = std::make_unique<HostPinGranules>(
          static_cast<char*>(mapped), r.length(), granule, PopulateMapping, [](void*) {});
    }
    conn->region_bytes.push_back(r.length());
  }
  Conn* raw = conn.get();
  conns_.push_back(std::move(conn));
  if (!unpacked.ok()) {
    StopConnLocked(raw, unpacked);  // the reaper closes the endpoint
    Wake();
    return unpacked;
  }
  // Wait until the endpoint is wired up (bounded). Besides reporting a refused connection
  // here, this keeps wireup messages from sitting in queues: UCX 1.13 aborts the process when
  // a TCP endpoint fails while a wireup reply is still queued on it.
  raw->pinned = true;  // WaitConnectedLocked unlocks: the reaper must not free it meanwhile
  // The monitor first: it is the endpoint that reports a dead or unreachable peer.
  absl::Status connected = absl::OkStatus();
  if (raw->monitor_ep != nullptr) connected = WaitConnectedLocked(raw, raw->monitor_ep);
  if (connected.ok()) connected = WaitConnectedLocked(raw, raw->ep);
  raw->pinned = false;
  if (!connected.ok()) {
    StopConnLocked(raw, connected);
    Wake();
    return connected;
  }
  // Re-adding a name replaces the connection; transfers on the old one end CANCELLED.
  if (auto it = peers_.find(peer_name); it != peers_.end()) {
    Conn* old = it->second;
    StopConnLocked(old, absl::CancelledError(absl::StrCat(who, " was re-added")));
    it->second = raw;
    MaybeFreeConnLocked(old);
  } else {
    peers_[peer_name] = raw;
  }
  Wake();
  return absl::OkStatus();
}

absl::Status UcxAgentImpl::WaitConnectedLocked(Conn* conn, ucp_ep_h ep) {
  ucp_request_param_t param{};
  ucs_status_ptr_t flush = ucp_ep_flush_nbx(ep, &param);
  if (flush == nullptr) return absl::OkStatus();
  if (UCS_PTR_IS_ERR(flush)) {
    return absl::UnavailableError(absl::StrCat("cannot connect to peer ", conn->name, ": ",
                                               ucs_status_string(UCS_PTR_STATUS(flush))));
  }
  const absl::Time deadline = absl::Now() + options_.connect_timeout;
  ucs_status_t status = UCS_INPROGRESS;
  while ((status = ucp_request_check_status(flush)) == UCS_INPROGRESS &&
         conn->state == Conn::State::kActive && absl::Now() < deadline) {
    if (ucp_worker_progress(worker_) == 0) {
      // Let other callers in between; the progress thread may also drive the worker.
      mu_.Unlock();
      std::this_thread::yield();
      mu_.Lock();
    }
  }
  ucp_request_free(flush);  // allowed while in progress: UCX releases it on completion
  if (status == UCS_OK && conn->state == Conn::State::kActive) return absl::OkStatus();
  if (!conn->failure.ok()) return conn->failure;
  if (status == UCS_INPROGRESS) {
    return absl::UnavailableError(absl::StrCat("connecting to peer ", conn->name,
                                               " timed out after ",
                                               absl::FormatDuration(options_.connect_timeout)));
  }
  return absl::UnavailableError(
      absl::StrCat("cannot connect to peer ", conn->name, ": ", ucs_status_string(status)));
}

void UcxAgentImpl::RemovePeer(const std::string& peer_name) {
  absl::MutexLock lock(&mu_);
  auto it = peers_.find(peer_name);
  if (it == peers_.end()) return;
  Conn* conn = it->second;
  StopConnLocked(conn, absl::CancelledError(absl::StrCat("peer ", peer_name, " removed")));
  peers_.erase(it);
  MaybeFreeConnLocked(conn);
  Wake();
}

absl::StatusOr<TransferId> UcxAgentImpl::PostRead(const std::string& peer_name,
                                                  absl::Span<const CopyOp> ops) {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> local_bytes;
  ASSIGN_OR_RETURN(Conn * conn, PostTargetLocked("PostRead", peer_name, &local_bytes));
  if (absl::Status s = ValidateCopyOps(ops, local_bytes, conn->region_bytes); !s.ok()) return s;
  std::vector<StridedCopyOp> rows;
  rows.reserve(ops.size());
  for (const CopyOp& op : CoalesceCopyOps(ops)) rows.push_back(AsStrided(op));
  return AddTransferLocked(conn, std::move(rows), peer_name);
}

absl::StatusOr<UcxAgentImpl::Conn*> UcxAgentImpl::PostTargetLocked(
    const char* what, const std::string& peer_name, std::vector<uint64_t>* local_bytes) {
  auto it = peers_.find(peer_name);
  if (it == peers_.end()) {
    return absl::NotFoundError(absl::StrCat(what, ": unknown peer '", peer_name, "'"));
  }
  for (const LocalRegion& r : regions_) local_bytes->push_back(r.length);
  return it->second;
}

bool UcxAgentImpl::AllRegionsMappedLocked(const Conn& conn) const {
  if (!options_.direct_copy || conn.regions.empty()) return false;
  for (const RemoteRegion& r : conn.regions) {
    if (r.mapped == nullptr) return false;
  }
  return true;
}

bool UcxAgentImpl::CanReadStrided(const std::string& peer_name, uint32_t local_region) {
  absl::MutexLock lock(&mu_);
  auto it = peers_.find(peer_name);
  return it != peers_.end() && it->second->state == Conn::State::kActive &&
         local_region < regions_.size() &&
         (AllRegionsMappedLocked(*it->second) || it->second->gather);
}

absl::StatusOr<TransferId> UcxAgentImpl::PostStridedRead(const std::string& peer_name,
                                                         absl::Span<const StridedCopyOp> ops) {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> local_bytes;
  ASSIGN_OR_RETURN(Conn * conn, PostTargetLocked("PostStridedRead", peer_name, &local_bytes));
  if (absl::Status s = ValidateStridedCopyOps(ops, local_bytes, conn->region_bytes); !s.ok()) {
    return s;
  }
  if (conn->state == Conn::State::kActive && !AllRegionsMappedLocked(*conn) && !conn->gather) {
    return absl::UnimplementedError(absl::StrCat(
        "PostStridedRead: peer '", peer_name,
        "' is not mapped for direct copies (another host, or direct_copy off) and answers no "
        "gathers (remote_gather or active messages off): UCX has no strided GET"));
  }
  for (const StridedCopyOp& op : ops) {
    const uint64_t limit = regions_[op.local_region].device != nullptr
                               ? std::min(options_.max_request_bytes, options_.cuda_staging_bytes)
                               : options_.max_request_bytes;
    if (op.row_bytes > limit) {
      return absl::InvalidArgumentError(absl::StrCat("PostStridedRead: rows of ", op.row_bytes,
                                                     " bytes exceed one request of ", limit));
    }
  }
  return AddTransferLocked(conn, CoalesceStridedCopyOps(ops), peer_name);
}

TransferId UcxAgentImpl::AddTransferLocked(Conn* conn, std::vector<StridedCopyOp> ops,
                                           const std::string& peer_name) {
  auto owned = std::make_unique<Transfer>();
  owned->conn = conn;
  owned->ops = std::move(ops);
  owned->total_bytes = TotalBytes(owned->ops);
  Transfer* t = transfers_.Add(std::move(owned));
  if (conn->state != Conn::State::kActive) {  // only failed endpoints stay in peers_
    t->error = absl::UnavailableError(
        absl::StrCat("peer ", peer_name, " failed earlier: ", conn->failure.message()));
    MaybeEndLocked(*t);
  } else {
    post_queue_.push_back(t->id);
    Wake();
  }
  return t->id;
}

absl::StatusOr<bool> UcxAgentImpl::CheckTransfer(TransferId id) {
  absl::MutexLock lock(&mu_);
  return transfers_.Check(id);
}

void UcxAgentImpl::Cancel(TransferId id) {
  absl::MutexLock lock(&mu_);
  Transfer* t = transfers_.Find(id);
  if (t == nullptr || t->ended) return;
  t->cancel_requested = true;
  StopTransferLocked(*t, absl::CancelledError(absl::StrCat("transfer ", id, " cancelled")));
}

TransferAgentStats UcxAgentImpl::Stats() const {
  absl::MutexLock lock(&mu_);
  TransferAgentStats stats = stats_;
  stats.peers = peers_.size();
  return stats;
}

}  // namespace tandem::kvtransfer
