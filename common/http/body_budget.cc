#include "common/http/body_budget.h"

namespace tandem::http {

bool BodyBudget::TryReserve(uint64_t bytes) {
  if (bytes == 0) return true;
  uint64_t now = reserved_.load(std::memory_order_relaxed);
  do {
    if (bytes > limit_ || now > limit_ - bytes) return false;
  } while (!reserved_.compare_exchange_weak(now, now + bytes, std::memory_order_relaxed));
  return true;
}

void BodyBudget::Release(uint64_t bytes) {
  if (bytes != 0) reserved_.fetch_sub(bytes, std::memory_order_relaxed);
}

bool BodyReservation::Reserve(uint64_t bytes) {
  Release();
  if (!budget_->TryReserve(bytes)) return false;
  bytes_ = bytes;
  return true;
}

void BodyReservation::Release() {
  budget_->Release(bytes_);
  bytes_ = 0;
}

}  // namespace tandem::http
