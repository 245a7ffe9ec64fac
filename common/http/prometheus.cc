#include "common/http/prometheus.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem::http {
namespace {

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return absl::StrFormat("%.0f", v);
  return absl::StrFormat("%.17g", v);
}

std::string EscapeHelp(const std::string& help) {
  std::string out;
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace

std::vector<double> LatencyBuckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25, 0.5,
          0.75,  1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0};
}

std::vector<double> InterTokenBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
          0.075, 0.1,    0.15,  0.2,  0.3,   0.4,  0.5,   0.75, 1.0,  2.5};
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  const size_t bucket =
      std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();  // le
  absl::MutexLock lock(&mu_);
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

HistogramSnapshot Histogram::Snapshot() const {
  absl::MutexLock lock(&mu_);
  return {bounds_, counts_, sum_, count_};
}

std::string PrometheusText::EscapeLabelValue(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

void PrometheusText::Family(const std::string& name, const std::string& help, const char* type) {
  if (!families_.insert(name).second) return;
  absl::StrAppend(&out_, "# HELP ", name, " ", EscapeHelp(help), "\n# TYPE ", name, " ", type,
                  "\n");
}

void PrometheusText::Sample(const std::string& name, const Labels& labels, double value) {
  out_ += name;
  if (!labels.empty()) {
    out_ += "{";
    for (size_t i = 0; i < labels.size(); ++i) {
      absl::StrAppend(&out_, i ? "," : "", labels[i].first, "=\"",
                      EscapeLabelValue(labels[i].second), "\"");
    }
    out_ += "}";
  }
  absl::StrAppend(&out_, " ", FormatValue(value), "\n");
}

void PrometheusText::Counter(const std::string& name, const std::string& help, double value,
                             const Labels& labels) {
  Family(name, help, "counter");
  Sample(name, labels, value);
}

void PrometheusText::Gauge(const std::string& name, const std::string& help, double value,
                           const Labels& labels) {
  Family(name, help, "gauge");
  Sample(name, labels, value);
}

void PrometheusText::Histogram(const std::string& name, const std::string& help,
                               const HistogramSnapshot& h, const Labels& labels) {
  Family(name, help, "histogram");
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= h.bounds.size(); ++i) {
    cumulative += i < h.counts.size() ? h.counts[i] : 0;
    Labels with = labels;
    with.emplace_back("le", i < h.bounds.size() ? FormatValue(h.bounds[i]) : "+Inf");
    Sample(name + "_bucket", with, static_cast<double>(cumulative));
  }
  Sample(name + "_sum", labels, h.sum);
  Sample(name + "_count", labels, static_cast<double>(h.count));
}

}  // namespace tandem::http
