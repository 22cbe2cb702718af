"""Install tftpu and its command-line tools.

    pip install -c constraints.txt -e ".[test]"
"""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError

HERE = Path(__file__).resolve().parent


def _module(path: str):
    """A stdlib-only module of tftpu, loaded by path (the package's dependencies are not installed yet)."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, HERE / path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module     # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


isa = _module("tftpu/utils/isa.py")
#: The plain C++ libraries (called through ctypes): the kernels once per instruction-set variant,
#: the CPU feature probe in the portable variant only.
NATIVE_LIBRARIES = [("tftpu/interp/tpu/int8_native.cc", v) for v in isa.buildable()] + \
    [("tftpu/utils/cpu_features.cc", "generic")]
LIBFLAGS = ("-O3", "-fPIC", "-shared", "-std=c++17", "-ffp-contract=off")   # = tftpu.utils.native.LIBFLAGS


class NativeLibrary(Extension):
    """One variant of a plain C++ library: built by the compiler directly, not as a CPython module."""

    def __init__(self, source: str, variant: str):
        stem = Path(source).stem
        package = source.rsplit("/", 1)[0].replace("/", ".")
        super().__init__(f"{package}._{stem}_{variant}", sources=[source], optional=True)
        self.source, self.variant = source, variant


class build_native(build_ext):
    """Compiles every variant of the native kernels (two at a time); a variant that fails to build
    (no C++ compiler, an old one) is left out with a warning: tftpu then builds it on first use if
    it can, else runs its numpy paths, which compute the same integers."""

    def finalize_options(self):
        super().finalize_options()
        if self.parallel is None:
            self.parallel = max(2, os.cpu_count() or 1)

    def build_extension(self, ext):
        if not isinstance(ext, NativeLibrary):
            return super().build_extension(ext)
        import hashlib

        source = HERE / ext.source
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256(source.read_bytes()).hexdigest()
        cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or "c++"
        tmp = target.with_name(target.name + ".tmp")
        command = [cxx, *LIBFLAGS, *isa.VARIANTS[ext.variant].flags, f'-DTFTPU_ISA_NAME="{ext.variant}"',
                   f'-DTFTPU_SOURCE_SHA256="{digest}"', str(source), "-o", str(tmp)]
        print(f"building {target.name} ({ext.variant})", flush=True)
        try:
            proc = subprocess.run(command, capture_output=True, text=True)
        except OSError as exc:
            raise CompileError(f"{cxx}: {exc}") from None
        if proc.returncode:
            tmp.unlink(missing_ok=True)
            raise CompileError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "compiler failed")
        os.replace(tmp, target)


#: The documentation site's generator (installed and built together on Python 3.11, 2026-11).
DOCS = ["mkdocs==1.6.1", "mkdocs-material==9.8.1", "mkdocstrings==1.0.8", "mkdocstrings-python==2.0.11"]
TOOLS = ["optimize", "transform", "calibrate", "deploy", "run", "compare", "tac", "demo", "convert", "evaluate"]

setup(
    name="tftpu",
    version="0.1.0",
    description="TensorFlow/Keras graph optimizer and model compiler for NPU-style accelerators",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11,<3.12",
    packages=find_packages(include=["tftpu", "tftpu.*"]) + ["tftpu_tools"],
    package_dir={"tftpu_tools": "tools"},
    package_data={"tftpu": ["configs/*/*.yaml"], "tftpu.assets": ["*.jpg", "*.txt"], "tftpu.data": ["kernels/*.cc"], "tftpu.interp.tpu": ["*.cc"]},
    include_package_data=True,
    # The stack below was installed and run together on Python 3.11 (2026-11);
    # constraints.txt pins everything else it pulls in.
    install_requires=[
        "tensorflow-cpu==2.21.0",
        "keras==3.15.1",
        "tf2onnx==1.17.0",
        "onnx==1.23.2",
        "onnxruntime==1.31.1",
        "xdsl==0.74.0",
        "absl-py==2.5.1",
        "numpy==2.4.6",
        "ml_dtypes==0.6.0",
        "tqdm==4.70.1",
        "flatbuffers==25.12.19",   # TFLite models, read with TF's own schema (tftpu.tac)
        "protobuf==7.36.2",
        "PyYAML==6.0.3",
        "ai-edge-litert==2.3.0",   # LiteRT runs .tflite files (tftpu.lite.runtime); installs with the stack above
        "matplotlib==3.11.2",      # the plots of tftpu-deploy's HTML report
        "scipy==1.17.1",           # LAPACK's Cholesky routines for the refit's SPD systems (tftpu.utils.spd)
        "threadpoolctl==3.6.0",    # numpy's BLAS held to one thread where its small products would spin
    ],
    extras_require={
        # joblib + lz4 read the mtcnn weight pickles once, in tests/material.py, to write .npz
        # hypothesis sweeps shapes and fuzzes readers; import-linter (on grimp) enforces the layers;
        # the docs extra too: the tests build the site and run its examples
        "test": ["pytest==9.2.0", "pytest-xdist==3.8.0", "joblib==1.6.0", "lz4==4.4.5",
                 "hypothesis==6.170.15", "import-linter==2.16", "grimp==3.19", *DOCS],
        # the documentation site: mkdocs build --strict (mkdocs.yml, docs/)
        "docs": DOCS,
        # benchmarks/transposes.py compares against onnxsim
        "bench": ["onnxsim==0.8.1"],
    },
    ext_modules=[NativeLibrary(src, v) for src, v in NATIVE_LIBRARIES],
    cmdclass={"build_ext": build_native},
    entry_points={
        "console_scripts": [f"tftpu-{t} = tftpu_tools.tftpu_{t}:run" for t in TOOLS],
    },
)
