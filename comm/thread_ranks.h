// RunThreadRanks: the ranks of one process group as threads of a test process (Gloo on loopback,
// every collective counted), for the in-process multi-rank tests of comm's users.
//
//   RunThreadRanks(2, [&](int rank, CountingProcessGroup& group) { ... });
#ifndef TANDEM_COMM_THREAD_RANKS_H_
#define TANDEM_COMM_THREAD_RANKS_H_

#include <functional>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "comm/counting_process_group.h"
#include "comm/gloo_process_group.h"
#include "comm/tcp_store.h"
#include "gtest/gtest.h"

namespace tandem::comm {

// Serves a TCP store on 127.0.0.1 (any free port), runs body(rank, group) on `world_size`
// threads, rank r's group counting a GlooProcessGroup of rank r, and joins them. A store or a
// group that cannot start is a gtest failure (that rank's body does not run); callers check
// ::testing::Test::HasFailure() before reading the ranks' results.
inline void RunThreadRanks(int world_size,
                           const std::function<void(int, CountingProcessGroup&)>& body,
                           absl::Duration timeout = absl::Seconds(60)) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      GlooGroupOptions options;
      options.rank = r;
      options.world_size = world_size;
      options.store_port = (*server)->port();
      options.serve_store = false;
      options.timeout = timeout;
      auto gloo = GlooProcessGroup::Create(options);
      ASSERT_TRUE(gloo.ok()) << gloo.status();
      CountingProcessGroup counting(gloo->get());
      body(r, counting);
    });
  }
  for (std::thread& t : threads) t.join();
}

}  // namespace tandem::comm

#endif  // TANDEM_COMM_THREAD_RANKS_H_
