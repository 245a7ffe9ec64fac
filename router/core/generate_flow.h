// GenerateFlow: one request's run through the Orchestrator (orchestrator.h), as a state machine.
// Internal to the Orchestrator; only orchestrator.cc includes this.
//
//   Route ──▶ P/D: Prefill ──▶ first token ──▶ Decode stream ──▶ Done
//     ▲          │ P unreachable    (D unreachable before a token: ReassignLease, next D;
//     │          │                   none free and D's link down: wait for one, D included)
//     └──────────┴─ mixed: Generate stream ──▶ Done          (a phase retried: Route again)
//
// Every step runs on the request's strand (executor.h): a worker call's completion callback
// continues the flow there (Strand::Dispatch: on the callback's own thread when the strand is
// idle, else queued for the orchestrator's pool), so the flow's state is touched by one thread at
// a time and no thread waits for a worker. A timed step (PostAt) replaces the one sleep the
// blocking version had: telling a client's cancel from a worker's, which gRPC may report in
// either order.
//
// The flow keeps itself alive through the callbacks of its open calls (shared_ptr), ends every
// call before it reports its end (sink->Finish, then `on_end`), and releases its workers' load
// slots and its admission before the client sees the end.
#ifndef TANDEM_ROUTER_CORE_GENERATE_FLOW_H_
#define TANDEM_ROUTER_CORE_GENERATE_FLOW_H_

#include <memory>

#include "router/core/executor.h"
#include "router/core/orchestrator.h"
#include "router/core/request_table.h"
#include "router/core/worker_client.h"
#include "tandem/v1/router.pb.h"

namespace tandem::router {

// Starts serving `request` on `orch`'s executor (see Orchestrator::Start); `on_end` runs once
// on the request's strand after sink->Finish.
void StartGenerateFlow(Orchestrator& orch, v1::GenerateRequest request, Admission admission,
                       const CallerContext* client, std::shared_ptr<ResponseSink> sink,
                       Task on_end);

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_CORE_GENERATE_FLOW_H_
