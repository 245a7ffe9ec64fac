// CustomAllReduce's setup and teardown, host code only (the kernels and their launches are in
// custom_all_reduce.cu): every rank allocates its IPC buffer, the ranks exchange handles through
// the process group, check they share one host and have peer access, map each other's buffers,
// and agree (every rank, or none, uses the custom path).
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/custom_all_reduce.h"
#include "common/status_macros.h"

namespace tandem::comm {
namespace {

// What a rank tells the others at creation.
struct RankInfo {
  char host[192];  // hostname + boot id: equal only for processes of one running machine
  char bus_id[32];
  cudaIpcMemHandle_t handle;
  int32_t allocated;
};

std::string HostKey() {
  char name[128] = {};
  gethostname(name, sizeof(name) - 1);
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string id((std::istreambuf_iterator<char>(boot)), {});
  return absl::StrCat(name, "/", id).substr(0, 191);
}

// Agreement: OK on every rank, or the number of ranks that said no.
absl::StatusOr<int> CountRefusals(ProcessGroup* group, bool ok) {
  float refusals = ok ? 0.0f : 1.0f;
  RETURN_IF_ERROR(group->AllReduceSum(absl::MakeSpan(&refusals, 1)));
  return static_cast<int>(refusals);
}

}  // namespace

absl::StatusOr<std::unique_ptr<CustomAllReduce>> CustomAllReduce::Create(
    ProcessGroup* group, const CustomAllReduceOptions& options, std::string* why_not) {
  const int world = group->size(), rank = group->rank();
  if (!(world == 2 || world == 4 || world == 8)) {
    *why_not = absl::StrCat("world size ", world, " (2, 4 or 8 only)");
    return nullptr;
  }
  std::unique_ptr<CustomAllReduce> ar(new CustomAllReduce(rank, world, options));
  ar->peers_.assign(world, nullptr);
  const int64_t bytes = AllocationBytes(options.limits.max_bytes);
  RankInfo mine{};
  std::string local_problem;
  const std::string host = HostKey();
  std::memcpy(mine.host, host.data(), host.size());
  if (cudaSetDevice(options.device) != cudaSuccess ||
      cudaDeviceGetPCIBusId(mine.bus_id, sizeof(mine.bus_id), options.device) != cudaSuccess ||
      cudaMalloc(&ar->own_, bytes) != cudaSuccess ||
      cudaMemset(ar->own_, 0, bytes) != cudaSuccess ||
      cudaIpcGetMemHandle(&mine.handle, ar->own_) != cudaSuccess ||
      cudaHostAlloc(reinterpret_cast<void**>(const_cast<int**>(&ar->abort_host_)), sizeof(int),
                    cudaHostAllocMapped) != cudaSuccess ||
      cudaHostGetDevicePointer(reinterpret_cast<void**>(&ar->abort_device_),
                               const_cast<int*>(ar->abort_host_), 0) != cudaSuccess) {
    cudaGetLastError();
    local_problem = absl::StrCat("rank ", rank, ": IPC buffer allocation failed");
  } else {
    *ar->abort_host_ = 0;
    mine.allocated = 1;
  }
  std::vector<RankInfo> all(world);
  for (int r = 0; r < world; ++r) {
    all[r] = mine;
    RETURN_IF_ERROR(
        group->Broadcast(absl::MakeSpan(reinterpret_cast<char*>(&all[r]), sizeof(RankInfo)), r));
  }
  for (int r = 0; r < world && local_problem.empty(); ++r) {
    if (!all[r].allocated) local_problem = absl::StrCat("rank ", r, " has no IPC buffer");
    if (std::strncmp(all[r].host, mine.host, sizeof(mine.host)) != 0) {
      local_problem = absl::StrCat("ranks ", rank, " and ", r, " are on different hosts");
    }
    if (r == rank || !local_problem.empty()) continue;
    int device = -1, can = 0;
    if (std::strncmp(all[r].bus_id, mine.bus_id, sizeof(mine.bus_id)) == 0) {
      local_problem = absl::StrCat("ranks ", rank, " and ", r, " share GPU ", mine.bus_id);
    } else if (cudaDeviceGetByPCIBusId(&device, all[r].bus_id) != cudaSuccess ||
               cudaDeviceCanAccessPeer(&can, options.device, device) != cudaSuccess || !can) {
      cudaGetLastError();
      local_problem = absl::StrCat("rank ", rank, " cannot access rank ", r, "'s GPU ",
                                   all[r].bus_id, " (not visible or no peer access)");
    }
  }
  ASSIGN_OR_RETURN(int refusals, CountRefusals(group, local_problem.empty()));
  for (int r = 0; r < world && refusals == 0; ++r) {
    if (r == rank) {
      ar->peers_[r] = ar->own_;
    } else if (cudaIpcOpenMemHandle(&ar->peers_[r], all[r].handle,
                                    cudaIpcMemLazyEnablePeerAccess) != cudaSuccess) {
      cudaGetLastError();
      ar->peers_[r] = nullptr;
      local_problem = absl::StrCat("rank ", rank, ": cudaIpcOpenMemHandle of rank ", r, " failed");
      break;
    }
  }
  if (refusals == 0) {
    ASSIGN_OR_RETURN(refusals, CountRefusals(group, local_problem.empty()));
  }
  if (refusals > 0) {
    *why_not = local_problem.empty() ? absl::StrCat(refusals, " rank(s) could not set it up")
                                     : local_problem;
    return nullptr;  // the destructor unmaps and frees what exists
  }
  // Every rank's flags are zero before anyone signals into them.
  RETURN_IF_ERROR(group->Barrier());
  return ar;
}

CustomAllReduce::~CustomAllReduce() {
  cudaSetDevice(options_.device);
  for (int r = 0; r < static_cast<int>(peers_.size()); ++r) {
    if (r != rank_ && peers_[r] != nullptr) cudaIpcCloseMemHandle(peers_[r]);
  }
  if (own_ != nullptr) cudaFree(own_);
  if (abort_host_ != nullptr) cudaFreeHost(const_cast<int*>(abort_host_));
}

}  // namespace tandem::comm
