"""Repository rule `@local_cuda`: finds the CUDA toolkit, or records that there is none.

Detection order: $TANDEM_CUDA=off forces a CPU-only build (`--config=cpu` sets it);
else $CUDA_HOME; else /usr/local/cuda. A toolkit counts as present when bin/nvcc and
include/cuda_runtime.h exist. The generated `defs.bzl` exports:

  CUDA_ENABLED   bool
  CUDA_HOME      str ("" when disabled)
  if_cuda(a, b)  a when CUDA is enabled, else b

and BUILD targets (only when enabled): :cuda_headers, :cudart_static, :cublas, :nccl, :nvcc.
"""

def _cuda_home(ctx):
    env = ctx.os.environ
    if env.get("TANDEM_CUDA", "").lower() in ["0", "off", "false", "no"]:
        return None, "disabled by TANDEM_CUDA=%s (--config=cpu)" % env.get("TANDEM_CUDA")
    candidates = []
    if env.get("CUDA_HOME"):
        candidates.append(env["CUDA_HOME"])
    candidates.append("/usr/local/cuda")
    for home in candidates:
        if ctx.path(home + "/bin/nvcc").exists and ctx.path(home + "/include/cuda_runtime.h").exists:
            return home, "found at " + home
    return None, "not found (looked in %s)" % ", ".join(candidates)

_ENABLED_BUILD = """
package(default_visibility = ["//visibility:public"])

exports_files(["bin/nvcc"])

filegroup(
    name = "nvcc",
    srcs = ["bin/nvcc"],
)

# Host-side CUDA headers (runtime API, fp16/bf16, cuBLAS, NCCL). Device code compiled by nvcc
# sees the full toolkit include directory through nvcc itself.
cc_library(
    name = "cuda_headers",
    hdrs = glob(
        ["include/*.h", "include/*.hpp", "include/crt/**", "include/nccl_device/**"],
        allow_empty = True,
    ),
    includes = ["include"],
)

cc_library(
    name = "cudart_static",
    srcs = ["lib64/libcudart_static.a"],
    linkopts = ["-ldl", "-lrt", "-lpthread"],
    deps = [":cuda_headers"],
)

cc_library(
    name = "cublas",
    linkopts = ["-L{home}/lib64", "-lcublasLt", "-lcublas", "-Wl,-rpath,{home}/lib64"],
    deps = [":cuda_headers"],
)

cc_library(
    name = "nccl",
    linkopts = ["-L{home}/lib64", "-lnccl", "-Wl,-rpath,{home}/lib64"],
    deps = [":cuda_headers"],
)
"""

def _cuda_configure_impl(ctx):
    home, why = _cuda_home(ctx)
    enabled = home != None

    # Printed once per fetch so the build says what it chose.
    print("Tandem: CUDA toolkit %s -> %s build" % (why, "CUDA" if enabled else "CPU-only"))
    if enabled:
        for sub in ["bin", "include", "lib64"]:
            ctx.symlink(home + "/" + sub, sub)
        ctx.file("BUILD.bazel", _ENABLED_BUILD.replace("{home}", home))
    else:
        ctx.file("BUILD.bazel", 'package(default_visibility = ["//visibility:public"])\n')
    ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % ctx.name)
    ctx.file("defs.bzl", """
CUDA_ENABLED = {enabled}
CUDA_HOME = "{home}"
CUDA_STATUS = "{why}"

def if_cuda(if_true, if_false = []):
    return if_true if CUDA_ENABLED else if_false
""".format(enabled = enabled, home = home or "", why = why))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["TANDEM_CUDA", "CUDA_HOME"],
    local = True,
)
