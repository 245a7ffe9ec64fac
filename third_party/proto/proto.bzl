"""Protobuf + gRPC C++ codegen with the system `protoc` and `grpc_cpp_plugin`.

  tandem_proto_library(name, srcs = ["tandem/v1/foo.proto"], deps = [...], grpc = True)

`srcs` are relative to the calling package, which is the import root: "tandem/v1/foo.proto" is
imported as `import "tandem/v1/foo.proto";` and its header included as "tandem/v1/foo.pb.h".
`deps` are other tandem_proto_library targets of the same package whose files are imported.
"""

def tandem_proto_library(name, srcs, deps = [], grpc = False, visibility = None):
    """Messages in `name`; with grpc = True, the service stubs in `name + "_grpc"` (it depends on
    `name` and on gRPC), so code that needs only the messages has no dependency on gRPC."""
    pkg = native.package_name()
    hdrs, ccs, grpc_hdrs, grpc_ccs = [], [], [], []
    for src in srcs:
        if not src.endswith(".proto"):
            fail("tandem_proto_library: %s is not a .proto file" % src)
        base = src[:-len(".proto")]
        hdrs.append(base + ".pb.h")
        ccs.append(base + ".pb.cc")
        if grpc:
            grpc_hdrs.append(base + ".grpc.pb.h")
            grpc_ccs.append(base + ".grpc.pb.cc")

    native.filegroup(name = name + "_protos", srcs = srcs + [d + "_protos" for d in deps], visibility = visibility)

    cmd = "protoc --proto_path={root} --cpp_out=$(RULEDIR)".format(root = pkg or ".")
    if grpc:
        cmd += " --grpc_out=$(RULEDIR) --plugin=protoc-gen-grpc=$$(command -v grpc_cpp_plugin)"
    cmd += " " + " ".join(["%s/%s" % (pkg, s) if pkg else s for s in srcs])
    native.genrule(
        name = name + "_codegen",
        srcs = [":" + name + "_protos"],
        outs = hdrs + ccs + grpc_hdrs + grpc_ccs,
        cmd = cmd,
        message = "protoc %s" % name,
        visibility = ["//visibility:private"],
    )
    native.cc_library(
        name = name,
        srcs = ccs,
        hdrs = hdrs,
        includes = ["."],
        deps = deps + ["@system//:protobuf"],
        visibility = visibility,
    )
    if grpc:
        native.cc_library(
            name = name + "_grpc",
            srcs = grpc_ccs,
            hdrs = grpc_hdrs,
            includes = ["."],
            deps = [":" + name, "@system//:grpc++"],
            visibility = visibility,
        )
