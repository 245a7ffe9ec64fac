"""cutlass_cuda_library: a cuda_library (third_party/cuda/cuda.bzl) compiled against CUTLASS.

  cutlass_cuda_library(name, srcs = [*.cu], hdrs, deps, copts)

Defines nothing unless both CUDA and CUTLASS are enabled (@local_cuda, @cutlass), as
cuda_library defines nothing in a CPU-only build. Differences from cuda_library:
  * @cutlass//:cutlass added to deps (its headers as -isystem: their warnings are not ours);
  * -DNDEBUG: CUTLASS's device asserts are calls inside the wgmma pipeline, which make ptxas
    serialize every wgmma (warning C7510); CUTLASS's own release builds define NDEBUG too;
  * sm_90a code only, no compute_90 PTX: CUTLASS's sm90 kernels are sm_90a-only (their
    compute_90 form would be an empty kernel that reports the wrong architecture), and that
    second device pass costs ~40% more compile time for nothing. Callers check for sm_90.
"""

load("@cutlass//:defs.bzl", "CUTLASS_ENABLED")
load("@local_cuda//:defs.bzl", "CUDA_ENABLED", "CUDA_HOME")
load("//third_party/cuda:cuda.bzl", "NVCC_FLAGS")

def _cutlass_objects_impl(ctx):
    infos = [d[CcInfo] for d in ctx.attr.deps if CcInfo in d]
    cc_info = cc_common.merge_cc_infos(cc_infos = infos)
    comp = cc_info.compilation_context
    flags = NVCC_FLAGS + ["-DNDEBUG"]  # NVCC_FLAGS has no PTX gencode (cuda_library adds it)
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
        stem = src.basename.rsplit(".", 1)[0]
        obj = ctx.actions.declare_file("_cutlass_objs/%s/%s.o" % (ctx.label.name, stem))
        ctx.actions.run(
            executable = CUDA_HOME + "/bin/nvcc",
            arguments = flags + ["-c", src.path, "-o", obj.path],
            inputs = inputs,
            outputs = [obj],
            mnemonic = "NvccCompile",
            progress_message = "nvcc (CUTLASS) %s" % src.short_path,
            use_default_shell_env = True,
        )
        objs.append(obj)
    return [DefaultInfo(files = depset(objs))]

_cutlass_objects = rule(
    implementation = _cutlass_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = [".h", ".cuh"]),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
    },
)

def cutlass_cuda_library(name, srcs, hdrs = [], deps = [], copts = [], **kwargs):
    if not (CUDA_ENABLED and CUTLASS_ENABLED):
        return
    _cutlass_objects(
        name = name + "_cutlass_objs",
        srcs = srcs,
        hdrs = hdrs,
        deps = deps + ["@cutlass", "@local_cuda//:cuda_headers"],
        copts = copts,
        testonly = kwargs.get("testonly", False),
        visibility = ["//visibility:private"],
    )
    native.cc_library(
        name = name,
        srcs = [":" + name + "_cutlass_objs"],
        hdrs = hdrs,
        deps = deps + ["@cutlass", "@local_cuda//:cudart_static"],
        **kwargs
    )
