// ConvertFromF32 against a table-based round-to-nearest-even reference (every bf16/fp16 value
// decoded to fp64, nearest picked with ties to the even bit pattern), bit for bit, over random
// magnitudes across the whole exponent range, exact midpoints, subnormals, overflow edges and
// specials. ConvertToF32 exact on every bit pattern; GatherRows bit for bit; AddBias within one
// rounding of the fp64 sum.
#include "kernels/layers/cuda/convert_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"

namespace tandem::kernels::cuda {
namespace {

using cuda_test::DeviceBuffer;
using bf16 = __nv_bfloat16;

using cuda_test::TestSeed;

template <typename T>
uint16_t Bits(T x) {
  uint16_t b;
  std::memcpy(&b, &x, 2);
  return b;
}
float FloatOfBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// Value of a non-negative finite bit pattern, decoded by the format's definition.
template <typename T>
double Decode(uint16_t b) {
  if constexpr (std::is_same_v<T, bf16>) {
    return FloatOfBits(uint32_t{b} << 16);  // bf16 is the top half of an fp32
  } else {
    const int e = (b >> 10) & 31, f = b & 1023;
    return e == 0 ? std::ldexp(f, -24) : std::ldexp(1024 + f, e - 25);
  }
}

template <typename T>
struct Format {
  static constexpr uint16_t kInf = std::is_same_v<T, bf16> ? 0x7f80 : 0x7c00;
  static constexpr uint16_t kSign = 0x8000;
};

// Round-to-nearest-even reference: the non-negative finite values in bit order are increasing,
// so the answer for |x| is one of two neighbours in that table; past the largest finite value
// the next "value" is 2^(emax+1), whose pattern is inf (even).
template <typename T>
class RneReference {
 public:
  RneReference() {
    for (uint32_t b = 0; b < Format<T>::kInf; ++b) values_.push_back(Decode<T>(b));
    overflow_ = std::is_same_v<T, bf16> ? std::ldexp(1.0, 128) : 65536.0;
  }
  // Expected bit pattern (any NaN for NaN input: returns 0xffff).
  uint16_t operator()(float x) const {
    if (std::isnan(x)) return 0xffff;
    const uint16_t sign = std::signbit(x) ? Format<T>::kSign : 0;
    const double a = std::fabs(static_cast<double>(x));
    if (std::isinf(x)) return sign | Format<T>::kInf;
    const auto it = std::upper_bound(values_.begin(), values_.end(), a);
    const size_t lo = static_cast<size_t>(it - values_.begin()) - 1;
    if (values_[lo] == a) return sign | static_cast<uint16_t>(lo);
    const double hi_value = lo + 1 < values_.size() ? values_[lo + 1] : overflow_;
    const uint16_t hi = static_cast<uint16_t>(lo + 1);         // == kInf past the end
    const double d_lo = a - values_[lo], d_hi = hi_value - a;  // exact: close neighbours
    if (d_lo < d_hi) return sign | static_cast<uint16_t>(lo);
    if (d_hi < d_lo) return sign | hi;
    return sign | ((lo % 2 == 0) ? static_cast<uint16_t>(lo) : hi);
  }

 private:
  std::vector<double> values_;
  double overflow_;
};

template <typename T>
std::vector<float> ConversionInputs(std::mt19937& rng, int64_t n) {
  std::vector<float> x;
  x.reserve(n);
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::denorm_min(),
                            std::numeric_limits<float>::min(),
                            std::numeric_limits<float>::max(),
                            -std::numeric_limits<float>::max(),
                            65504.0f,
                            65519.996f,
                            65520.0f,
                            -65520.0f,
                            6.1035156e-05f,
                            5.9604645e-08f,
                            2.9802322e-08f,
                            2.9802326e-08f,
                            1.0f,
                            -1.0f};
  for (float s : specials) x.push_back(s);
  std::uniform_int_distribution<uint32_t> bits;
  std::uniform_int_distribution<int> kind(0, 3);
  std::uniform_int_distribution<uint32_t> pattern(0, Format<T>::kInf - 1);
  while (static_cast<int64_t>(x.size()) < n) {
    switch (kind(rng)) {
      case 0:  // any float bit pattern (NaNs included)
        x.push_back(FloatOfBits(bits(rng)));
        break;
      case 1: {  // a T value +- a few fp32 ulps (near-exact and just-off cases)
        const double v = Decode<T>(static_cast<uint16_t>(pattern(rng)));
        const float f = static_cast<float>(v);
        const int off = static_cast<int>(bits(rng) % 5) - 2;
        uint32_t b;
        std::memcpy(&b, &f, 4);
        x.push_back((bits(rng) & 1 ? -1.0f : 1.0f) * FloatOfBits(b + off));
        break;
      }
      case 2: {  // exact midpoint of two neighbours (fp32 holds it: one more significand bit)
        const uint16_t p = static_cast<uint16_t>(pattern(rng));
        const double mid =
            0.5 *
            (Decode<T>(p) + (p + 1 < Format<T>::kInf
                                 ? Decode<T>(p + 1)
                                 : (std::is_same_v<T, bf16> ? std::ldexp(1.0, 128) : 65536.0)));
        x.push_back((bits(rng) & 1 ? -1.0f : 1.0f) * static_cast<float>(mid));
        break;
      }
      default:  // ordinary magnitudes
        x.push_back(std::normal_distribution<float>(0.0f, 100.0f)(rng));
    }
  }
  return x;
}

template <typename T>
void CheckConvert(std::mt19937& rng, int64_t n, int offset) {
  const std::vector<float> x = ConversionInputs<T>(rng, n);
  const RneReference<T> ref;
  DeviceBuffer<float> in(n + offset);
  DeviceBuffer<T> out(n + offset);
  TANDEM_CUDA_CHECK(
      cudaMemcpy(in.get() + offset, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  ASSERT_TRUE(ConvertFromF32<T>(in.get() + offset, n, out.get() + offset, nullptr).ok());
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<T> got = out.ToHost();
  int bad = 0;
  for (int64_t i = 0; i < n && bad < 10; ++i) {
    const uint16_t g = Bits(got[i + offset]);
    const uint16_t want = ref(x[i]);
    const bool g_nan = (g & 0x7fff) > Format<T>::kInf;
    const bool ok = want == 0xffff ? g_nan : g == want;
    if (!ok) {
      ++bad;
      uint32_t x_bits;
      std::memcpy(&x_bits, &x[i], 4);
      ADD_FAILURE() << "x[" << i << "] = " << x[i] << " (bits 0x" << std::hex << x_bits
                    << "): got 0x" << g << ", want 0x" << want << std::dec << " (n=" << n
                    << ", offset=" << offset << ")";
    }
  }
}

TEST(ConvertCudaTest, ConvertFromF32RoundsToNearestEven) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  for (int offset : {0, 1}) {  // 16-byte vector path and element path
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{1003}, int64_t{1} << 20}) {
      CheckConvert<bf16>(rng, n, offset);
      CheckConvert<__half>(rng, n, offset);
    }
  }
}

template <typename T>
void CheckGather(std::mt19937& rng, int64_t in_rows, int64_t row_elems, int64_t num_rows,
                 int out_offset) {
  std::vector<T> in(in_rows * row_elems);
  std::uniform_int_distribution<uint32_t> bits;
  for (T& e : in) {
    const uint32_t b = bits(rng);
    std::memcpy(static_cast<void*>(&e), &b, sizeof(T));
  }
  std::vector<int32_t> rows(num_rows);
  std::uniform_int_distribution<int32_t> row_dist(-1, static_cast<int32_t>(in_rows) - 1);
  for (int32_t& r : rows) r = row_dist(rng);  // -1: padding row
  DeviceBuffer<T> in_d(in), out_d(num_rows * row_elems + out_offset);
  DeviceBuffer<int32_t> rows_d(rows);
  ASSERT_TRUE(GatherRows<T>(in_d.get(), row_elems, rows_d.get(), num_rows, out_d.get() + out_offset,
                            nullptr)
                  .ok());
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<T> got = out_d.ToHost();
  for (int64_t r = 0; r < num_rows; ++r) {
    for (int64_t e = 0; e < row_elems; ++e) {
      T want{};
      std::memset(static_cast<void*>(&want), 0, sizeof(T));
      if (rows[r] >= 0) want = in[rows[r] * row_elems + e];
      ASSERT_EQ(std::memcmp(&got[out_offset + r * row_elems + e], &want, sizeof(T)), 0)
          << "row " << r << " (src " << rows[r] << ") elem " << e << ", row_elems " << row_elems;
    }
  }
}

// Every bf16 / fp16 bit pattern widened: the exact value (NaN stays NaN), at an odd offset too.
template <typename T>
void CheckWiden(int offset) {
  std::vector<T> in(offset + 65536);
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t bits = static_cast<uint16_t>(b);
    std::memcpy(static_cast<void*>(&in[offset + b]), &bits, 2);
  }
  DeviceBuffer<T> in_d(in);
  DeviceBuffer<float> out_d(offset + 65536);
  ASSERT_TRUE(ConvertToF32<T>(in_d.get() + offset, 65536, out_d.get() + offset, nullptr).ok());
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> got = out_d.ToHost();
  for (uint32_t b = 0; b < 65536; ++b) {
    const float want = cuda_test::ToF(in[offset + b]);
    const float g = got[offset + b];
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(g)) << "bits " << b;
    } else {
      ASSERT_EQ(std::memcmp(&g, &want, 4), 0) << "bits " << b << ": got " << g << ", want " << want;
    }
  }
}

TEST(ConvertCudaTest, ConvertToF32IsExact) {
  TANDEM_SKIP_WITHOUT_GPU();
  CheckWiden<bf16>(0);
  CheckWiden<bf16>(3);
  CheckWiden<__half>(1);
}

TEST(ConvertCudaTest, GatherRowsCopiesRowsAndZeroesPadding) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  CheckGather<bf16>(rng, 50, 4096, 17, 0);  // 16-byte units
  CheckGather<bf16>(rng, 50, 4096, 17, 1);  // misaligned out: element path
  CheckGather<__half>(rng, 9, 13, 33, 0);   // odd row length
  CheckGather<float>(rng, 300, 4, 1000, 0);
  CheckGather<float>(rng, 5, 1, 3, 0);
}

template <typename T, typename TBias>
void CheckAddBias(std::mt19937& rng, int64_t rows, int64_t cols, int x_offset) {
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> x(rows * cols), b(cols);
  for (float& e : x) e = dist(rng);
  for (float& e : b) e = dist(rng);
  cuda_test::RoundTo<T>(x);
  cuda_test::RoundTo<TBias>(b);
  std::vector<T> x_t(x_offset + rows * cols);
  for (size_t i = 0; i < x.size(); ++i) x_t[x_offset + i] = cuda_test::FromF<T>(x[i]);
  DeviceBuffer<T> x_d(x_t);
  DeviceBuffer<TBias> b_d(cuda_test::Convert<TBias>(b));
  ASSERT_TRUE((AddBias<T, TBias>(x_d.get() + x_offset, b_d.get(), rows, cols, nullptr).ok()));
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<T> got = x_d.ToHost();
  // One rounding to T of the fp32 sum: half an ulp of T, plus the fp32 rounding.
  const double rel =
      std::is_same_v<T, bf16> ? 0x1p-8 : (std::is_same_v<T, __half> ? 0x1p-11 : 0x1p-23);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const double want = static_cast<double>(x[r * cols + c]) + b[c];
      const double g = cuda_test::ToF(got[x_offset + r * cols + c]);
      ASSERT_LE(std::fabs(g - want), rel * std::fabs(want) + 1e-30)
          << "(" << r << ", " << c << "): got " << g << ", want " << want;
    }
  }
}

TEST(ConvertCudaTest, AddBiasMatchesFp64) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  CheckAddBias<bf16, bf16>(rng, 37, 4096, 0);  // vector path
  CheckAddBias<bf16, bf16>(rng, 5, 1000, 1);   // misaligned: element path
  CheckAddBias<__half, __half>(rng, 64, 24, 0);
  CheckAddBias<__half, __half>(rng, 3, 13, 0);  // odd width
  CheckAddBias<float, float>(rng, 9, 520, 0);
  CheckAddBias<float, bf16>(rng, 7, 1032, 0);
  CheckAddBias<float, __half>(rng, 2, 77, 0);
}

TEST(ConvertCudaTest, RejectsBadArgumentsAndSkipsEmptyWork) {
  TANDEM_SKIP_WITHOUT_GPU();
  DeviceBuffer<float> f(16);
  DeviceBuffer<bf16> h(16);
  DeviceBuffer<int32_t> ids(4);
  EXPECT_EQ(ConvertFromF32<bf16>(f.get(), -1, h.get(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ConvertFromF32<bf16>(nullptr, 4, h.get(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ConvertFromF32<bf16>(nullptr, 0, nullptr, nullptr).ok());
  EXPECT_EQ(ConvertToF32<bf16>(h.get(), -1, f.get(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ConvertToF32<bf16>(h.get(), 4, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ConvertToF32<bf16>(nullptr, 0, nullptr, nullptr).ok());
  EXPECT_EQ(GatherRows<bf16>(h.get(), -2, ids.get(), 4, h.get(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GatherRows<bf16>(h.get(), 2, nullptr, 4, h.get(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(GatherRows<bf16>(nullptr, 2, nullptr, 0, nullptr, nullptr).ok());
  EXPECT_EQ((AddBias<bf16, bf16>(h.get(), nullptr, 2, 8, nullptr)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AddBias<bf16>(h.get(), h.get(), 2, -8, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((AddBias<bf16, bf16>(nullptr, nullptr, 0, 8, nullptr).ok()));
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace tandem::kernels::cuda
