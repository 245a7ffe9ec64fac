"""nvcc build rules.

  cuda_library(name, srcs = [*.cu], hdrs, deps)   compiles each .cu with nvcc into an object and
                                                  wraps the objects in a cc_library (linked with
                                                  static cudart, so binaries need only the driver).
  cuda_cc_test(name, ...)                         a cc_test tagged "gpu" (bundled by tests/gpu/bundle.sh).
  cuda_cc_binary(name, ...)                       a cc_binary tagged "gpu_bench" (likewise).

In a CPU-only build (no toolkit, or --config=cpu) all three define nothing: GPU-only targets are
excluded, not broken. Device code targets sm_90a (Hopper, wgmma/TMA); optimized builds (-c opt:
the GPU bundles, tests/gpu/bundle.sh with BAZEL adding it) embed compute_90 PTX as well, for
newer GPUs to JIT. The PTX is a second device compile of every .cu (a third of nvcc's time), so
the default build (CI's, which runs no GPU code) leaves it out.
"""

load("@local_cuda//:defs.bzl", "CUDA_ENABLED", "CUDA_HOME")

NVCC_FLAGS = [
    "-std=c++20",
    "-O3",
    "-lineinfo",
    "-gencode=arch=compute_90a,code=sm_90a",
    "--expt-relaxed-constexpr",
    "-Xcompiler=-fPIC,-Wall,-Wextra",
    "-Werror=all-warnings",
    "-Xcompiler=-Werror",
]

def _cuda_objects_impl(ctx):
    cc_info = cc_common.merge_cc_infos(cc_infos = [d[CcInfo] for d in ctx.attr.deps if CcInfo in d])
    comp = cc_info.compilation_context
    flags = list(NVCC_FLAGS)
    if ctx.var["COMPILATION_MODE"] == "opt":
        flags.append("-gencode=arch=compute_90,code=compute_90")
    flags += ["-I.", "-I" + ctx.bin_dir.path]
    for inc in comp.includes.to_list() + comp.quote_includes.to_list():
        flags.append("-I" + inc)
    for inc in comp.system_includes.to_list():
        flags += ["-isystem", inc]
    for d in comp.defines.to_list():
        flags.append("-D" + d)
    flags += ctx.attr.copts
    inputs = depset(ctx.files.srcs + ctx.files.hdrs, transitive = [comp.headers])
    objs = []
    for src in ctx.files.srcs:
        obj = ctx.actions.declare_file("_cuda_objs/%s/%s.o" % (ctx.label.name, src.basename.rsplit(".", 1)[0]))
        ctx.actions.run(
            executable = CUDA_HOME + "/bin/nvcc",
            arguments = flags + ["-c", src.path, "-o", obj.path],
            inputs = inputs,
            outputs = [obj],
            mnemonic = "NvccCompile",
            progress_message = "nvcc %s" % src.short_path,
            use_default_shell_env = True,
        )
        objs.append(obj)
    return [DefaultInfo(files = depset(objs))]

_cuda_objects = rule(
    implementation = _cuda_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = [".h", ".cuh"]),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
    },
)

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], **kwargs):
    if not CUDA_ENABLED:
        return
    _cuda_objects(
        name = name + "_cuda_objs",
        srcs = srcs,
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cuda_headers"],
        copts = copts,
        testonly = kwargs.get("testonly", False),
        visibility = ["//visibility:private"],
    )
    native.cc_library(
        name = name,
        srcs = [":" + name + "_cuda_objs"],
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cudart_static"],
        **kwargs
    )

def cuda_cc_test(name, tags = [], **kwargs):
    if not CUDA_ENABLED:
        return
    native.cc_test(name = name, tags = tags + ["gpu"], **kwargs)

def cuda_cc_binary(name, tags = [], **kwargs):
    if not CUDA_ENABLED:
        return
    native.cc_binary(name = name, tags = tags + ["gpu_bench"], **kwargs)
