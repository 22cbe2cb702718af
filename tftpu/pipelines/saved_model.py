"""Run tftpu's graph passes over a SavedModel's signatures and write the optimized SavedModel.

The new serving signatures take the original inputs (S2D happens at the start of the graph, on
the host) and keep the original variables, with their original shapes.

>>> report = optimize_saved_model("resnet/", "resnet_s2d/", target="tpu")   # doctest: +SKIP
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Sequence

from tftpu.errors import ModelFileError, OutputError, UsageError
from tftpu.graph.pass_manager import Report
from tftpu.utils import files


def load(saved_model_dir):
    """Load a SavedModel, or raise ModelFileError naming the directory."""
    path = Path(saved_model_dir)
    if path.is_file():
        raise ModelFileError(path, "a file, not a SavedModel directory")
    if not path.is_dir():
        raise ModelFileError(path, "no such directory")
    if not (path / "saved_model.pb").is_file() and not (path / "saved_model.pbtxt").is_file():
        raise ModelFileError(path, "not a SavedModel (no saved_model.pb)")
    import tensorflow as tf

    try:
        return tf.saved_model.load(str(path))
    except (OSError, ValueError, tf.errors.OpError) as e:
        msg = getattr(e, "message", None) or str(e)
        raise ModelFileError(path, f"cannot load SavedModel: {msg.splitlines()[0]}") from None


def optimize_saved_model(saved_model_dir, output_dir, *, target="tpu", disable: Sequence[str] = (),
                         pass_options: dict | None = None) -> dict[str, Report]:
    """Optimize every signature of `saved_model_dir`; write the result to `output_dir`
    (atomically: a temporary directory beside it, renamed at the end). Returns the reports."""
    out = Path(output_dir)
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out}: the output directory is an existing file")
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"{out}: output directory exists and is not empty")
    if out.resolve() == Path(saved_model_dir).resolve():
        raise UsageError("--output_dir must differ from --saved_model_dir")
    tmp = files.temp_dir_beside(out)     # an unwritable output fails before the model is loaded
    try:
        reports = _optimize_into(saved_model_dir, tmp, target, disable, pass_options)
        try:
            if out.exists():
                out.rmdir()
            os.replace(tmp, out)
        except OSError as e:
            raise OutputError(out, e.strerror or str(e)) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return reports


def _optimize_into(saved_model_dir, tmp: Path, target, disable, pass_options) -> dict:
    """Optimize every signature of `saved_model_dir` and save the result into `tmp`."""
    loaded = load(saved_model_dir)
    import tensorflow as tf

    from tftpu.pipelines.optimize import optimize

    if not loaded.signatures:
        raise ModelFileError(saved_model_dir, "SavedModel has no signatures to optimize")
    module = tf.Module()
    module.original = loaded          # tracks the original variables (shapes unchanged)
    signatures, reports = {}, {}
    for key in sorted(loaded.signatures):
        sig = loaded.signatures[key]
        fast = optimize(sig, target=target, disable=disable, pass_options=pass_options)
        reports[key] = fast.report
        specs = sig.structured_input_signature[1]
        names = sorted(specs)
        serve = tf.function(_serving(fast, names))
        concrete = serve.get_concrete_function(
            *[tf.TensorSpec(specs[n].shape, specs[n].dtype, name=n) for n in names])
        setattr(module, f"signature_{len(signatures)}", serve)
        signatures[key] = concrete
    try:
        tf.saved_model.save(module, str(tmp), signatures=signatures)
    except (tf.errors.ResourceExhaustedError, tf.errors.PermissionDeniedError, OSError) as e:   # a full disk
        raise OutputError(tmp.parent, f"cannot write the SavedModel: {' '.join(str(getattr(e, 'message', e)).split())[:200]}") from None
    deterministic_fingerprint(tmp)
    return reports


def deterministic_fingerprint(saved_model_dir) -> None:
    """Make `fingerprint.pb` a function of the SavedModel's content, so the same inputs give a
    byte-identical directory.

    TensorFlow's FingerprintDef holds five content hashes (saved_model.pb's checksum, the
    regularized graph, the signatures, the object graph, the checkpoint) and a `uuid`, a random
    128-bit number written as a decimal string at every save, used by nothing that loads the
    model (TF reads the hashes for its metrics and `singleprint()`). The uuid is replaced by a
    128-bit number derived from the five hashes, in the same decimal form.
    """
    import hashlib

    from tensorflow.core.protobuf import fingerprint_pb2

    path = Path(saved_model_dir) / "fingerprint.pb"
    if not path.is_file():
        return
    fp = fingerprint_pb2.FingerprintDef.FromString(path.read_bytes())
    if not fp.uuid:
        return
    content = (fp.saved_model_checksum, fp.graph_def_program_hash, fp.signature_def_hash,
               fp.saved_object_graph_hash, fp.checkpoint_hash, fp.version.producer)
    digest = hashlib.sha256(repr(content).encode()).digest()[:16]
    fp.uuid = str(int.from_bytes(digest, "big"))
    path.write_bytes(fp.SerializeToString(deterministic=True))


def _serving(fast, names):
    def serve(*args):
        return fast(**dict(zip(names, args)))

    return serve
