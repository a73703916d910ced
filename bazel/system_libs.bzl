"""Repository rules that wrap Debian's system libraries and tools, offline.

pkg_config_library runs `pkg-config --cflags/--libs` at fetch time and writes a
cc_library carrying those flags; host_tools symlinks binaries found on PATH.
"""

def _pkg_config_library_impl(ctx):
    pkg = ctx.which("pkg-config")
    if pkg == None:
        fail("pkg-config not found: run tools/install-deps")
    cflags = ctx.execute([pkg, "--cflags"] + ctx.attr.modules)
    libs = ctx.execute([pkg, "--libs"] + ctx.attr.modules)
    if cflags.return_code != 0 or libs.return_code != 0:
        fail("pkg-config failed for %s: %s%s (run tools/install-deps)" %
             (ctx.attr.modules, cflags.stderr, libs.stderr))
    copts = [f for f in cflags.stdout.strip().split(" ") if f]

    # System include dirs must not be passed as -I (Bazel rejects absolute
    # include paths in `includes`); they are already on the default path.
    copts = [f for f in copts if f not in ("-I/usr/include",)]
    linkopts = [f for f in libs.stdout.strip().split(" ") if f] + ctx.attr.extra_linkopts
    ctx.file("BUILD", """
cc_library(
    name = "{name}",
    copts = {copts},
    defines = [],
    linkopts = {linkopts},
    visibility = ["//visibility:public"],
)
""".format(name = ctx.attr.name, copts = repr(copts), linkopts = repr(linkopts)))

pkg_config_library = repository_rule(
    implementation = _pkg_config_library_impl,
    attrs = {
        "modules": attr.string_list(mandatory = True),
        "extra_linkopts": attr.string_list(default = []),
    },
    local = True,
)

def _host_tools_impl(ctx):
    for tool in ctx.attr.tools:
        path = ctx.which(tool)
        if path == None:
            fail("%s not found on PATH: run tools/install-deps" % tool)
        ctx.symlink(path, tool)
    ctx.file("BUILD", "exports_files(%s)\n" % repr(ctx.attr.tools))

host_tools = repository_rule(
    implementation = _host_tools_impl,
    attrs = {"tools": attr.string_list(mandatory = True)},
    local = True,
)
