// UcxAgent, part 4: gathers at the source (kvtransfer/ucx/DESIGN.md,
// "Gathers at the source"; the wire: ucx_gather_wire.h). A strided read from a peer this agent
// does not map sends, per request, one active message naming the rows; the source packs them
// into one buffer and answers with it (eager or rendezvous, as UCX chooses by size). Everything
// here runs with mu_ held: the handlers run inside ucp_worker_progress, which we call under mu_.
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/ucx_status.h"
#include "glog/logging.h"
#include "kvtransfer/streaming_copy.h"
#include "kvtransfer/ucx/ucx_agent_impl.h"

// Converted UCX error naming the call and the line it failed at.
#define UCX_ERROR(status, call) ::tandem::UcxStatus((status), {(call), __FILE__, __LINE__})

namespace tandem::kvtransfer {
namespace {

// Spreads `rows` packed rows of `row_bytes` from `src` to `dst`, `stride` apart.
void Spread(char* dst, uint64_t stride, const char* src, uint64_t row_bytes, uint64_t rows) {
  StridedStreamingCopy(dst, stride, src, row_bytes, row_bytes, rows, SIZE_MAX);
}

// Packs `rows` rows of `row_bytes`, `stride` apart at `src`, into `dst`.
void Pack(char* dst, const char* src, uint64_t stride, uint64_t row_bytes, uint64_t rows) {
  StridedStreamingCopy(dst, row_bytes, src, stride, row_bytes, rows, SIZE_MAX);
}

}  // namespace

absl::Status UcxAgentImpl::RegisterGatherHandlersLocked() {
  for (const auto& [id, cb] : {std::pair{kGatherRequestAmId, &UcxAgentImpl::OnGatherRequest},
                               std::pair{kGatherReplyAmId, &UcxAgentImpl::OnGatherAnswer}}) {
    ucp_am_handler_param_t param{};
    param.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                       UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    param.id = id;
    param.flags = UCP_AM_FLAG_WHOLE_MSG;
    param.cb = cb;
    param.arg = this;
    if (ucs_status_t s = ucp_worker_set_am_recv_handler(worker_, &param); s != UCS_OK) {
      return UCX_ERROR(s, "ucp_worker_set_am_recv_handler");
    }
  }
  return absl::OkStatus();
}

bool UcxAgentImpl::AnswersGathersLocked() const {
  if (!options_.remote_gather || !options_.enable_am) return false;
  for (const LocalRegion& r : regions_) {
    if (r.kind == tandem::v1::MEMORY_KIND_CUDA && r.device == nullptr) return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Reader side.

void UcxAgentImpl::PostGatherLocked(Transfer& t, const StridedCopyOp& op, uint64_t first_row,
                                    uint64_t rows, StagingSlot* slot) {
  const RemoteRegion& remote = t.conn->regions[op.remote_region];
  const LocalRegion& local = regions_[op.local_region];
  auto g = std::make_unique<Gather>();
  g->agent = this;
  do {
    g->token = absl::Uniform<uint64_t>(token_gen_);
  } while (g->token == 0 || gathers_.contains(g->token));
  g->transfer = &t;
  g->rows = rows;
  g->row_bytes = op.row_bytes;
  g->bytes = rows * op.row_bytes;
  g->slot = slot;
  char* local_rows = local.base + op.local_offset + first_row * op.local_stride;
  if (slot != nullptr) {  // packed into the staging buffer; the device copy spreads them
    g->dest = slot->host;
    g->memh = slot->memh;
  } else if (op.local_stride == op.row_bytes) {  // packed here too: straight into place
    g->dest = local_rows;
    g->memh = local.memh;
  } else {
    g->scratch.reset(new char[g->bytes]);
    g->dest = g->scratch.get();
    g->spread_to = local_rows;
    g->stride = op.local_stride;
  }
  // The header must live until the send completes, which may be after the gather ends.
  auto sending = std::make_unique<SentGatherRequest>();
  sending->agent = this;
  GatherRequest* header = &sending->header;
  header->region = op.remote_region;
  header->token = g->token;
  header->offset = op.remote_offset + first_row * op.remote_stride;
  header->stride = op.remote_stride;
  header->row_bytes = op.row_bytes;
  header->rows = rows;
  std::memcpy(header->key, t.conn->gather_key.data(), kGatherKeyBytes);  // size checked at AddPeer
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
  param.cb.send = &UcxAgentImpl::OnGatherRequestSent;
  param.user_data = sending.get();
  // The region's endpoint: for regions not mapped here, the one with error handling.
  ucs_status_ptr_t sent = ucp_am_send_nbx(remote.ep, kGatherRequestAmId, header,
                                          sizeof(GatherRequest), nullptr, 0, &param);
  if (UCS_PTR_IS_ERR(sent)) {
    if (slot != nullptr) slot->state = StagingSlot::State::kFree;
    StopTransferLocked(t, UCX_ERROR(UCS_PTR_STATUS(sent), "ucp_am_send_nbx (gather request)"));
    return;
  }
  if (sent != nullptr) sending.release();  // OnGatherRequestSent frees it
  CountPostedLocked(t, g->bytes);
  gathers_.emplace(g->token, std::move(g));
}

void UcxAgentImpl::OnGatherRequestSent(void* request, ucs_status_t status, void* user_data) {
  std::unique_ptr<SentGatherRequest> sent(static_cast<SentGatherRequest*>(user_data));
  sent->agent->mu_.AssertHeld();
  ucp_request_free(request);
  if (status == UCS_OK || status == UCS_ERR_CANCELED) return;
  // The request never left: its gather (if still waiting) fails. (The endpoint's error handler
  // usually stops the whole connection as well.)
  auto it = sent->agent->gathers_.find(sent->header.token);
  if (it != sent->agent->gathers_.end() && it->second->receive == nullptr) {
    sent->agent->FinishGatherLocked(sent->header.token,
                                    UCX_ERROR(status, "ucp_am_send_nbx (gather request)"));
  }
}

ucs_status_t UcxAgentImpl::OnGatherAnswer(void* arg, const void* header, size_t header_length,
                                          void* data, size_t length,
                                          const ucp_am_recv_param_t* param) {
  UcxAgentImpl* agent = static_cast<UcxAgentImpl*>(arg);
  agent->mu_.AssertHeld();
  if (header_length != sizeof(GatherReply)) return UCS_OK;  // malformed: dropped
  GatherReply reply;
  std::memcpy(&reply, header, sizeof(reply));
  auto it = agent->gathers_.find(reply.token);
  // Abandoned (its transfer stopped) or a stray message: dropped (a rendezvous answer is then
  // never pulled; its sender's send completes).
  if (it == agent->gathers_.end() || it->second->receive != nullptr) return UCS_OK;
  Gather& g = *it->second;
  absl::Status status = GatherReplyStatus(reply);
  if (status.ok() && length != g.bytes) {
    status = absl::InternalError(
        absl::StrCat("gather answer of ", length, " bytes for a request of ", g.bytes));
  }
  if (!status.ok()) {
    agent->FinishGatherLocked(reply.token, status);
    return UCS_OK;
  }
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0) {  // eager: the bytes are here
    if (g.transfer->error.ok()) {  // a stopped transfer writes nothing more
      if (g.spread_to != nullptr) {
        Spread(g.spread_to, g.stride, static_cast<const char*>(data), g.row_bytes, g.rows);
        g.spread_to = nullptr;
      } else {
        std::memcpy(g.dest, data, length);
      }
    }
    agent->FinishGatherLocked(reply.token, absl::OkStatus());
    return UCS_OK;
  }
  ucp_request_param_t recv{};
  recv.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  recv.cb.recv_am = &UcxAgentImpl::OnGatherReceived;
  recv.user_data = &g;  // alive until the receive ends: a receiving gather is never abandoned
  if (g.memh != nullptr) {
    recv.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    recv.memh = g.memh;
  }
  ucs_status_ptr_t r = ucp_am_recv_data_nbx(agent->worker_, data, g.dest, length, &recv);
  if (r == nullptr) {
    agent->FinishGatherLocked(reply.token, absl::OkStatus());
  } else if (UCS_PTR_IS_ERR(r)) {
    agent->FinishGatherLocked(reply.token,
                              UCX_ERROR(UCS_PTR_STATUS(r), "ucp_am_recv_data_nbx (gather answer)"));
  } else {
    g.receive = r;
    g.transfer->requests[r] = 0;  // cancelled with the transfer (StopTransferLocked)
  }
  return UCS_INPROGRESS;  // the receive owns the descriptor
}

void UcxAgentImpl::OnGatherReceived(void* request, ucs_status_t status, size_t /*length*/,
                                    void* user_data) {
  Gather* g = static_cast<Gather*>(user_data);
  UcxAgentImpl* agent = g->agent;
  agent->mu_.AssertHeld();
  ucp_request_free(request);
  absl::Status result = absl::OkStatus();
  if (status != UCS_OK) {
    result = status == UCS_ERR_CANCELED && g->transfer->cancel_requested
                 ? absl::CancelledError(absl::StrCat("transfer ", g->transfer->id, " cancelled"))
                 : UCX_ERROR(status, "ucp_am_recv_data_nbx completion (gather answer)");
  }
  agent->FinishGatherLocked(g->token, result);
}

void UcxAgentImpl::FinishGatherLocked(uint64_t token, absl::Status status) {
  auto node = gathers_.extract(token);
  if (node.empty()) return;
  std::unique_ptr<Gather> g = std::move(node.mapped());
  Transfer& t = *g->transfer;
  if (g->receive != nullptr) t.requests.erase(g->receive);
  if (status.ok() && g->spread_to != nullptr && t.error.ok()) {
    Spread(g->spread_to, g->stride, g->dest, g->row_bytes, g->rows);
  }
  if (g->slot != nullptr && status.ok()) {
    StartToDeviceLocked(*g->slot);  // ends the request (also for a transfer stopped meanwhile)
    return;
  }
  if (g->slot != nullptr) g->slot->state = StagingSlot::State::kFree;
  EndRequestLocked(t, g->bytes, status);
}

void UcxAgentImpl::AbandonGathersLocked(Transfer& t) {
  std::vector<uint64_t> waiting;
  for (const auto& [token, g] : gathers_) {
    if (g->transfer == &t && g->receive == nullptr) waiting.push_back(token);
  }
  for (uint64_t token : waiting) FinishGatherLocked(token, absl::OkStatus());
}

// ---------------------------------------------------------------------------------------------
// Source side.

ucs_status_t UcxAgentImpl::OnGatherRequest(void* arg, const void* header, size_t header_length,
                                           void* /*data*/, size_t /*length*/,
                                           const ucp_am_recv_param_t* param) {
  UcxAgentImpl* agent = static_cast<UcxAgentImpl*>(arg);
  agent->mu_.AssertHeld();
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) == 0 || param->reply_ep == nullptr) {
    LOG(WARNING) << "UCX gather request without a reply endpoint: dropped";
    return UCS_OK;
  }
  uint64_t token = 0;
  if (header_length >= offsetof(GatherRequest, token) + sizeof(token)) {
    std::memcpy(&token, static_cast<const char*>(header) + offsetof(GatherRequest, token),
                sizeof(token));
  }
  auto answer = std::make_unique<GatherAnswer>();
  answer->agent = agent;
  std::vector<uint64_t> sizes;
  for (const LocalRegion& r : agent->regions_) sizes.push_back(r.length);
  // A source that answers no gathers has no key: every request is refused.
  absl::StatusOr<GatherRequest> request = ParseGatherRequest(
      header, header_length, agent->AnswersGathersLocked() ? agent->gather_key_ : "", sizes);
  absl::Status status = request.status();
  const uint64_t bytes = status.ok() ? request->rows * request->row_bytes : 0;
  if (status.ok() && agent->answer_bytes_ + bytes > agent->options_.max_gather_answer_bytes) {
    status = absl::ResourceExhaustedError(
        absl::StrCat("gather answers of ", agent->answer_bytes_, " bytes are being sent (limit ",
                     agent->options_.max_gather_answer_bytes, ")"));
  }
  if (status.ok()) {
    answer->data.reset(new char[bytes]);
    answer->bytes = bytes;
    Pack(answer->data.get(), agent->regions_[request->region].base + request->offset,
         request->stride, request->row_bytes, request->rows);
  }
  answer->header = MakeGatherReply(token, status);
  agent->SendGatherAnswerLocked(param->reply_ep, std::move(answer));
  return UCS_OK;
}

void UcxAgentImpl::SendGatherAnswerLocked(ucp_ep_h reply_ep, std::unique_ptr<GatherAnswer> answer) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &UcxAgentImpl::OnGatherAnswerSent;
  param.user_data = answer.get();
  ucs_status_ptr_t sent =
      ucp_am_send_nbx(reply_ep, kGatherReplyAmId, &answer->header, sizeof(GatherReply),
                      answer->data.get(), answer->bytes, &param);
  if (sent == nullptr) return;  // sent in place
  if (UCS_PTR_IS_ERR(sent)) {
    LOG(WARNING) << "UCX gather answer not sent: " << ucs_status_string(UCS_PTR_STATUS(sent));
    return;
  }
  answer_bytes_ += answer->bytes;
  answer->request = sent;
  GatherAnswer* raw = answer.get();
  answers_.emplace(raw, std::move(answer));
}

void UcxAgentImpl::OnGatherAnswerSent(void* request, ucs_status_t status, void* user_data) {
  GatherAnswer* answer = static_cast<GatherAnswer*>(user_data);
  UcxAgentImpl* agent = answer->agent;
  agent->mu_.AssertHeld();
  ucp_request_free(request);
  if (status != UCS_OK && status != UCS_ERR_CANCELED) {
    VLOG(1) << "UCX gather answer failed: " << ucs_status_string(status);
  }
  agent->answer_bytes_ -= answer->bytes;
  agent->answers_.erase(answer);
}

bool UcxAgentImpl::DrainGatherAnswersLocked(absl::Duration timeout) {
  std::vector<void*> sending;
  for (const auto& [raw, answer] : answers_) sending.push_back(answer->request);
  for (void* request : sending) ucp_request_cancel(worker_, request);  // may complete them here
  const absl::Time deadline = absl::Now() + timeout;
  while (!answers_.empty() && absl::Now() < deadline) ucp_worker_progress(worker_);
  return answers_.empty();
}

}  // namespace tandem::kvtransfer
