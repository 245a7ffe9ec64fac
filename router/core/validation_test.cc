#include "router/core/validation.h"

#include <cmath>
#include <limits>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "tandem/v1/limits.h"

namespace tandem::router {
namespace {

v1::GenerateRequest Valid() {
  v1::GenerateRequest r;
  r.set_request_id("id");
  for (uint32_t t : {1u, 2u, 3u}) r.add_prompt_token_ids(t);
  r.mutable_sampling()->set_max_tokens(4);
  r.mutable_sampling()->set_temperature(0.7f);
  r.mutable_sampling()->set_top_p(0.9f);
  return r;
}

void ExpectInvalid(const absl::Status& s, const std::string& mentions) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find(mentions), std::string::npos) << s;
}

TEST(ValidationTest, ShapeAcceptsLimitsAtTheEdge) {
  v1::GenerateRequest r = Valid();
  r.set_request_id(std::string(v1::kMaxIdBytes, 'a'));
  r.set_cache_salt(std::string(v1::kMaxIdBytes, 'b'));
  r.mutable_sampling()->set_temperature(v1::kMaxTemperature);
  r.mutable_sampling()->set_top_p(1.0f);
  for (int i = 0; i < v1::kMaxStopTokenIds; ++i) r.mutable_sampling()->add_stop_token_ids(i);
  EXPECT_TRUE(ValidateRequestShape(r).ok());
  r.mutable_sampling()->set_temperature(0.0f);
  r.mutable_sampling()->set_top_p(0.0f);  // 0 = off
  EXPECT_TRUE(ValidateRequestShape(r).ok());
}

TEST(ValidationTest, ShapeRejections) {
  v1::GenerateRequest r = Valid();
  r.clear_prompt_token_ids();
  ExpectInvalid(ValidateRequestShape(r), "empty");

  r = Valid();
  r.set_request_id(std::string(v1::kMaxIdBytes + 1, 'a'));
  ExpectInvalid(ValidateRequestShape(r), "request_id");

  r = Valid();
  r.set_cache_salt(std::string(v1::kMaxIdBytes + 1, 'a'));
  ExpectInvalid(ValidateRequestShape(r), "cache_salt");

  r = Valid();
  r.mutable_sampling()->set_max_tokens(0);
  ExpectInvalid(ValidateRequestShape(r), "max_tokens");

  for (float bad : {-1e-6f, v1::kMaxTemperature + 1.0f, std::nanf(""),
                    std::numeric_limits<float>::infinity()}) {
    r = Valid();
    r.mutable_sampling()->set_temperature(bad);
    ExpectInvalid(ValidateRequestShape(r), "temperature");
  }
  for (float bad : {-0.01f, 1.0001f, std::nanf("")}) {
    r = Valid();
    r.mutable_sampling()->set_top_p(bad);
    ExpectInvalid(ValidateRequestShape(r), "top_p");
  }
  r = Valid();
  for (int i = 0; i <= v1::kMaxStopTokenIds; ++i) r.mutable_sampling()->add_stop_token_ids(i);
  ExpectInvalid(ValidateRequestShape(r), "stop_token_ids");
}

TEST(ValidationTest, PromptAtTheTokenLimit) {
  v1::GenerateRequest r = Valid();
  r.clear_prompt_token_ids();
  r.mutable_prompt_token_ids()->Resize(v1::kMaxPromptTokens, 7);
  EXPECT_TRUE(ValidateRequestShape(r).ok());
  r.add_prompt_token_ids(7);
  ExpectInvalid(ValidateRequestShape(r), "limit");
}

TEST(ValidationTest, AgainstModelRandomPrompts) {
  std::random_device rd;
  const uint32_t seed = rd();
  SCOPED_TRACE(seed);
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 200; ++trial) {
    const uint32_t vocab = 1 + rng() % 5000;
    const uint32_t max_len = 2 + rng() % 300;
    v1::GenerateRequest r;
    const int len = 1 + static_cast<int>(rng() % (max_len - 1));
    int bad_index = -1;
    for (int i = 0; i < len; ++i) {
      uint32_t t = rng() % vocab;
      if (rng() % 50 == 0) {
        t = vocab + rng() % 10;
        if (bad_index < 0) bad_index = i;
      }
      r.add_prompt_token_ids(t);
    }
    const uint32_t room = max_len - len;
    r.mutable_sampling()->set_max_tokens(1 + rng() % (room + 5));
    const bool too_long = len + r.sampling().max_tokens() > max_len;
    absl::Status s = ValidateAgainstModel(r, ModelLimits{vocab, max_len});
    if (bad_index >= 0) {
      ExpectInvalid(s, "prompt_token_ids[" + std::to_string(bad_index) + "]");
    } else if (too_long) {
      ExpectInvalid(s, "max length");
    } else {
      EXPECT_TRUE(s.ok()) << s;
    }
  }
}

TEST(ValidationTest, StopIdsAgainstVocabAndNoOverflow) {
  v1::GenerateRequest r = Valid();
  r.mutable_sampling()->add_stop_token_ids(99);
  ExpectInvalid(ValidateAgainstModel(r, ModelLimits{99, 100}), "stop_token_ids[0]");
  EXPECT_TRUE(ValidateAgainstModel(r, ModelLimits{100, 100}).ok());
  // prompt + max_tokens must not wrap around in 32 bits.
  r.mutable_sampling()->set_max_tokens(0xFFFFFFFFu);
  ExpectInvalid(ValidateAgainstModel(r, ModelLimits{100, 0xFFFFFFFFu}), "max length");
}

TEST(ValidationTest, WorkerInfoAndHeartbeat) {
  v1::WorkerInfo info;
  info.set_worker_id("w");
  info.set_address("127.0.0.1:1");
  info.set_role(v1::WORKER_ROLE_DECODE);
  info.set_vocab_size(10);
  info.set_max_model_len(10);
  info.set_block_size(16);
  EXPECT_TRUE(ValidateWorkerInfo(info).ok());
  v1::WorkerInfo bad = info;
  bad.set_worker_id("");
  ExpectInvalid(ValidateWorkerInfo(bad), "worker_id");
  bad = info;
  bad.set_role(v1::WORKER_ROLE_UNSPECIFIED);
  ExpectInvalid(ValidateWorkerInfo(bad), "role");
  bad = info;
  bad.set_block_size(0);
  ExpectInvalid(ValidateWorkerInfo(bad), "block_size");
  bad = info;
  bad.set_address("");
  ExpectInvalid(ValidateWorkerInfo(bad), "address");

  v1::HeartbeatRequest hb;
  hb.set_worker_id("w");
  hb.mutable_added_block_hashes()->Resize(v1::kMaxHeartbeatBlockHashes, 1);
  EXPECT_TRUE(ValidateHeartbeat(hb).ok());
  hb.add_removed_block_hashes(1);
  hb.mutable_removed_block_hashes()->Resize(v1::kMaxHeartbeatBlockHashes + 1, 1);
  ExpectInvalid(ValidateHeartbeat(hb), "block hashes");
}

}  // namespace
}  // namespace tandem::router
