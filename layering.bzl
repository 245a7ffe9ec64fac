"""Who may depend on whom: ARCHITECTURE.md's "may depend on" table as Bazel visibility.

Each module's packages default to the visibility below, so a wrong-way dependency (router on
runtime, kvtransfer on runtime, kernels on anything of ours) fails the build. `proto/` and
`common/` are visible to all; `tests/` and `deploy/` may use everything.
"""

_TESTS = ["//tests:__subpackages__", "//deploy:__subpackages__"]

KERNELS_VISIBILITY = [
    "//kernels:__subpackages__",
    # comm's tests only (references): tests/check_deps.sh refuses a comm library on kernels.
    "//comm:__subpackages__",
    "//runtime:__subpackages__",
] + _TESTS

COMM_VISIBILITY = [
    "//comm:__subpackages__",
    "//kvtransfer:__subpackages__",
    "//runtime:__subpackages__",
] + _TESTS

KVTRANSFER_VISIBILITY = [
    "//kvtransfer:__subpackages__",
    "//runtime:__subpackages__",
] + _TESTS

RUNTIME_VISIBILITY = ["//runtime:__subpackages__"] + _TESTS

# Tokenizers: the router (text in / text out) and the runtime's tools may use them.
TOKENIZER_VISIBILITY = [
    "//tokenizer:__subpackages__",
    "//router:__subpackages__",
    "//runtime:__subpackages__",
] + _TESTS

ROUTER_VISIBILITY = ["//router:__subpackages__"] + _TESTS

# Inside router/ (issue 36): the core (no gRPC) serves every router package; the gRPC edge only the
# daemon's binaries (//router), its own tests and the test harness; the fakes (testing/) every
# router package's tests; the CLI's library only the tandem_cli binary.
ROUTER_CORE_VISIBILITY = ROUTER_VISIBILITY
ROUTER_EDGE_VISIBILITY = [
    "//router:__pkg__",
    "//router/grpc:__pkg__",
    "//router/testing:__pkg__",
] + _TESTS
ROUTER_TESTING_VISIBILITY = ROUTER_VISIBILITY
ROUTER_CLI_VISIBILITY = ["//router:__pkg__"]

# The CPU backend (runtime/cpu/, issue 36): its decoders serve the engine's CPU model runner and
# the tests. runtime/cuda/ may not use them (and tests/check_deps.sh checks runtime/cpu/'s
# libraries have no path to runtime/cuda/).
RUNTIME_CPU_VISIBILITY = ["//runtime/cpu:__pkg__", "//runtime/engine:__pkg__"] + _TESTS
