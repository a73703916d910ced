"""cc_fuzz_target: one libFuzzer target, usable in every build config.

A target's source defines LLVMFuzzerTestOneInput (and may define
LLVMFuzzerInitialize). The macro makes:
  NAME              the fuzzer: libFuzzer's main under --config=fuzz (clang,
                    ASan+UBSan, coverage), otherwise a driver that runs each
                    input file (or folder of them) given once, so the same
                    binary replays a corpus under any config;
  NAME_corpus_test  replays the committed corpus folder (corpus/NAME: seeds
                    and every crash found, kept as regression inputs) in
                    every config: plain, asan, tsan and fuzz.
"""

def cc_fuzz_target(name, srcs, deps = [], corpus = None, size = "small", tags = [], **kwargs):
    corpus = corpus or ("corpus/" + name)
    native.cc_library(
        name = name + "_lib",
        testonly = True,
        srcs = srcs,
        deps = deps,
        alwayslink = True,
        **kwargs
    )
    driver = select({
        "//bazel:fuzzing": [],
        "//conditions:default": ["//tests/fuzz:replay_main"],
    })
    linkopts = select({
        "//bazel:fuzzing": ["-fsanitize=fuzzer"],
        "//conditions:default": [],
    })
    native.cc_binary(
        name = name,
        testonly = True,
        deps = [":" + name + "_lib"] + driver,
        linkopts = linkopts,
    )
    native.cc_test(
        name = name + "_corpus_test",
        size = size,
        tags = tags,
        deps = [":" + name + "_lib"] + driver,
        linkopts = linkopts,
        data = native.glob([corpus + "/**"]),
        # libFuzzer: -runs=0 runs the inputs once; the replay driver skips
        # flags. The folder is relative to the runfiles root (the test's cwd).
        args = ["-runs=0", native.package_name() + "/" + corpus],
    )
