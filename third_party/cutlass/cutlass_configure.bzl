"""Repository rule `@cutlass`: finds NVIDIA CUTLASS's C++ headers, or records that there are none.

Nothing is downloaded: the headers come from PyPI's `nvidia-cutlass` wheel (4.2.0.0), which
tests/run.sh installs into its cached venv beside the openai client. Detection order:
$TANDEM_CUTLASS=off disables it; else $TANDEM_CUTLASS_INCLUDE (a directory holding
cutlass/cutlass.h and cute/tensor.hpp); else the venv $TANDEM_PYENV (default
$HOME/.cache/tandem/pyenv): lib/python3.*/site-packages/cutlass_library/source/include. CUTLASS
is used only in CUDA builds, so a CPU-only build (TANDEM_CUDA=off, --config=cpu) disables it too.

The generated `defs.bzl` exports:

  CUTLASS_ENABLED   bool
  CUTLASS_INCLUDE   str ("" when disabled)
  if_cutlass(a, b)  a when CUTLASS is enabled, else b

and, only when enabled, the target :cutlass (the headers, as system includes: their warnings
are not ours). Targets that need it are declared only when CUTLASS_ENABLED (third_party/cutlass
/cutlass.bzl's cutlass_cuda_library, or the `for _ in ([1] if CUTLASS_ENABLED else [])` form),
as CUDA-only targets are in a CPU-only build; callers fall back to what they had.

The rule re-runs when one of the variables above changes; after installing the wheel into an
existing venv by hand, `bazel sync --configure` (or any change of $TANDEM_CUTLASS_INCLUDE) makes
it look again. tests/run.sh exports TANDEM_CUTLASS_INCLUDE for that reason.
"""

def _has_headers(ctx, include):
    return (ctx.path(include + "/cutlass/cutlass.h").exists and
            ctx.path(include + "/cute/tensor.hpp").exists)

def _venv_include(ctx, pyenv):
    lib = ctx.path(pyenv + "/lib")
    if not lib.exists:
        return None
    for py in lib.readdir():
        if not py.basename.startswith("python3"):
            continue
        include = "%s/site-packages/cutlass_library/source/include" % py
        if _has_headers(ctx, include):
            return include
    return None

def _cutlass_include(ctx):
    env = ctx.os.environ
    off = ["0", "off", "false", "no"]
    if env.get("TANDEM_CUTLASS", "").lower() in off:
        return None, "disabled by TANDEM_CUTLASS=%s" % env.get("TANDEM_CUTLASS")
    if env.get("TANDEM_CUDA", "").lower() in off:
        return None, "disabled with CUDA (TANDEM_CUDA=%s, --config=cpu)" % env.get("TANDEM_CUDA")
    explicit = env.get("TANDEM_CUTLASS_INCLUDE", "")
    if explicit:
        if _has_headers(ctx, explicit):
            return explicit, "found at " + explicit
        return None, "not found at TANDEM_CUTLASS_INCLUDE=" + explicit
    pyenv = env.get("TANDEM_PYENV", "") or (env.get("HOME", "") + "/.cache/tandem/pyenv")
    include = _venv_include(ctx, pyenv)
    if include:
        return include, "found at " + include
    return None, "not found (TANDEM_CUTLASS_INCLUDE unset, no nvidia-cutlass wheel in %s)" % pyenv

_ENABLED_BUILD = """
package(default_visibility = ["//visibility:public"])

# CUTLASS and CuTe headers (header-only). -isystem: their warnings are not ours.
cc_library(
    name = "cutlass",
    hdrs = glob(["include/cutlass/**", "include/cute/**"]),
    includes = ["include"],
)
"""

def _cutlass_configure_impl(ctx):
    include, why = _cutlass_include(ctx)
    enabled = include != None

    # Printed once per fetch so the build says what it chose.
    verdict = "built" if enabled else "skipped"
    print("Tandem: CUTLASS headers %s -> CUTLASS kernels %s" % (why, verdict))
    if enabled:
        ctx.symlink(include, "include")
        ctx.file("BUILD.bazel", _ENABLED_BUILD)
    else:
        ctx.file("BUILD.bazel", 'package(default_visibility = ["//visibility:public"])\n')
    ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % ctx.name)
    ctx.file("defs.bzl", """
CUTLASS_ENABLED = {enabled}
CUTLASS_INCLUDE = "{include}"
CUTLASS_STATUS = "{why}"

def if_cutlass(if_true, if_false = []):
    return if_true if CUTLASS_ENABLED else if_false
""".format(enabled = enabled, include = include or "", why = why))

cutlass_configure = repository_rule(
    implementation = _cutlass_configure_impl,
    environ = ["TANDEM_CUTLASS", "TANDEM_CUTLASS_INCLUDE", "TANDEM_PYENV", "TANDEM_CUDA", "HOME"],
    local = True,
)
