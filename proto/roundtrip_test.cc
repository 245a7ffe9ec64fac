// Every tandem.v1 message survives serialize -> parse unchanged when filled with fresh random
// values in every field (via reflection, so new fields are covered automatically), and a
// message at every documented size limit still fits in kMaxGrpcMessageBytes.
#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <google/protobuf/util/message_differencer.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tandem/v1/kv.pb.h"
#include "tandem/v1/limits.h"
#include "tandem/v1/router.pb.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::v1 {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::FileDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

class RandomFiller {
 public:
  explicit RandomFiller(uint32_t seed) : rng_(seed) {}

  void Fill(Message* msg, int depth) {
    const Descriptor* d = msg->GetDescriptor();
    const Reflection* r = msg->GetReflection();
    for (int i = 0; i < d->field_count(); ++i) {
      const FieldDescriptor* f = d->field(i);
      if (f->is_repeated()) {
        const int n = static_cast<int>(rng_() % 5);
        for (int k = 0; k < n; ++k) AddOne(msg, r, f, depth);
      } else if (rng_() % 8 != 0) {  // leave some fields unset
        SetOne(msg, r, f, depth);
      }
    }
  }

 private:
  std::string RandomBytes() {
    std::string s(rng_() % 24, '\0');
    for (char& c : s) c = static_cast<char>(rng_() & 0xff);
    return s;
  }
  std::string RandomText() {
    std::string s(rng_() % 24, 'a');
    for (char& c : s) c = static_cast<char>('a' + rng_() % 26);
    return s;
  }
  int RandomEnum(const FieldDescriptor* f) {
    const auto* e = f->enum_type();
    return e->value(static_cast<int>(rng_() % e->value_count()))->number();
  }
  float RandomFloat() { return std::uniform_real_distribution<float>(-1e3f, 1e3f)(rng_); }
  double RandomDouble() { return std::uniform_real_distribution<double>(-1e9, 1e9)(rng_); }

  void SetOne(Message* m, const Reflection* r, const FieldDescriptor* f, int depth) {
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
        r->SetInt32(m, f, static_cast<int32_t>(rng_()));
        break;
      case FieldDescriptor::CPPTYPE_INT64:
        r->SetInt64(m, f, static_cast<int64_t>(Rng64()));
        break;
      case FieldDescriptor::CPPTYPE_UINT32:
        r->SetUInt32(m, f, static_cast<uint32_t>(rng_()));
        break;
      case FieldDescriptor::CPPTYPE_UINT64:
        r->SetUInt64(m, f, Rng64());
        break;
      case FieldDescriptor::CPPTYPE_FLOAT:
        r->SetFloat(m, f, RandomFloat());
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE:
        r->SetDouble(m, f, RandomDouble());
        break;
      case FieldDescriptor::CPPTYPE_BOOL:
        r->SetBool(m, f, rng_() % 2);
        break;
      case FieldDescriptor::CPPTYPE_ENUM:
        r->SetEnumValue(m, f, RandomEnum(f));
        break;
      case FieldDescriptor::CPPTYPE_STRING:
        r->SetString(m, f, f->type() == FieldDescriptor::TYPE_BYTES ? RandomBytes() : RandomText());
        break;
      case FieldDescriptor::CPPTYPE_MESSAGE:
        if (depth < 4) Fill(r->MutableMessage(m, f), depth + 1);
        break;
    }
  }
  void AddOne(Message* m, const Reflection* r, const FieldDescriptor* f, int depth) {
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
        r->AddInt32(m, f, static_cast<int32_t>(rng_()));
        break;
      case FieldDescriptor::CPPTYPE_INT64:
        r->AddInt64(m, f, static_cast<int64_t>(Rng64()));
        break;
      case FieldDescriptor::CPPTYPE_UINT32:
        r->AddUInt32(m, f, static_cast<uint32_t>(rng_()));
        break;
      case FieldDescriptor::CPPTYPE_UINT64:
        r->AddUInt64(m, f, Rng64());
        break;
      case FieldDescriptor::CPPTYPE_FLOAT:
        r->AddFloat(m, f, RandomFloat());
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE:
        r->AddDouble(m, f, RandomDouble());
        break;
      case FieldDescriptor::CPPTYPE_BOOL:
        r->AddBool(m, f, rng_() % 2);
        break;
      case FieldDescriptor::CPPTYPE_ENUM:
        r->AddEnumValue(m, f, RandomEnum(f));
        break;
      case FieldDescriptor::CPPTYPE_STRING:
        r->AddString(m, f, f->type() == FieldDescriptor::TYPE_BYTES ? RandomBytes() : RandomText());
        break;
      case FieldDescriptor::CPPTYPE_MESSAGE:
        if (depth < 4) Fill(r->AddMessage(m, f), depth + 1);
        break;
    }
  }
  uint64_t Rng64() { return (uint64_t{rng_()} << 32) | rng_(); }

  std::mt19937 rng_;
};

std::vector<const Descriptor*> AllMessages() {
  std::vector<const Descriptor*> out;
  for (const FileDescriptor* file :
       {KvHandle::descriptor()->file(), GenerateRequest::descriptor()->file(),
        PrefillRequest::descriptor()->file()}) {
    for (int i = 0; i < file->message_type_count(); ++i) out.push_back(file->message_type(i));
  }
  return out;
}

TEST(RoundTripTest, EveryMessageRandomFilled) {
  const uint32_t seed = std::random_device{}();
  RecordProperty("seed", std::to_string(seed));
  RandomFiller filler(seed);
  const auto messages = AllMessages();
  ASSERT_GE(messages.size(), 30u) << "expected every tandem.v1 message to be listed";
  auto* factory = google::protobuf::MessageFactory::generated_factory();
  for (const Descriptor* d : messages) {
    for (int trial = 0; trial < 20; ++trial) {
      std::unique_ptr<Message> original(factory->GetPrototype(d)->New());
      filler.Fill(original.get(), 0);
      std::string wire;
      ASSERT_TRUE(original->SerializeToString(&wire)) << d->full_name();
      std::unique_ptr<Message> parsed(factory->GetPrototype(d)->New());
      ASSERT_TRUE(parsed->ParseFromString(wire)) << d->full_name() << " seed=" << seed;
      EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*original, *parsed))
          << d->full_name() << " seed=" << seed << "\n"
          << original->DebugString() << "\nvs\n"
          << parsed->DebugString();
    }
  }
}

TEST(RoundTripTest, GarbageIsRejectedOrHarmless) {
  // Truncated wire data must fail to parse rather than crash.
  GenerateRequest req;
  req.set_request_id("r1");
  for (uint32_t t = 0; t < 1000; ++t) req.add_prompt_token_ids(t * 7919);
  std::string wire = req.SerializeAsString();
  GenerateRequest parsed;
  EXPECT_FALSE(parsed.ParseFromString(wire.substr(0, wire.size() / 2 + 1)));
  EXPECT_TRUE(parsed.ParseFromString(wire));
  EXPECT_EQ(parsed.prompt_token_ids_size(), 1000);
}

TEST(LimitsTest, MessagesAtEveryLimitFitInOneGrpcMessage) {
  constexpr uint32_t kWorstToken = std::numeric_limits<uint32_t>::max();  // 5-byte varint
  const std::string id(kMaxIdBytes, 'x');

  GenerateRequest gen;
  gen.set_request_id(id);
  gen.set_cache_salt(id);
  for (int i = 0; i < kMaxPromptTokens; ++i) gen.add_prompt_token_ids(kWorstToken);
  for (int i = 0; i < kMaxStopTokenIds; ++i)
    gen.mutable_sampling()->add_stop_token_ids(kWorstToken);
  gen.mutable_sampling()->set_max_tokens(kWorstToken);
  gen.mutable_sampling()->set_seed(std::numeric_limits<uint64_t>::max());

  KvHandle handle;
  handle.set_worker_id(id);
  handle.set_transfer_endpoint(std::string(256, 'h'));
  for (int i = 0; i < kMaxKvHandleBlocks; ++i) {
    handle.add_block_ids(kWorstToken);
  }

  DecodeRequest decode;  // the largest router -> worker message: request + handle
  *decode.mutable_request() = gen;
  *decode.mutable_kv_handle() = handle;
  decode.set_first_token(kWorstToken);
  decode.mutable_mtp_handoff()->set_num_positions(kWorstToken);
  decode.mutable_mtp_handoff()->set_row_width(kWorstToken);
  decode.mutable_mtp_handoff()->mutable_latent_rows()->Resize(kMaxMtpHandoffRowFloats, 1.0f);
  decode.mutable_mtp_handoff()->mutable_last_hidden()->Resize(kMaxMtpHandoffHiddenFloats, 1.0f);
  EXPECT_LE(static_cast<int64_t>(decode.ByteSizeLong()), kMaxGrpcMessageBytes)
      << "DecodeRequest at the limits is " << decode.ByteSizeLong() << " bytes";

  TransferHandshake hs;
  hs.set_worker_id(id);
  hs.set_worker_address(std::string(kMaxTransportAddressBytes, '\xff'));
  for (int i = 0; i < kMaxMemoryRegions; ++i) {
    MemoryRegion* r = hs.add_regions();
    r->set_base_address(std::numeric_limits<uint64_t>::max());
    r->set_length(std::numeric_limits<uint64_t>::max());
    r->set_packed_rkey(std::string(kMaxPackedRkeyBytes, '\xff'));
  }
  EXPECT_LE(static_cast<int64_t>(hs.ByteSizeLong()), kMaxGrpcMessageBytes);

  HeartbeatRequest hb;
  hb.set_worker_id(id);
  for (int i = 0; i < kMaxHeartbeatBlockHashes; ++i) {
    hb.add_added_block_hashes(~uint64_t{0});
    hb.add_removed_block_hashes(~uint64_t{0});
  }
  EXPECT_LE(static_cast<int64_t>(hb.ByteSizeLong()), kMaxGrpcMessageBytes);
}

}  // namespace
}  // namespace tandem::v1
