#include "runtime/parallel/plan_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <string>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"

namespace tandem::runtime {
namespace {

constexpr uint64_t kPlanSegmentMagic = 0x314e4c50444e4154;  // "TANDPLN1"

std::string Errno(const char* what) { return absl::StrCat(what, ": ", std::strerror(errno)); }

}  // namespace

absl::StatusOr<std::unique_ptr<PlanSegment>> PlanSegment::Create(int num_ranks) {
  if (num_ranks < 2 || num_ranks > kPlanSegmentMaxRanks) {
    return absl::InvalidArgumentError(absl::StrCat("plan segment: ", num_ranks, " ranks"));
  }
  absl::BitGen gen;
  const std::string name =
      absl::StrCat("/tandem-plan-", getpid(), "-", absl::Uniform<uint64_t>(gen));
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return absl::UnavailableError(Errno("plan segment: shm_open"));
  shm_unlink(name.c_str());  // from here on only descriptors and mappings keep it
  if (ftruncate(fd, sizeof(PlanSegmentLayout)) != 0) {
    const std::string error = Errno("plan segment: ftruncate");
    close(fd);
    return absl::UnavailableError(error);
  }
  void* mem = mmap(nullptr, sizeof(PlanSegmentLayout), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mem == MAP_FAILED) {
    const std::string error = Errno("plan segment: mmap");
    close(fd);
    return absl::UnavailableError(error);
  }
  // ftruncate zeroed the memory: every atomic starts at 0.
  auto* layout = static_cast<PlanSegmentLayout*>(mem);
  layout->num_ranks = num_ranks;
  layout->leader_pid = getpid();
  layout->magic = kPlanSegmentMagic;
  return std::unique_ptr<PlanSegment>(new PlanSegment(fd, layout));
}

absl::StatusOr<std::unique_ptr<PlanSegment>> PlanSegment::Attach(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0) return absl::InvalidArgumentError(Errno("plan segment: fstat"));
  if (st.st_size != static_cast<off_t>(sizeof(PlanSegmentLayout))) {
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("plan segment: fd ", fd, " has ", st.st_size, " bytes, not a plan segment"));
  }
  void* mem = mmap(nullptr, sizeof(PlanSegmentLayout), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const std::string error = mem == MAP_FAILED ? Errno("plan segment: mmap") : "";
  close(fd);
  if (mem == MAP_FAILED) return absl::UnavailableError(error);
  auto* layout = static_cast<PlanSegmentLayout*>(mem);
  if (layout->magic != kPlanSegmentMagic) {
    munmap(mem, sizeof(PlanSegmentLayout));
    return absl::InvalidArgumentError("plan segment: bad magic");
  }
  return std::unique_ptr<PlanSegment>(new PlanSegment(-1, layout));
}

PlanSegment::~PlanSegment() {
  munmap(layout_, sizeof(PlanSegmentLayout));
  if (fd_ >= 0) close(fd_);
}

}  // namespace tandem::runtime
