"""cc_grpc_proto: protoc + grpc_cpp_plugin from the host, as a genrule.

Offline there is no cc_grpc_library; this generates <name>.pb.{h,cc} and
<name>.grpc.pb.{h,cc} for one .proto and wraps them in a cc_library.
Imports are resolved relative to the workspace root.
"""

def cc_grpc_proto(name, src, deps = [], grpc = True, visibility = None):
    base = src[:-len(".proto")]
    pkg = native.package_name()
    outs = [base + ".pb.h", base + ".pb.cc"]
    if grpc:
        outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
    proto_deps = [d + "_srcs" for d in deps]
    cmd = "$(location @host_tools//:protoc) -I. --cpp_out=$(GENDIR) "
    if grpc:
        cmd += ("--grpc_out=$(GENDIR) --plugin=protoc-gen-grpc=$(location @host_tools//:grpc_cpp_plugin) ")
    cmd += pkg + "/" + src
    native.filegroup(name = name + "_srcs", srcs = [src] + proto_deps, visibility = visibility)
    native.genrule(
        name = name + "_gen",
        srcs = [src] + proto_deps,
        outs = outs,
        cmd = cmd,
        tools = ["@host_tools//:protoc", "@host_tools//:grpc_cpp_plugin"],
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        deps = deps + ["@protobuf"] + (["@grpc"] if grpc else []),
        visibility = visibility,
    )
