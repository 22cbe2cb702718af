"""Install tftpu and its command-line tools.

    pip install -c constraints.txt -e ".[test]"
"""

from setuptools import find_packages, setup

TOOLS = ["optimize", "transform", "calibrate", "deploy", "run", "compare", "tac", "demo", "convert"]

setup(
    name="tftpu",
    version="0.1.0",
    description="TensorFlow/Keras graph optimizer and model compiler for NPU-style accelerators",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11,<3.12",
    packages=find_packages(include=["tftpu", "tftpu.*"]) + ["tftpu_tools"],
    package_dir={"tftpu_tools": "tools"},
    package_data={"tftpu.assets": ["*.jpg", "*.txt"], "tftpu.data": ["kernels/*.cc"], "tftpu.interp.tpu": ["*.cc"]},
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
    ],
    extras_require={
        # joblib + lz4 read the mtcnn weight pickles once, in tests/material.py, to write .npz
        # hypothesis sweeps shapes and fuzzes readers; import-linter (on grimp) enforces the layers
        "test": ["pytest==9.2.0", "pytest-xdist==3.8.0", "joblib==1.6.0", "lz4==4.4.5",
                 "hypothesis==6.170.15", "import-linter==2.16", "grimp==3.19"],
        # benchmarks/transposes.py compares against onnxsim
        "bench": ["onnxsim==0.8.1"],
    },
    entry_points={
        "console_scripts": [f"tftpu-{t} = tftpu_tools.tftpu_{t}:run" for t in TOOLS],
    },
)
