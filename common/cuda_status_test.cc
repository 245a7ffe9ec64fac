// Runs without a GPU: the conversions only read the libraries' error tables.
#include "common/cuda_status.h"

#include <string>

#include "common/cublas_status.h"
#include "common/nccl_status.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

absl::Status ForwardCuda(cudaError_t e) {
  CUDA_RETURN_IF_ERROR(e);
  return absl::OkStatus();
}
absl::Status ForwardCublas(cublasStatus_t s) {
  CUBLAS_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}
absl::Status ForwardNccl(ncclResult_t r) {
  NCCL_RETURN_IF_ERROR(r);
  return absl::OkStatus();
}

TEST(CudaStatusTest, SuccessIsOk) {
  EXPECT_TRUE(ForwardCuda(cudaSuccess).ok());
  EXPECT_TRUE(ForwardCublas(CUBLAS_STATUS_SUCCESS).ok());
  EXPECT_TRUE(ForwardNccl(ncclSuccess).ok());
}

TEST(CudaStatusTest, CudaCodesAndMessage) {
  EXPECT_EQ(CudaStatusCode(cudaErrorMemoryAllocation), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(CudaStatusCode(cudaErrorInvalidValue), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaStatusCode(cudaErrorNoDevice), absl::StatusCode::kUnavailable);
  EXPECT_EQ(CudaStatusCode(cudaErrorInsufficientDriver), absl::StatusCode::kUnavailable);
  EXPECT_EQ(CudaStatusCode(cudaErrorIllegalAddress), absl::StatusCode::kInternal);

  absl::Status s = ForwardCuda(cudaErrorMemoryAllocation);
  ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  std::string msg(s.message());
  EXPECT_NE(msg.find("cuda_status_test.cc:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cudaErrorMemoryAllocation"), std::string::npos) << msg;
  EXPECT_NE(msg.find(cudaGetErrorString(cudaErrorMemoryAllocation)), std::string::npos) << msg;
  EXPECT_NE(msg.find("`e`"), std::string::npos) << msg;
}

TEST(CudaStatusTest, CublasCodesAndMessage) {
  EXPECT_EQ(CublasStatusCode(CUBLAS_STATUS_ALLOC_FAILED), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(CublasStatusCode(CUBLAS_STATUS_INVALID_VALUE), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CublasStatusCode(CUBLAS_STATUS_NOT_SUPPORTED), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(CublasStatusCode(CUBLAS_STATUS_EXECUTION_FAILED), absl::StatusCode::kInternal);
  absl::Status s = ForwardCublas(CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("CUBLAS_STATUS_INVALID_VALUE"), std::string::npos) << s;
  EXPECT_NE(s.message().find("cuBLAS error"), std::string::npos) << s;
}

TEST(CudaStatusTest, NcclCodesAndMessage) {
  EXPECT_EQ(NcclStatusCode(ncclInvalidArgument), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NcclStatusCode(ncclRemoteError), absl::StatusCode::kUnavailable);
  EXPECT_EQ(NcclStatusCode(ncclUnhandledCudaError), absl::StatusCode::kInternal);
  absl::Status s = ForwardNccl(ncclRemoteError);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.message().find(ncclGetErrorString(ncclRemoteError)), std::string::npos) << s;
  EXPECT_NE(s.message().find("NCCL error"), std::string::npos) << s;
}

}  // namespace
}  // namespace tandem
