// agent_peer: the harness binary of the two-process transfer tests and the benchmark; see
// agent_peer.h for what it does and its arguments.
#include "kvtransfer/ucx/agent_peer.h"

int main(int argc, char** argv) { return tandem::kvtransfer::RunAgentPeer(argc, argv); }
