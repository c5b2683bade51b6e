"""Build of the optional compiled part of unimq; everything else is in pyproject.toml.

``core_broker._recordc`` (core_broker/_recordc.c) encodes runs of bare records for the store's
batch put. ``optional=True``: without a C compiler or Python's headers the build of the extension
is skipped with a warning and the install still succeeds; the store then uses its pure-Python
encoder (the same bytes, slower; UNIMQ_NO_NATIVE=1 forces it).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "core_broker._recordc",
            ["core_broker/_recordc.c"],
            optional=True,
            extra_compile_args=["-O2", "-std=c99", "-Wall"],
        )
    ]
)
