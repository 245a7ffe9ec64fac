#include "runtime/parallel/command_line.h"

#include "runtime/parallel/plan_codec.h"

namespace tandem::runtime {
namespace {

class GroupBroadcastLine final : public CommandLine {
 public:
  explicit GroupBroadcastLine(comm::ProcessGroup* group) : group_(group) {}
  absl::Status Send(const tandem::v1::RankCommand& command) override {
    return SendCommand(group_, command);
  }
  absl::StatusOr<tandem::v1::RankCommand> Receive() override { return ReceiveCommand(group_); }
  absl::Status status() const override { return group_->status(); }

 private:
  comm::ProcessGroup* const group_;
};

}  // namespace

std::unique_ptr<CommandLine> GlooCommandLine(comm::ProcessGroup* group) {
  return std::make_unique<GroupBroadcastLine>(group);
}

}  // namespace tandem::runtime
