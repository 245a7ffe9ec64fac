// The KV handle's conversions: P's held blocks -> KvHandle -> D's RemoteKvSpec keeps every field,
// and D refuses handles it cannot use before anything is allocated.
#include "kvtransfer/kv_handle.h"

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tandem/v1/limits.h"

namespace tandem::kvtransfer {
namespace {

class RecordingLeases final : public LeaseClient {
 public:
  void RenewLeaseAsync(const std::string&, uint64_t, uint64_t, absl::Duration,
                       std::function<void(absl::StatusOr<absl::Time>)> done) override {
    done(absl::UnimplementedError("not used"));
  }
  void ReleaseLeaseAsync(const std::string&, uint64_t, uint64_t) override {}
};

TEST(KvHandleTest, HeldBlocksSurviveTheTripFromSourceToReader) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  KvSource source{"prefill-7", 1'700'000'000'123'456u, rng() | (uint64_t{rng()} << 32),
                  "10.0.0.5:7301"};
  KvLease lease{rng() | 1u, absl::FromUnixMillis(1'800'000'000'000)};
  std::vector<int32_t> blocks(1 + rng() % 50);
  for (int32_t& b : blocks) b = static_cast<int32_t>(rng() % 100000);
  const int64_t num_tokens = static_cast<int64_t>(blocks.size()) * 16 - rng() % 16;

  const tandem::v1::KvHandle handle = ToKvHandle(source, lease, blocks, num_tokens, "req-1");
  EXPECT_EQ(handle.worker_id(), source.worker_id);
  EXPECT_EQ(handle.request_id(), "req-1");
  const LeaseBinding presented = PresentedBinding(handle);
  EXPECT_EQ(presented.request_id, "req-1");
  EXPECT_EQ(presented.block_ids, blocks);
  EXPECT_EQ(presented.num_tokens, num_tokens);
  EXPECT_TRUE(presented.reader.empty());
  EXPECT_EQ(handle.epoch(), source.epoch);
  EXPECT_EQ(handle.layout_hash(), source.layout_hash);
  EXPECT_EQ(handle.transfer_endpoint(), source.transfer_endpoint);
  EXPECT_EQ(handle.lease_id(), lease.lease_id);
  ASSERT_TRUE(ValidateKvHandle(handle, source.layout_hash).ok());

  auto leases = std::make_shared<RecordingLeases>();
  const absl::Time load_deadline = absl::Now() + absl::Seconds(20);
  const RemoteKvSpec remote = ToRemoteKvSpec(handle, load_deadline, leases);
  EXPECT_EQ(remote.peer, source.worker_id);
  EXPECT_EQ(remote.epoch, source.epoch);
  EXPECT_EQ(remote.block_ids, blocks);
  EXPECT_EQ(remote.num_tokens, num_tokens);
  EXPECT_EQ(remote.lease_id, lease.lease_id);
  EXPECT_EQ(remote.lease_deadline, lease.deadline);
  EXPECT_EQ(remote.deadline, load_deadline);
  EXPECT_EQ(remote.lease_client, leases);
}

TEST(KvHandleTest, HandlesTheReaderCannotUseAreInvalidArgument) {
  KvSource source{"p", 1, 0xabc, "127.0.0.1:1"};
  tandem::v1::KvHandle good = ToKvHandle(source, KvLease{1, absl::Now()}, {1, 2}, 20, "r");
  ASSERT_TRUE(ValidateKvHandle(good, 0xabc).ok());

  const absl::Status other_layout = ValidateKvHandle(good, 0xdef);
  EXPECT_EQ(other_layout.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(other_layout.message().find("layout"), std::string::npos) << other_layout;

  tandem::v1::KvHandle no_source = good;
  no_source.clear_worker_id();
  EXPECT_EQ(ValidateKvHandle(no_source, 0xabc).code(), absl::StatusCode::kInvalidArgument);

  tandem::v1::KvHandle long_id = good;
  long_id.set_worker_id(std::string(tandem::v1::kMaxIdBytes + 1, 'x'));
  EXPECT_EQ(ValidateKvHandle(long_id, 0xabc).code(), absl::StatusCode::kInvalidArgument);

  tandem::v1::KvHandle long_request = good;
  long_request.set_request_id(std::string(tandem::v1::kMaxIdBytes + 1, 'x'));
  EXPECT_EQ(ValidateKvHandle(long_request, 0xabc).code(), absl::StatusCode::kInvalidArgument);

  tandem::v1::KvHandle too_many = good;
  for (int i = 0; i < tandem::v1::kMaxKvHandleBlocks; ++i) too_many.add_block_ids(3);
  EXPECT_EQ(ValidateKvHandle(too_many, 0xabc).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::kvtransfer
