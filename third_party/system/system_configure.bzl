"""Repository rule `@system`: Debian's system libraries as Bazel targets.

Link flags come from `pkg-config` at fetch time (nothing is downloaded). Headers live in
/usr/include, which is on the compiler's builtin search path, so targets carry link flags only.
Leaf packages depend on these labels; they never spell `-l` flags themselves.
"""

# target name -> (pkg-config modules, extra link flags)
_PKG_TARGETS = {
    "absl_base": (["absl_base", "absl_log_severity"], []),
    # Failure signal handler + symbolizer: stack traces when a daemon dies (common/crash_handler).
    "absl_debugging": (["absl_failure_signal_handler", "absl_symbolize", "absl_stacktrace"], []),
    "absl_container": (["absl_raw_hash_set", "absl_hash", "absl_flat_hash_map", "absl_node_hash_map"], []),
    "absl_flags": (["absl_flags", "absl_flags_parse", "absl_flags_usage", "absl_flags_marshalling"], []),
    "absl_random": (["absl_random_random", "absl_random_distributions", "absl_random_seed_sequences"], []),
    "absl_status": (["absl_status", "absl_statusor", "absl_cord"], []),
    "absl_strings": (["absl_strings", "absl_str_format"], []),
    "absl_synchronization": (["absl_synchronization"], []),
    "absl_time": (["absl_time", "absl_time_zone"], []),
    "crypto": (["libcrypto"], []),  # OpenSSL: SHA-256 for prefix-cache block hashes
    "ssl": (["libssl", "libcrypto"], []),  # OpenSSL TLS: HTTPS in common/http
    "glog": (["libglog", "gflags"], []),
    "grpc++": (["grpc++", "protobuf"], []),
    # Header-only (config.json, safetensors headers); the target documents the dependency.
    "nlohmann_json": (["nlohmann_json"], []),
    "grpc++_reflection": (["grpc++", "protobuf"], ["-Wl,--no-as-needed", "-lgrpc++_reflection", "-Wl,--as-needed"]),
    "protobuf": (["protobuf"], []),
    # Tokenizer: PCRE2 for the pre-tokenizer regexes (lookahead, Unicode properties), ICU for
    # the NFC / NFKC normalizers.
    "pcre2": (["libpcre2-8"], []),
    "icu": (["icu-uc"], []),
    # SentencePiece .model tokenizers (Llama-2, Mistral).
    "sentencepiece": (["sentencepiece"], []),
    "ucx": (["ucx"], []),
}

# Libraries without a pkg-config file: (probe file under /usr, link flags).
_PLAIN_TARGETS = {
    # Debian's libgloo-dev installs /usr/lib/libgloo.so (not the multiarch dir).
    "gloo": ("lib/libgloo.so", ["-L/usr/lib", "-lgloo", "-lpthread"]),
    # Boost.Beast / Asio 1.74 (header-only): the daemons' HTTP server (common/http).
    "boost_beast": ("include/boost/beast.hpp", ["-lpthread"]),
    # Debian's googletest ships static archives only; order matters for static linking.
    "gtest": ("lib/x86_64-linux-gnu/libgtest.a", ["-l:libgmock.a", "-l:libgtest.a", "-lpthread"]),
    "gtest_main": ("lib/x86_64-linux-gnu/libgtest_main.a", ["-l:libgtest_main.a", "-l:libgmock.a", "-l:libgtest.a", "-lpthread"]),
}

_INSTALL_HINT = "run deploy/install_deps.sh (as root) to install the Debian packages the build needs"

def _pkg_config(ctx, modules):
    res = ctx.execute(["pkg-config", "--libs"] + modules)
    if res.return_code != 0:
        fail("@system: pkg-config --libs %s failed: %s\n%s" % (" ".join(modules), res.stderr, _INSTALL_HINT))
    return res.stdout.strip().split(" ")

def _target(name, linkopts):
    return """
cc_library(
    name = "{name}",
    linkopts = {linkopts},
)
""".format(name = name, linkopts = repr(linkopts))

def _system_configure_impl(ctx):
    if ctx.which("pkg-config") == None:
        fail("@system: pkg-config not found; " + _INSTALL_HINT)
    body = ['package(default_visibility = ["//visibility:public"])\n']
    for name in sorted(_PKG_TARGETS):
        modules, extra = _PKG_TARGETS[name]
        flags = [f for f in _pkg_config(ctx, modules) if f]
        body.append(_target(name, flags + extra))
    for name in sorted(_PLAIN_TARGETS):
        probe, flags = _PLAIN_TARGETS[name]
        if not ctx.path("/usr/" + probe).exists:
            fail("@system: /usr/%s not found (needed by @system//:%s); %s" % (probe, name, _INSTALL_HINT))
        body.append(_target(name, flags))
    ctx.file("BUILD.bazel", "".join(body))
    ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % ctx.name)

system_configure = repository_rule(
    implementation = _system_configure_impl,
    environ = ["PKG_CONFIG_PATH"],
    local = True,
)
