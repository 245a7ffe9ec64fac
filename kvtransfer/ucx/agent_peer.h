// The other process of the two-process transfer tests and of the benchmark: registers
// pattern-filled memory with a UcxAgent and prints its TransferHandshake on stdout (framing in
// peer_process.h). Then, by --mode:
//   source: serves reads until stdin reaches EOF.
//   reader: reads the source's TransferHandshake from stdin (same framing) and pulls the
//           source's region 0 into its own region 0 in a loop until killed (exit 3 on error).
//
// It runs as the agent_peer binary, or inside any binary that calls RunAgentPeer when started
// with kAgentPeerFlag first (GPU tests and the GPU benchmark re-execute themselves this way, so
// a GPU bundle needs no second binary; see ReexecAsAgentPeer).
//
// Arguments (all --name=value; booleans also as --name):
//   --region_bytes=8388608,1000003   sizes of the regions (region i: pattern stream seed + i,
//                                    agent_test_util.h)
//   --seed=1 --fill=true             pattern seed; fill=false leaves the regions zeroed
//   --allocate                       regions from UcxAgent::AllocateMemory (shared memory)
//   --cuda                           regions in CUDA device memory (CUDA builds), synced to the
//                                    agent's host mirror before the descriptor is printed
//   --kv_quant=fp8|int8 --kv_shape=L,B,H,D --kv_blocks=N
//                                    instead of region_bytes: a quantized KV pool, region 0 the
//                                    values and region 1 the fp32 scales of N blocks
//                                    (quantized_kv_test_util.h), filled from --seed
//   --transports=tcp,self,sm --net_device=lo --tcp_segment_bytes=0 --separate_data_endpoint
//   --direct_copy=true --copy_threads=2 --min_streaming_transfer_bytes=16777216
//   --cuda_mirror_pin_granule_bytes=0
//                                    the UcxAgentOptions fields
//   --mode=source|reader
//   --strided_row_bytes=0            reader: > 0 pulls the first N bytes of every 2N (strided
//                                    reads: gathers at the source over TCP) instead of all
#ifndef TANDEM_KVTRANSFER_AGENT_PEER_H_
#define TANDEM_KVTRANSFER_AGENT_PEER_H_

#include <string>
#include <utility>
#include <vector>

namespace tandem::kvtransfer {

inline constexpr char kAgentPeerFlag[] = "--run_as_agent_peer";

// Runs the harness with argv[1..] as its arguments (argv[0] is ignored). Returns the exit code.
int RunAgentPeer(int argc, char** argv);

// For main(): when argv[1] is kAgentPeerFlag, runs the harness on the remaining arguments and
// returns true with its exit code in *exit_code.
bool MaybeRunAsAgentPeer(int argc, char** argv, int* exit_code);

// The path of the running binary plus kAgentPeerFlag: PeerProcess::Start(path, args) of it
// starts this binary as the harness (the binary's main must call MaybeRunAsAgentPeer).
std::pair<std::string, std::vector<std::string>> ReexecAsAgentPeer(std::vector<std::string> args);

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_AGENT_PEER_H_
