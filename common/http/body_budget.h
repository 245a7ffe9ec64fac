// The bytes of request bodies a server's connections may hold at once, all together.
//
// A connection reserves its body's size (Content-Length, or the per-request limit when the body
// is chunked) from the headers on, before it reads a byte of it, and gives it back when the
// request has been handled or the connection closes. A reservation that would pass the budget is
// refused: the server answers 503 without reading the body. So keyless or slow clients cannot
// pin more than `limit` bytes of bodies, however many connections they open.
//
// Thread safety: BodyBudget is thread-safe (one atomic); a BodyReservation belongs to one
// connection (its strand).
#ifndef TANDEM_COMMON_HTTP_BODY_BUDGET_H_
#define TANDEM_COMMON_HTTP_BODY_BUDGET_H_

#include <atomic>
#include <cstdint>

namespace tandem::http {

class BodyBudget {
 public:
  explicit BodyBudget(uint64_t limit) : limit_(limit) {}
  BodyBudget(const BodyBudget&) = delete;
  BodyBudget& operator=(const BodyBudget&) = delete;

  // Takes `bytes` when they fit under the limit with everything reserved; false (nothing taken)
  // otherwise. Zero bytes always fit.
  bool TryReserve(uint64_t bytes);
  void Release(uint64_t bytes);
  uint64_t reserved() const { return reserved_.load(std::memory_order_relaxed); }
  uint64_t limit() const { return limit_; }

 private:
  const uint64_t limit_;
  std::atomic<uint64_t> reserved_{0};
};

// One connection's share of a BodyBudget: given back on Release, Reset or destruction.
class BodyReservation {
 public:
  explicit BodyReservation(BodyBudget* budget) : budget_(budget) {}
  ~BodyReservation() { Release(); }
  BodyReservation(const BodyReservation&) = delete;
  BodyReservation& operator=(const BodyReservation&) = delete;

  // Replaces what this connection holds with `bytes`; false (holding nothing) when they do not fit.
  bool Reserve(uint64_t bytes);
  void Release();
  uint64_t bytes() const { return bytes_; }

 private:
  BodyBudget* budget_;
  uint64_t bytes_ = 0;
};

}  // namespace tandem::http

#endif  // TANDEM_COMMON_HTTP_BODY_BUDGET_H_
