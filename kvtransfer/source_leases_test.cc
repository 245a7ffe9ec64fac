// SourceLeases decides the KvTransferService's answers without gRPC: these tests drive it over a
// PullKvConnector's lease table (the service's own tests cover the RPCs on loopback).
#include "kvtransfer/source_leases.h"

#include <optional>
#include <string>

#include "gtest/gtest.h"
#include "kvtransfer/inprocess/inprocess_agent.h"
#include "kvtransfer/kv_handle.h"
#include "kvtransfer/pull_connector.h"
#include "tandem/v1/limits.h"

namespace tandem::kvtransfer {
namespace {

constexpr uint64_t kEpoch = 7;

class SourceLeasesTest : public ::testing::Test {
 protected:
  SourceLeasesTest()
      : agent_(std::make_shared<InProcessFabric>(), "p"),
        connector_(&agent_, Options()),
        leases_(&connector_, "p", kEpoch, absl::Seconds(30)) {}

  static PullKvConnectorOptions Options() {
    PullKvConnectorOptions options;
    options.block_bytes = 64;
    return options;
  }
  // A lease on 3 blocks of request "r", bound to `reader`; its handle.
  tandem::v1::KvHandle Grant(const std::string& reader) {
    std::optional<KvLease> lease = connector_.RequestFinished(1, "r", true, 3, absl::Seconds(10));
    EXPECT_TRUE(lease.has_value());
    EXPECT_TRUE(connector_.BindLease(lease->lease_id, {reader, "r", {4, 5, 6}, 40}).ok());
    return ToKvHandle({"p", kEpoch, 1, "p:1"}, *lease, {4, 5, 6}, 40, "r");
  }

  InProcessAgent agent_;
  PullKvConnector connector_;
  SourceLeases leases_;
};

TEST_F(SourceLeasesTest, HandshakeOnlyForABoundReader) {
  EXPECT_FALSE(leases_.AcceptsHandshakeFrom("d"));
  Grant("d");
  EXPECT_TRUE(leases_.AcceptsHandshakeFrom("d"));
  EXPECT_FALSE(leases_.AcceptsHandshakeFrom("e"));
}

TEST_F(SourceLeasesTest, ReleaseByItsReaderOnly) {
  const tandem::v1::KvHandle h = Grant("d");
  absl::StatusOr<bool> other = leases_.Release("p", kEpoch, h.lease_id(), "e");
  EXPECT_EQ(other.status().code(), absl::StatusCode::kPermissionDenied);
  absl::StatusOr<bool> old = leases_.Release("p", kEpoch + 1, h.lease_id(), "d");
  ASSERT_TRUE(old.ok());
  EXPECT_FALSE(*old) << "another incarnation's lease is gone";
  absl::StatusOr<bool> released = leases_.Release("p", kEpoch, h.lease_id(), "d");
  ASSERT_TRUE(released.ok());
  EXPECT_TRUE(*released);
  absl::StatusOr<bool> again = leases_.Release("p", kEpoch, h.lease_id(), "d");
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(*again);
  EXPECT_EQ(connector_.Stats().leases_released, 1u);
}

TEST_F(SourceLeasesTest, RenewalIsCappedAtTheMaxLease) {
  const tandem::v1::KvHandle h = Grant("d");
  const absl::Time before = absl::Now();
  absl::StatusOr<std::optional<absl::Time>> renewed =
      leases_.Renew("p", kEpoch, h.lease_id(), "d", absl::Minutes(10));
  ASSERT_TRUE(renewed.ok());
  ASSERT_TRUE(renewed->has_value());
  EXPECT_GE(**renewed, before + absl::Seconds(30));
  EXPECT_LE(**renewed, absl::Now() + absl::Seconds(30));
  EXPECT_EQ(leases_.Renew("p", kEpoch, h.lease_id(), "e", absl::Seconds(1)).status().code(),
            absl::StatusCode::kPermissionDenied);
  absl::StatusOr<std::optional<absl::Time>> unknown =
      leases_.Renew("p", kEpoch, h.lease_id() + 1, "d", absl::Seconds(1));
  ASSERT_TRUE(unknown.ok());
  EXPECT_FALSE(unknown->has_value());
}

TEST_F(SourceLeasesTest, AuthorizeReadComparesTheHandleWithWhatWasIssued) {
  tandem::v1::KvHandle h = Grant("d");
  EXPECT_TRUE(leases_.AuthorizeRead(h, "d").ok());
  EXPECT_EQ(leases_.AuthorizeRead(h, "e").code(), absl::StatusCode::kPermissionDenied);
  tandem::v1::KvHandle edited = h;
  edited.set_block_ids(0, 9);
  EXPECT_EQ(leases_.AuthorizeRead(edited, "d").code(), absl::StatusCode::kPermissionDenied);
  tandem::v1::KvHandle stale = h;
  stale.set_epoch(kEpoch - 1);
  EXPECT_EQ(leases_.AuthorizeRead(stale, "d").code(), absl::StatusCode::kFailedPrecondition);
  tandem::v1::KvHandle elsewhere = h;
  elsewhere.set_worker_id("q");
  EXPECT_EQ(leases_.AuthorizeRead(elsewhere, "d").code(), absl::StatusCode::kFailedPrecondition);
  tandem::v1::KvHandle big = h;
  for (int i = 0; i <= tandem::v1::kMaxKvHandleBlocks; ++i) big.add_block_ids(i);
  EXPECT_EQ(leases_.AuthorizeRead(big, "d").code(), absl::StatusCode::kInvalidArgument);
  tandem::v1::KvHandle gone = h;
  gone.set_lease_id(h.lease_id() + 1);
  EXPECT_EQ(leases_.AuthorizeRead(gone, "d").code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tandem::kvtransfer
