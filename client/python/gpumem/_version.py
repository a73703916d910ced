"""The package's version: the wheel's (pyproject.toml reads it from here) and
the Debian packages' upstream version (tools/package-deb refuses a
deploy/debian/changelog that says otherwise)."""
__version__ = "0.1.0"
