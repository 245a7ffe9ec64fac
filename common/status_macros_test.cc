#include "common/status_macros.h"

#include <memory>
#include <string>

#include "gtest/gtest.h"

namespace tandem {
namespace {

absl::Status FailIfNegative(int x) {
  if (x < 0) return absl::InvalidArgumentError("negative: " + std::to_string(x));
  return absl::OkStatus();
}

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::StatusOr<std::unique_ptr<int>> MakeBox(int x) {
  if (x == 0) return absl::NotFoundError("zero");
  return std::make_unique<int>(x);
}

absl::Status Chain(int x, int* side_effects) {
  RETURN_IF_ERROR(FailIfNegative(x));
  ++*side_effects;
  return absl::OkStatus();
}

absl::StatusOr<int> Quarter(int x) {
  ASSIGN_OR_RETURN(int half, Half(x));
  ASSIGN_OR_RETURN(int quarter, Half(half));  // two uses in one scope need distinct temporaries
  return quarter;
}

absl::Status UnboxInto(int x, int* out) {
  ASSIGN_OR_RETURN(std::unique_ptr<int> box, MakeBox(x));  // move-only values
  *out = *box;
  return absl::OkStatus();
}

absl::Status AssignExisting(int x, int* out) {
  int value = -1;
  ASSIGN_OR_RETURN(value, Half(x));
  *out = value;
  return absl::OkStatus();
}

TEST(StatusMacrosTest, ReturnIfErrorPropagatesAndStops) {
  int side_effects = 0;
  EXPECT_TRUE(Chain(3, &side_effects).ok());
  EXPECT_EQ(side_effects, 1);
  absl::Status s = Chain(-7, &side_effects);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "negative: -7");
  EXPECT_EQ(side_effects, 1) << "code after a failed RETURN_IF_ERROR must not run";
}

TEST(StatusMacrosTest, AssignOrReturnValuesAndErrors) {
  absl::StatusOr<int> q = Quarter(12);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(*q, 3);
  EXPECT_EQ(Quarter(6).status().code(), absl::StatusCode::kInvalidArgument);  // 6 -> 3 is odd
  EXPECT_EQ(Quarter(5).status().message(), "odd");
}

TEST(StatusMacrosTest, AssignOrReturnMoveOnlyAndExistingVariable) {
  int out = 0;
  ASSERT_TRUE(UnboxInto(41, &out).ok());
  EXPECT_EQ(out, 41);
  EXPECT_EQ(UnboxInto(0, &out).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(AssignExisting(10, &out).ok());
  EXPECT_EQ(out, 5);
  EXPECT_FALSE(AssignExisting(11, &out).ok());
  EXPECT_EQ(out, 5);
}

TEST(StatusMacrosTest, EvaluatesExpressionOnce) {
  int calls = 0;
  auto counted = [&]() -> absl::Status {
    ++calls;
    return absl::OkStatus();
  };
  auto body = [&]() -> absl::Status {
    RETURN_IF_ERROR(counted());
    return absl::OkStatus();
  };
  EXPECT_TRUE(body().ok());
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace tandem
