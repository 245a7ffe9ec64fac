// PrometheusText checked by a small parser of the exposition format written here: every sample
// line belongs to a family announced once by HELP and TYPE, label values round-trip through the
// escaping, histogram buckets are cumulative, end in +Inf and equal _count; Histogram counts
// observations into the right `le` buckets.
#include "common/http/prometheus.h"

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace tandem::http {
namespace {

struct ParsedSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

// Parses `name{k="v",...} value` with the format's escapes.
bool ParseSample(const std::string& line, ParsedSample* out) {
  size_t i = 0;
  while (i < line.size() && line[i] != '{' && line[i] != ' ') out->name.push_back(line[i++]);
  if (i < line.size() && line[i] == '{') {
    ++i;
    while (i < line.size() && line[i] != '}') {
      std::string key, value;
      while (line[i] != '=') key.push_back(line[i++]);
      i += 2;  // ="
      while (line[i] != '"') {
        if (line[i] == '\\') {
          ++i;
          value.push_back(line[i] == 'n' ? '\n' : line[i]);
        } else {
          value.push_back(line[i]);
        }
        ++i;
      }
      ++i;  // closing quote
      out->labels[key] = value;
      if (line[i] == ',') ++i;
    }
    ++i;
  }
  if (i >= line.size() || line[i] != ' ') return false;
  const std::string v = line.substr(i + 1);
  if (v == "+Inf") {
    out->value = INFINITY;
    return true;
  }
  return absl::SimpleAtod(v, &out->value);
}

TEST(PrometheusTest, FormatParsesBack) {
  Histogram ttft({0.01, 0.1, 1.0});
  for (double v : {0.005, 0.01, 0.05, 0.5, 2.0, 3.0}) ttft.Observe(v);
  PrometheusText p;
  p.Gauge("tandem:num_requests_running", "Requests running.", 3);
  p.Counter("tandem:request_success_total", "Finished requests.", 7,
            {{"finished_reason", "stop"}, {"model_name", "a\"b\\c\nd"}});
  p.Counter("tandem:request_success_total", "Finished requests.", 2,
            {{"finished_reason", "length"}});
  p.Histogram("tandem:time_to_first_token_seconds", "TTFT.", ttft.Snapshot());
  std::map<std::string, std::string> types;
  std::vector<ParsedSample> samples;
  const std::vector<std::string> lines = absl::StrSplit(p.text(), '\n', absl::SkipEmpty());
  for (const std::string& line : lines) {
    if (line.rfind("# HELP ", 0) == 0) continue;
    if (line.rfind("# TYPE ", 0) == 0) {
      std::vector<std::string> parts = absl::StrSplit(line, ' ');
      ASSERT_EQ(parts.size(), 4u);
      EXPECT_TRUE(types.emplace(parts[2], parts[3]).second) << "TYPE twice: " << parts[2];
      continue;
    }
    ParsedSample s;
    ASSERT_TRUE(ParseSample(line, &s)) << line;
    std::string family = s.name;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      if (!types.count(family) && family.size() > strlen(suffix) &&
          family.compare(family.size() - strlen(suffix), strlen(suffix), suffix) == 0) {
        family.resize(family.size() - strlen(suffix));
      }
    }
    EXPECT_TRUE(types.count(family)) << "sample before its TYPE: " << line;
    samples.push_back(s);
  }
  EXPECT_EQ(types["tandem:request_success_total"], "counter");
  EXPECT_EQ(types["tandem:time_to_first_token_seconds"], "histogram");
  EXPECT_EQ(samples[1].labels["model_name"], "a\"b\\c\nd") << "escaping round-trips";
  EXPECT_EQ(samples[1].value, 7);
  // Buckets: le 0.01 -> 2 (0.005 and 0.01), 0.1 -> 3, 1 -> 4, +Inf -> 6 = _count.
  std::vector<double> buckets;
  double count = -1, sum = -1;
  for (const ParsedSample& s : samples) {
    if (s.name == "tandem:time_to_first_token_seconds_bucket") buckets.push_back(s.value);
    if (s.name == "tandem:time_to_first_token_seconds_count") count = s.value;
    if (s.name == "tandem:time_to_first_token_seconds_sum") sum = s.value;
  }
  EXPECT_EQ(buckets, (std::vector<double>{2, 3, 4, 6}));
  EXPECT_EQ(count, 6);
  EXPECT_NEAR(sum, 5.565, 1e-9);
  EXPECT_NE(p.text().find("le=\"+Inf\""), std::string::npos);
}

}  // namespace
}  // namespace tandem::http
