// Status propagation macros for absl::Status / absl::StatusOr (Abseil 20220623 ships none).
//
//   RETURN_IF_ERROR(expr);            expr yields absl::Status; returns it from the enclosing
//                                     function when it is not OK.
//   ASSIGN_OR_RETURN(lhs, expr);      expr yields absl::StatusOr<T>; on error returns its status,
//                                     else move-assigns the value to `lhs` (which may declare a
//                                     variable: `ASSIGN_OR_RETURN(auto x, F())`). `lhs` may not
//                                     contain an unparenthesized comma.
//
// Both work in functions returning absl::Status or any absl::StatusOr<U>.
#ifndef TANDEM_COMMON_STATUS_MACROS_H_
#define TANDEM_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define TANDEM_STATUS_CONCAT_INNER_(a, b) a##b
#define TANDEM_STATUS_CONCAT_(a, b) TANDEM_STATUS_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)                       \
  do {                                              \
    ::absl::Status tandem_status_ = (expr);         \
    if (ABSL_PREDICT_FALSE(!tandem_status_.ok())) { \
      return tandem_status_;                        \
    }                                               \
  } while (false)

#define ASSIGN_OR_RETURN(lhs, rexpr) \
  TANDEM_ASSIGN_OR_RETURN_IMPL_(TANDEM_STATUS_CONCAT_(tandem_statusor_, __COUNTER__), lhs, rexpr)

#define TANDEM_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                  \
  if (ABSL_PREDICT_FALSE(!statusor.ok())) {                 \
    return std::move(statusor).status();                    \
  }                                                         \
  lhs = std::move(statusor).value()

#endif  // TANDEM_COMMON_STATUS_MACROS_H_
