// Speculative decoding served for real (issue 34): a tandem_router, a prefill worker and
// speculative decode workers (CPU, the golden fixture), streaming through the router:
//   * P -> D with n-gram drafts, with the target itself as the draft model, and with another
//     random model of the same vocabulary as the draft: greedy tokens equal the plain engine's;
//     D's WorkerStats count verify passes, drafts and accepted drafts (all of them accepted with
//     the target as draft);
//   * the same drafters on a mixed worker (whole requests), on a mixed TP = 2 group and on a
//     TP = 2 decode group (rank 0 drafts, the group verifies) equal the engine too;
//   * a DCP decode group (--tp=2 --dcp=2) with n-gram drafts equals the engine too; a draft
//     model under DCP is refused at startup, naming why;
//   * n-gram drafts are accepted where the outputs repeat themselves (llama_f32_llama3_tied), on a
//     TP = 2 decode group behind a prefill worker, with transformers' greedy tokens;
//   * DeepSeek-V3's MTP layer drafting on a mixed worker, on a P -> D decode worker and on a
//     P -> D TP = 2 decode group gives transformers' greedy tokens.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/cluster.h"
#include "tests/e2e/serving_util.h"

namespace tandem::e2e {
namespace {

std::string FixtureDir() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return srcdir == nullptr ? kModel : absl::StrCat(srcdir, "/tandem/", kModel);
}

// The fixture's config.json copied to the test's temporary directory: random weights of it
// (dummy:PATH:SEED) are another model of the same vocabulary.
std::string OtherModelConfig() {
  std::ifstream in(FixtureDir() + "/config.json");
  std::stringstream text;
  text << in.rdbuf();
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = absl::StrCat(tmp == nullptr ? "/tmp" : tmp, "/draft_config.json");
  std::ofstream(path) << text.str();
  return path;
}

// kSome: 0 < accepted < drafted.
enum class Acceptance { kAny, kAll, kNotAll, kSome };

// Where the speculating worker serves: the decode side of prefill-0 -> decode-0, or mixed-0 alone
// (whole requests, no P -> D).
enum class Topology { kPrefillToDecode, kMixed };

struct Case {
  std::string name;
  std::vector<std::string> flags;  // the speculating worker's
  Acceptance acceptance = Acceptance::kAny;
  Topology topology = Topology::kPrefillToDecode;
  std::string model_dir = kModel;
};

void ExpectServedLikeTheEngine(const Case& c, const std::vector<Prompt>& prompts,
                               const std::vector<std::vector<uint32_t>>& expected) {
  SCOPED_TRACE(c.name);
  const bool mixed = c.topology == Topology::kMixed;
  ClusterOptions options;
  options.model_dir = c.model_dir;
  options.prefill = mixed ? 0 : 1;
  options.decode = mixed ? 0 : 1;
  options.mixed = mixed ? 1 : 0;
  (mixed ? options.mixed_flags : options.decode_flags) = c.flags;
  auto started = Cluster::Start(options);
  ASSERT_TRUE(started.ok()) << started.status();
  Cluster& cluster = **started;
  ASSERT_NO_FATAL_FAILURE(ExpectServedTokens(cluster, prompts, expected));
  absl::StatusOr<tandem::v1::WorkerStats> stats = cluster.Stats(mixed ? "mixed-0" : "decode-0");
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->kv_load_failures(), 0u) << cluster.Logs();
  EXPECT_GT(stats->spec_verify_passes(), 0u);
  EXPECT_GE(stats->spec_draft_tokens(), stats->spec_verify_passes());
  std::printf("%s: %llu verify passes, %llu drafts, %llu accepted\n", c.name.c_str(),
              static_cast<unsigned long long>(stats->spec_verify_passes()),
              static_cast<unsigned long long>(stats->spec_draft_tokens()),
              static_cast<unsigned long long>(stats->spec_accepted_tokens()));
  if (c.acceptance == Acceptance::kAll) {
    EXPECT_EQ(stats->spec_accepted_tokens(), stats->spec_draft_tokens());
  } else if (c.acceptance == Acceptance::kNotAll) {
    EXPECT_LT(stats->spec_accepted_tokens(), stats->spec_draft_tokens());
  } else if (c.acceptance == Acceptance::kSome) {
    EXPECT_GT(stats->spec_accepted_tokens(), 0u);
    EXPECT_LT(stats->spec_accepted_tokens(), stats->spec_draft_tokens());
  }
  if (mixed) return;
  absl::StatusOr<tandem::v1::WorkerStats> prefill = cluster.Stats("prefill-0");
  ASSERT_TRUE(prefill.ok()) << prefill.status();
  EXPECT_EQ(prefill->spec_verify_passes(), 0u) << "a prefill worker never speculates";
}

// A golden fixture's expected.json (runfiles-relative): its prompts, each asking for as many
// tokens as transformers' greedy continuation has, and that continuation.
struct Golden {
  std::vector<Prompt> prompts;
  std::vector<std::vector<uint32_t>> greedy;
};

Golden ReadGolden(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  const nlohmann::json expected = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  Golden golden;
  if (!expected.is_object()) return golden;
  golden.greedy = expected["greedy_tokens"].get<std::vector<std::vector<uint32_t>>>();
  const auto prompts = expected["prompts"].get<std::vector<std::vector<uint32_t>>>();
  for (size_t i = 0; i < prompts.size() && i < golden.greedy.size(); ++i) {
    golden.prompts.push_back({prompts[i], static_cast<int>(golden.greedy[i].size())});
  }
  return golden;
}

// Prompts that repeat a pattern (n-gram drafts find matches) and random ones, each long enough
// to be handed off and decoded for a while.
std::vector<Prompt> SpecPrompts(uint32_t seed) {
  std::vector<Prompt> prompts = RandomPrompts(seed, 4, 60);
  std::mt19937 rng(seed);
  for (int i = 0; i < 3; ++i) {
    Prompt p;
    std::vector<uint32_t> pattern(2 + rng() % 4);
    for (uint32_t& t : pattern) t = 3 + rng() % 500;
    for (int t = 0; t < 24; ++t) p.ids.push_back(pattern[t % pattern.size()]);
    prompts.push_back(p);
  }
  for (Prompt& p : prompts) p.max_tokens = 24;
  return prompts;
}

TEST(SpecServingE2eTest, PrefillToSpeculativeDecodeEqualsTheEngine) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  const std::vector<Prompt> prompts = SpecPrompts(seed);
  const auto expected = Reference(prompts);
  const std::string k = "--num_speculative_tokens=3";
  const Case cases[] = {
      {"ngram", {"--speculative_method=ngram", k}},
      {"draft = target",
       {"--speculative_method=draft", k, "--draft_model=" + FixtureDir()},
       Acceptance::kAll},
      {"draft = other model",
       {"--speculative_method=draft", k, "--draft_model=dummy:" + OtherModelConfig() + ":5"},
       Acceptance::kNotAll},
  };
  for (const Case& c : cases) ExpectServedLikeTheEngine(c, prompts, expected);
}

// Mixed workers and tensor-parallel groups: n-gram and draft-model speculation on a mixed worker,
// a mixed TP = 2 group and a TP = 2 decode group behind a prefill worker.
TEST(SpecServingE2eTest, MixedWorkersAndTpGroupsSpeculateLikeTheEngine) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  const std::vector<Prompt> prompts = SpecPrompts(seed);
  const auto expected = Reference(prompts);
  const std::vector<std::string> ngram = {"--speculative_method=ngram",
                                          "--num_speculative_tokens=3"};
  const std::vector<std::string> draft = {"--speculative_method=draft",
                                          "--num_speculative_tokens=3"};
  const std::string target = "--draft_model=" + FixtureDir();
  const std::string other = "--draft_model=dummy:" + OtherModelConfig() + ":5";
  auto with = [](std::vector<std::string> flags, std::vector<std::string> more) {
    flags.insert(flags.end(), more.begin(), more.end());
    return flags;
  };
  const Case cases[] = {
      {"mixed, ngram", ngram, Acceptance::kAny, Topology::kMixed},
      {"mixed, draft = other model", with(draft, {other}), Acceptance::kNotAll, Topology::kMixed},
      {"mixed TP 2, draft = target", with(draft, {target, "--tp=2"}), Acceptance::kAll,
       Topology::kMixed},
      {"P -> D TP 2, ngram", with(ngram, {"--tp=2"})},
      {"P -> D TP 2, draft = other model", with(draft, {other, "--tp=2"}), Acceptance::kNotAll},
  };
  for (const Case& c : cases) ExpectServedLikeTheEngine(c, prompts, expected);
}

// Where n-gram drafts are accepted: llama_f32_llama3_tied's greedy continuations repeat themselves
// (94 94 94 94 94 352 352 ...; 22 of 40 drafts accepted through generate, spec_golden_test). Its
// prompts through the router, prefill-0 -> a TP = 2 decode group drafting n-grams, give
// transformers' greedy tokens with some drafts accepted and some rejected.
TEST(SpecServingE2eTest, NgramDraftsAreAcceptedWhereOutputsRepeat) {
  const std::string tied = "tests/golden/fixtures/llama_f32_llama3_tied";
  const Golden golden = ReadGolden(tied + "/expected.json");
  ASSERT_FALSE(golden.prompts.empty());
  ExpectServedLikeTheEngine({"tied, P -> D TP 2, ngram",
                             {"--speculative_method=ngram", "--num_speculative_tokens=3", "--tp=2"},
                             Acceptance::kSome,
                             Topology::kPrefillToDecode,
                             tied},
                            golden.prompts, golden.greedy);
}

TEST(SpecServingE2eTest, DcpDecodeGroupSpeculatesWithNgramsAndRefusesADraftModel) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  const std::vector<Prompt> prompts = SpecPrompts(seed);
  const auto expected = Reference(prompts);
  ExpectServedLikeTheEngine(
      {"ngram, DCP 2",
       {"--tp=2", "--dcp=2", "--speculative_method=ngram", "--num_speculative_tokens=3"}},
      prompts, expected);
  ClusterOptions options;
  options.model_dir = kModel;
  options.prefill = 0;
  options.decode_flags = {"--tp=2", "--dcp=2", "--speculative_method=draft",
                          "--num_speculative_tokens=3", "--draft_model=" + FixtureDir()};
  auto refused = Cluster::Start(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("decode context parallelism"), std::string::npos)
      << refused.status();
}

// Where the MTP drafts: a mixed worker, or the decode side of prefill-0 -> decode-0 (P, started
// with the same MTP flags, runs the MTP over each prompt and hands its state over:
// PrefillResponse.mtp_handoff); `tp` is the speculating worker's --tp.
struct MtpSetup {
  std::string name;
  bool disaggregated = false;
  int tp = 1;
};

// Serves prompts 0, 3, 5, 8 of the MTP fixture through `setup`'s cluster: transformers' greedy
// tokens, verify passes on the speculating worker, the handoffs counted on both sides. Returns the
// speculating worker's verify passes, drafts and accepted drafts (empty on a fatal failure).
std::vector<uint64_t> ServeWithMtp(const MtpSetup& setup, const Golden& golden) {
  SCOPED_TRACE(setup.name);
  std::vector<std::string> mtp = {"--speculative_method=mtp", "--num_speculative_tokens=3"};
  ClusterOptions options;
  options.model_dir = "tests/golden/fixtures_mtp/deepseek_v3_mtp_f32";
  options.prefill = setup.disaggregated ? 1 : 0;
  options.decode = setup.disaggregated ? 1 : 0;
  options.mixed = setup.disaggregated ? 0 : 1;
  if (setup.disaggregated) options.prefill_flags = mtp;
  mtp.push_back(absl::StrCat("--tp=", setup.tp));
  (setup.disaggregated ? options.decode_flags : options.mixed_flags) = mtp;
  auto cluster = Cluster::Start(options);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  if (!cluster.ok()) return {};
  for (size_t i : {0, 3, 5, 8}) {
    Result r = Generate((*cluster)->router(), ToRequest(golden.prompts[i]));
    EXPECT_TRUE(r.status.ok()) << r.status.error_message() << (*cluster)->Logs();
    if (!r.status.ok()) return {};
    EXPECT_EQ(r.tokens, golden.greedy[i]) << "prompt " << i;
  }
  absl::StatusOr<tandem::v1::WorkerStats> stats =
      (*cluster)->Stats(setup.disaggregated ? "decode-0" : "mixed-0");
  EXPECT_TRUE(stats.ok()) << stats.status();
  if (!stats.ok()) return {};
  EXPECT_GT(stats->spec_verify_passes(), 0u) << (*cluster)->Logs();
  if (setup.disaggregated) {
    absl::StatusOr<tandem::v1::WorkerStats> p = (*cluster)->Stats("prefill-0");
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return {};
    EXPECT_EQ(p->spec_mtp_handoffs(), 4u) << "P hands its MTP state of every prompt over";
    EXPECT_EQ(p->spec_verify_passes(), 0u) << "P never drafts";
  }
  EXPECT_EQ(stats->spec_mtp_handoffs(), setup.disaggregated ? 4u : 0u) << "taken by D";
  // Random MTP weights make acceptance meaningless as a quality number.
  std::printf("MTP %s: %llu verify passes, %llu drafts, %llu accepted\n", setup.name.c_str(),
              static_cast<unsigned long long>(stats->spec_verify_passes()),
              static_cast<unsigned long long>(stats->spec_draft_tokens()),
              static_cast<unsigned long long>(stats->spec_accepted_tokens()));
  return {stats->spec_verify_passes(), stats->spec_draft_tokens(), stats->spec_accepted_tokens()};
}

// DeepSeek-V3 with its MTP layer (tests/golden/fixtures_mtp): a mixed worker and P -> D pairs
// whose decode worker, or TP = 2 decode group (rank 0 runs the MTP layer whole on the group's
// hidden states), drafts with the model's own MTP layer serve transformers' greedy tokens of the
// target, with the same verify passes, drafts and accepted drafts everywhere (the random fixture
// accepts ~0 either way: mtp_disagg_test shows that the handoff changes the drafts).
TEST(SpecServingE2eTest, MtpDraftsOnMixedAndDecodeWorkersEqualTransformers) {
  const Golden golden = ReadGolden("tests/golden/fixtures_mla/deepseek_v3_moe_f32/expected.json");
  ASSERT_GT(golden.prompts.size(), 8u);
  const MtpSetup setups[] = {
      {"mixed-0", false, 1},
      {"1P1D decode-0", true, 1},
      {"1P1D decode-0 TP 2", true, 2},
  };
  std::vector<uint64_t> first;  // the mixed worker's verify passes, drafts, accepted
  for (const MtpSetup& setup : setups) {
    const std::vector<uint64_t> counts = ServeWithMtp(setup, golden);
    ASSERT_FALSE(counts.empty()) << setup.name;
    if (first.empty()) first = counts;
    EXPECT_EQ(counts, first) << setup.name << " drafts as the mixed worker";
  }
}

}  // namespace
}  // namespace tandem::e2e
