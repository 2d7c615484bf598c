"""Build glue that pyproject.toml cannot express: the C++ extension, and
shipping the CUDA snippets (csrc/hopmm/**/*.cuh and the *.cu.in templates)
inside the package.

Installed (non-editable), the snippets live at hopmm/csrc/hopmm/..., mirroring
the repository's csrc/ directory (hopmm/render.py looks in both places).
"""

from pathlib import Path

from pybind11.setup_helpers import Pybind11Extension
from setuptools import setup
from setuptools.command.build_py import build_py

CSRC = "csrc"
SNIPPET_GLOBS = ("hopmm/**/*.cuh", "hopmm/**/*.cu.in")


class build_py_with_snippets(build_py):
    """Copies the CUDA snippets to <build_lib>/hopmm/csrc/ for wheels."""

    def run(self):
        super().run()
        # Editable installs read the snippets straight from the repository.
        if getattr(self, "editable_mode", False):
            return
        root = Path(CSRC)
        for src in sorted(p for pattern in SNIPPET_GLOBS for p in root.glob(pattern)):
            dst = Path(self.build_lib, "hopmm", CSRC, src.relative_to(root))
            self.mkpath(str(dst.parent))
            self.copy_file(str(src), str(dst))


setup(
    ext_modules=[
        Pybind11Extension(
            "hopmm._tensormap",
            [f"{CSRC}/tensormap.cpp"],
            cxx_std=17,
            # dlopen/dlsym for libcuda (part of libc since glibc 2.34).
            libraries=["dl"],
        )
    ],
    cmdclass={"build_py": build_py_with_snippets},
)
