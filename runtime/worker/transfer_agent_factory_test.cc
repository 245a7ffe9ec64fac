#include "runtime/worker/transfer_agent_factory.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "absl/status/status.h"
#include "tandem/v1/kv.pb.h"

namespace tandem::runtime {
namespace {

TEST(TransferAgentFactoryTest, UnknownTransportNamesTheChoices) {
  TransferAgentFlags flags;
  flags.transport = "rdma";
  auto agent = MakeTransferAgent(flags);
  ASSERT_EQ(agent.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(agent.status().message().find("ucx or nccl"), absl::string_view::npos)
      << agent.status();
  EXPECT_NE(agent.status().message().find("'rdma'"), absl::string_view::npos) << agent.status();
}

TEST(TransferAgentFactoryTest, NcclNeedsADevicePool) {
  TransferAgentFlags flags;
  flags.transport = "nccl";
  flags.cuda_pool = false;
  auto agent = MakeTransferAgent(flags);
  ASSERT_EQ(agent.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(agent.status().message().find("--backend=cuda"), absl::string_view::npos)
      << agent.status();
}

TEST(TransferAgentFactoryTest, AUcxDeviceThisHostCannotSeeFailsAtStartup) {
  // A sysfs that lists only "eth7" (as a container with another namespace's /sys would).
  const std::string sysfs = ::testing::TempDir() + "/fake-sys-class-net";
  std::filesystem::create_directories(sysfs + "/eth7");
  TransferAgentFlags flags;
  flags.sysfs_net_dir = sysfs;
  flags.ucx_net_device = "veth-gone0";
  auto agent = MakeTransferAgent(flags);
  ASSERT_EQ(agent.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(agent.status().message().find("'veth-gone0'"), absl::string_view::npos);
  EXPECT_NE(agent.status().message().find("eth7"), absl::string_view::npos) << agent.status();
  flags.ucx_net_device = "all";  // UCX picks: nothing to check
  EXPECT_NE(MakeTransferAgent(flags).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TransferAgentFactoryTest, UcxOnLoopback) {
  TransferAgentFlags flags;
  auto agent = MakeTransferAgent(flags);
  ASSERT_TRUE(agent.ok()) << agent.status();
  EXPECT_EQ((*agent)->transport(), "ucx");
  tandem::v1::TransferHandshake handshake;
  ASSERT_TRUE((*agent)->FillLocalDescriptor(&handshake).ok());
  EXPECT_EQ(handshake.transport(), "ucx");
}

// With a GPU (CUDA build) the NCCL agent comes up on the configured control host; without one
// the factory reports why (no CUDA in the build, or the CUDA runtime's error), never crashes.
TEST(TransferAgentFactoryTest, NcclOnADevicePool) {
  TransferAgentFlags flags;
  flags.transport = "nccl";
  flags.cuda_pool = true;
  flags.nccl_control_host = "127.0.0.1";
  auto agent = MakeTransferAgent(flags);
  if (!agent.ok()) {
    EXPECT_NE(agent.status().code(), absl::StatusCode::kInvalidArgument) << agent.status();
    EXPECT_FALSE(agent.status().message().empty());
    GTEST_SKIP() << "no NCCL agent here: " << agent.status();
  }
  EXPECT_EQ((*agent)->transport(), "nccl");
  tandem::v1::TransferHandshake handshake;
  ASSERT_TRUE((*agent)->FillLocalDescriptor(&handshake).ok());
  EXPECT_EQ(handshake.transport(), "nccl");
  EXPECT_EQ(handshake.worker_address().rfind("127.0.0.1:", 0), 0u) << handshake.worker_address();
}

}  // namespace
}  // namespace tandem::runtime
