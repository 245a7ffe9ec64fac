"""cutlass_cuda_library: a cuda_library (third_party/cuda/cuda.bzl) compiled against CUTLASS.

  cutlass_cuda_library(name, srcs = [*.cu], hdrs, deps, copts)

Defines nothing unless both CUDA and CUTLASS are enabled (@local_cuda, @cutlass), as
cuda_library defines nothing in a CPU-only build. Adds @cutlass//:cutlass and -DNDEBUG: CUTLASS's
device asserts are calls inside the wgmma pipeline, which make ptxas serialize every wgmma
(warning C7510); CUTLASS's own release builds define NDEBUG too.
"""

load("@cutlass//:defs.bzl", "CUTLASS_ENABLED")
load("@local_cuda//:defs.bzl", "CUDA_ENABLED")
load("//third_party/cuda:cuda.bzl", "cuda_library")

def cutlass_cuda_library(name, srcs, hdrs = [], deps = [], copts = [], **kwargs):
    if not (CUDA_ENABLED and CUTLASS_ENABLED):
        return
    cuda_library(
        name = name,
        srcs = srcs,
        hdrs = hdrs,
        deps = deps + ["@cutlass"],
        copts = copts + ["-DNDEBUG"],
        **kwargs
    )
