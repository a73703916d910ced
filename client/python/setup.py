"""Puts libgpumem.so.1 inside the gpumem package and tags the wheel for this
platform (metadata is in pyproject.toml).

The library is the file $GPUMEM_LIBRARY names (a built libgpumem.so:
`bazel build -c opt //client/lib:libgpumem.so`; tools/package-wheel sets it),
else gpumem/libgpumem.so.1 if one is there. Without either the build stops
saying so: a wheel without its library could not allocate anything.
"""
import os

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py
from wheel.bdist_wheel import bdist_wheel

HERE = os.path.dirname(os.path.abspath(__file__))


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        src = os.environ.get("GPUMEM_LIBRARY") or os.path.join(HERE, "gpumem", "libgpumem.so.1")
        if not os.path.isfile(src):
            raise SystemExit(
                "gpumem: no libgpumem.so to put in the package (%s is not a file): build it "
                "with `bazel build -c opt //client/lib:libgpumem.so` and set GPUMEM_LIBRARY "
                "to it, or run tools/package-wheel" % src)
        dst = os.path.join(self.build_lib, "gpumem", "libgpumem.so.1")
        self.mkpath(os.path.dirname(dst))
        self.copy_file(src, dst, preserve_mode=False)
        os.chmod(dst, 0o755)


class WithLibrary(Distribution):
    """Not pure: the package has this platform's machine code in it."""

    def has_ext_modules(self):
        return True


class PlatformWheel(bdist_wheel):
    """py3-none-<platform>: any Python 3, this platform's library."""

    def get_tag(self):
        return ("py3", "none") + tuple(super().get_tag()[2:])


setup(distclass=WithLibrary,
      cmdclass={"build_py": BuildPyWithLibrary, "bdist_wheel": PlatformWheel})
