// Status propagation macros private to the chat-template interpreter (the tokenizer module
// depends on nothing of ours, so it does not use common/status_macros.h).
#ifndef TANDEM_TOKENIZER_CHAT_STATUS_MACROS_H_
#define TANDEM_TOKENIZER_CHAT_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define CHAT_CONCAT_INNER_(a, b) a##b
#define CHAT_CONCAT_(a, b) CHAT_CONCAT_INNER_(a, b)

#define CHAT_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::absl::Status chat_status_ = (expr);        \
    if (!chat_status_.ok()) return chat_status_; \
  } while (false)

#define CHAT_ASSIGN_OR_RETURN(lhs, rexpr) \
  CHAT_ASSIGN_OR_RETURN_IMPL_(CHAT_CONCAT_(chat_statusor_, __COUNTER__), lhs, rexpr)

#define CHAT_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr)  \
  auto statusor = (rexpr);                                 \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#endif  // TANDEM_TOKENIZER_CHAT_STATUS_MACROS_H_
