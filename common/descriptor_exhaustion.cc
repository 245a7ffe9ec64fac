#include "common/descriptor_exhaustion.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "absl/time/clock.h"

namespace tandem {

int ConnectWhileOutOfDescriptors(int port, absl::Duration hold) {
  rlimit saved;
  if (getrlimit(RLIMIT_NOFILE, &saved) != 0) return -1;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);  // connected once the table is full
  if (fd < 0) return -1;
  rlimit low = saved;
  low.rlim_cur = static_cast<rlim_t>(fd) + 64;  // past every descriptor open now
  if (setrlimit(RLIMIT_NOFILE, &low) != 0) {
    close(fd);
    return -1;
  }
  std::vector<int> fillers;
  for (int f; (f = open("/dev/null", O_RDONLY)) >= 0;) fillers.push_back(f);
  const bool full = errno == EMFILE;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool connected = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  absl::SleepFor(hold);
  for (int f : fillers) close(f);
  const bool restored = setrlimit(RLIMIT_NOFILE, &saved) == 0;
  if (!full || !connected || !restored) {
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace tandem
