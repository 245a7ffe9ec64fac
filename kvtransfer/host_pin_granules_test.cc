// HostPinGranules with fake pin / unpin calls that record what they were asked: each granule a
// copy touches is pinned once, exactly over its own bytes, refused pins are not retried, and
// the destructor unpins what was pinned. Ranges are random on each run.
#include "kvtransfer/host_pin_granules.h"

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::kvtransfer {
namespace {

struct FakePins {
  std::map<char*, uint64_t> pinned;  // ptr -> bytes, currently pinned
  std::vector<char*> calls;          // every pin call, in order
  std::set<char*> refuse;            // pins of these pointers fail
  int unpins = 0;

  HostPinGranules::PinFn Pin() {
    return [this](void* ptr, uint64_t bytes) {
      char* p = static_cast<char*>(ptr);
      calls.push_back(p);
      if (refuse.contains(p)) return absl::InternalError("cudaHostRegister refused");
      EXPECT_FALSE(pinned.contains(p)) << "pinned twice";
      pinned[p] = bytes;
      return absl::OkStatus();
    };
  }
  HostPinGranules::UnpinFn Unpin() {
    return [this](void* ptr) {
      ++unpins;
      EXPECT_EQ(pinned.erase(static_cast<char*>(ptr)), 1u) << "unpinned what was not pinned";
    };
  }
};

TEST(HostPinGranulesTest, PinsEachTouchedGranuleOnceAndUnpinsThemAll) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  constexpr uint64_t kGranule = 4096;
  const uint64_t length = kGranule * (8 + rng() % 24) + rng() % kGranule;  // a short last one
  std::vector<char> buffer(length);
  FakePins fake;
  std::set<uint64_t> touched;  // granule indices any range touched
  {
    HostPinGranules pins(buffer.data(), length, kGranule, fake.Pin(), fake.Unpin());
    EXPECT_TRUE(fake.calls.empty()) << "nothing is pinned up front";
    for (int i = 0; i < 40; ++i) {
      const uint64_t offset = rng() % length;
      const uint64_t bytes = rng() % std::min<uint64_t>(length - offset + 1, 3 * kGranule);
      absl::StatusOr<bool> all = pins.PinCovering(offset, bytes);
      ASSERT_TRUE(all.ok()) << all.status();
      EXPECT_TRUE(*all);
      for (uint64_t g = offset / kGranule; bytes > 0 && g <= (offset + bytes - 1) / kGranule; ++g) {
        touched.insert(g);
      }
      ASSERT_EQ(fake.pinned.size(), touched.size()) << "exactly the granules touched so far";
    }
    uint64_t bytes_pinned = 0;
    for (uint64_t g : touched) {
      char* p = buffer.data() + g * kGranule;
      ASSERT_TRUE(fake.pinned.contains(p)) << g;
      EXPECT_EQ(fake.pinned[p], std::min(kGranule, length - g * kGranule)) << g;
      bytes_pinned += fake.pinned[p];
    }
    EXPECT_EQ(fake.calls.size(), touched.size()) << "no granule is pinned twice";
    const HostPinGranules::Stats s = pins.stats();
    EXPECT_EQ(s.granules_pinned, touched.size());
    EXPECT_EQ(s.bytes_pinned, bytes_pinned);
    EXPECT_EQ(s.granules_failed, 0u);
  }
  EXPECT_TRUE(fake.pinned.empty()) << "the destructor unpins every pinned granule";
  EXPECT_EQ(fake.unpins, static_cast<int>(touched.size()));
}

TEST(HostPinGranulesTest, ARefusedPinIsCountedNotRetriedAndNotAnError) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  constexpr uint64_t kGranule = 1024;
  std::vector<char> buffer(kGranule * 6);
  FakePins fake;
  const uint64_t bad = 1 + rng() % 4;
  fake.refuse.insert(buffer.data() + bad * kGranule);
  {
    HostPinGranules pins(buffer.data(), buffer.size(), kGranule, fake.Pin(), fake.Unpin());
    const uint64_t offset = bad * kGranule - 1 - rng() % 100;  // straddles bad - 1 .. bad + 1
    EXPECT_EQ(pins.PinCovering(offset, kGranule + 200).value_or(true), false);
    EXPECT_EQ(pins.PinCovering(bad * kGranule + rng() % kGranule, 1).value_or(true), false)
        << "still not pinned, not tried again";
    EXPECT_EQ(pins.PinCovering((bad + 1) * kGranule, kGranule).value_or(false), true)
        << "a pinned neighbour";
    EXPECT_EQ(fake.calls.size(), 3u) << "bad - 1, bad, bad + 1; the refused one once";
    EXPECT_EQ(pins.stats().granules_failed, 1u);
    EXPECT_EQ(pins.stats().granules_pinned, 2u);
    EXPECT_EQ(pins.PinCovering(buffer.size() - 10, 11).status().code(),
              absl::StatusCode::kOutOfRange);
    EXPECT_EQ(pins.PinCovering(buffer.size() + 1, 0).status().code(),
              absl::StatusCode::kOutOfRange);
    EXPECT_EQ(pins.PinCovering(buffer.size(), 0).value_or(false), true) << "empty, at the end";
  }
  EXPECT_EQ(fake.unpins, 2) << "only what was pinned is unpinned";
}

// What CUDA does with page-locked host memory (seen on an H200, nvidia-h200, 2026-11-28): one
// cudaMemcpy must lie inside one cudaHostRegister registration, else cudaErrorInvalidValue. With
// every granule pinned, copies cut by ForEachPiece each lie in one registration and together are
// exactly the range, in order; WithinOneGranule says when one copy (a DMA) may take the range
// whole. The granule size, the buffer and the ranges are random on each run.
TEST(HostPinGranulesTest, PiecesEachLieInOneRegistrationAndCoverTheRange) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const uint64_t granule = 512 * (1 + rng() % 8);
  const uint64_t length = granule * (4 + rng() % 12) + rng() % granule;
  std::vector<char> buffer(length);
  FakePins fake;
  HostPinGranules pins(buffer.data(), length, granule, fake.Pin(), fake.Unpin());
  ASSERT_EQ(pins.PinCovering(0, length).value_or(false), true);
  // The registration holding [p, p + n), if one does (cudaMemcpy's check).
  auto one_registration = [&](const char* p, uint64_t n) {
    for (const auto& [base, bytes] : fake.pinned) {
      if (p >= base && p + n <= base + bytes) return true;
    }
    return false;
  };
  for (int i = 0; i < 200; ++i) {
    const uint64_t offset = rng() % length;
    const uint64_t bytes = rng() % std::min<uint64_t>(length - offset + 1, 5 * granule);
    uint64_t next = offset;
    int calls = 0;
    const absl::Status copied = pins.ForEachPiece(offset, bytes, [&](uint64_t at, uint64_t n) {
      ++calls;
      EXPECT_EQ(at, next) << "pieces in order, no gap or overlap";
      EXPECT_GT(n, 0u);
      next = at + n;
      return one_registration(buffer.data() + at, n)
                 ? absl::OkStatus()
                 : absl::InvalidArgumentError("cudaErrorInvalidValue: spans two registrations");
    });
    ASSERT_TRUE(copied.ok()) << copied << " offset " << offset << " bytes " << bytes;
    EXPECT_EQ(next, offset + bytes) << "the pieces cover the range";
    const uint64_t granules_touched =
        bytes == 0 ? 0 : (offset + bytes - 1) / granule - offset / granule + 1;
    EXPECT_EQ(static_cast<uint64_t>(calls), granules_touched) << "one piece per granule";
    EXPECT_EQ(pins.WithinOneGranule(offset, bytes), one_registration(buffer.data() + offset, bytes))
        << "offset " << offset << " bytes " << bytes;
  }
  // A copy error stops the loop and is returned.
  int calls = 0;
  const absl::Status stopped = pins.ForEachPiece(0, 3 * granule, [&](uint64_t, uint64_t) {
    return ++calls == 2 ? absl::InternalError("copy failed") : absl::OkStatus();
  });
  EXPECT_EQ(stopped.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(calls, 2);
}

}  // namespace
}  // namespace tandem::kvtransfer
