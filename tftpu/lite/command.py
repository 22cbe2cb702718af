"""The job behind `tftpu-convert`: load the source (SavedModel or Keras file), set the options,
convert, and write the `.tflite` (and the report) atomically."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from tftpu import errors
from tftpu.utils import files


def load_keras(path):
    """A Keras model file (`.keras`, `.h5`), safe mode (no deserialized Python code)."""
    p = Path(path)
    if not p.is_file():
        raise errors.ModelFileError(p, "no such Keras model file")
    import keras

    if p.suffix.lower() == ".keras" and not zipfile.is_zipfile(p):      # (Keras says "File not found")
        raise errors.ModelFileError(p, "not a .keras model (a .keras file is a zip archive)")
    try:
        return keras.models.load_model(str(p), compile=False, safe_mode=True)
    except (ValueError, OSError, TypeError, KeyError) as exc:
        raise errors.ModelFileError(p, f"cannot load the Keras model: {str(exc).strip().splitlines()[0]}") from None


def converter_for(saved_model_dir=None, keras_model_file=None, signature_key=None):
    """A `tftpu.lite.TFLiteConverter` for exactly one of the two sources."""
    from tftpu.lite.converter import TFLiteConverter

    if bool(saved_model_dir) == bool(keras_model_file):
        raise errors.UsageError("give exactly one of --saved_model_dir and --keras_model_file")
    if keras_model_file:
        if signature_key:
            raise errors.UsageError("--signature_key applies to --saved_model_dir only")
        return TFLiteConverter.from_keras_model(load_keras(keras_model_file))
    from tftpu.pipelines.saved_model import load

    loaded = load(saved_model_dir)          # one clear line for a missing or broken SavedModel
    if signature_key and signature_key not in loaded.signatures:
        raise errors.UsageError(f"--signature_key={signature_key}: {saved_model_dir} has signatures "
                                f"{', '.join(sorted(loaded.signatures)) or 'none'}")
    return TFLiteConverter.from_saved_model(str(saved_model_dir), [signature_key] if signature_key else None)


def convert(output_file, *, saved_model_dir=None, keras_model_file=None, signature_key=None, device_specs=None,
            space_to_depth=None, s2d_input=False, s2d_target="tpu", quantize=None, representative_data=None,
            input_num=None, mean=None, scale=None, pixel_format="rgb", skip_unreadable=False,
            calibration_method=None, report=None) -> dict:
    """Convert and write `output_file` (and `report` JSON); returns the report. The
    representative data is streamed (`tftpu.lite.samples.dataset`): its first `input_num` samples
    (None or 0: all), an unreadable file a `ModelFileError` naming it unless `skip_unreadable`."""
    if not output_file:
        raise errors.UsageError("--output_file is required")
    if quantize not in (None, "int8"):
        raise errors.UsageError(f"--quantize={quantize}: only int8 is supported")
    if quantize and not representative_data:
        raise errors.UsageError("--quantize=int8 needs --representative_data=DIR (images, .npz/.npy or TFRecord "
                                "files)")
    if representative_data and not quantize:
        raise errors.UsageError("--representative_data is used with --quantize=int8")
    if skip_unreadable and not representative_data:
        raise errors.UsageError("--skip_unreadable is used with --representative_data")
    if calibration_method and not quantize:
        raise errors.UsageError("--calibration_method is used with --quantize=int8")
    files.check_writable(*[p for p in (output_file, report) if p])
    converter = converter_for(saved_model_dir, keras_model_file, signature_key)
    converter.device_specs = device_specs or None
    converter.space_to_depth = space_to_depth
    converter.s2d_input = s2d_input
    converter.s2d_target = s2d_target
    representative = None
    if quantize:
        import tensorflow as tf

        from tftpu.lite import samples

        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        representative = samples.dataset(converter, representative_data, input_num or None, mean, scale,
                                         pixel_format, skip_unreadable)
        converter.representative_dataset = representative
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.calibration_method = calibration_method or "mse"
    data = run_converter(converter, saved_model_dir or keras_model_file)
    out = converter.report or {}
    if representative is not None:
        out["representative_data"] = {"samples": representative.count, "skipped": list(representative.samples.skipped)}
    files.write_bytes(output_file, data)
    if report:
        files.write_text(report, json.dumps(out, indent=2, default=str) + "\n")
    return out


def run_converter(converter, label) -> bytes:
    """`converter.convert()` with TensorFlow's conversion errors as one ModelFileError line."""
    from tensorflow.lite.python.convert import ConverterError

    try:
        return bytes(converter.convert())
    except ConverterError as exc:
        first = next((ln for ln in str(exc).splitlines() if "error" in ln.lower()), str(exc).splitlines()[0])
        raise errors.ModelFileError(label, f"TensorFlow's converter failed: {first.strip()}") from None


def summary(output_file, report: dict) -> str:
    """A few lines on what tftpu did (printed by tftpu-convert)."""
    lines = [f"{output_file}: written"]
    data = report.get("representative_data")
    if data:
        skipped = data["skipped"]
        more = ", ..." if len(skipped) > 3 else ""
        note = f" ({len(skipped)} unreadable skipped: {', '.join(skipped[:3])}{more})" if skipped else ""
        lines.append(f"representative data: {data['samples']} inputs{note}")
    s2d = report.get("space_to_depth")
    if s2d:
        lines.append(f"space-to-depth: {'applied' if s2d.get('applies') else 'declined'}"
                     f"{': ' + s2d['reason'] if s2d.get('reason') else ''}")
    q = report.get("int8")
    if q:
        lines.append(f"int8: {q['method']} ranges, {q['clipped']} of {q['activations']} activations narrowed "
                     f"from TFLite's min/max")
    tac = report.get("tac")
    if tac:
        lines.append(f"tac: {json.dumps(tac.get('ops_per_device', tac.get('devices', '')), default=str)}")
    if report.get("interpreter"):
        lines.append(f"runtime checks: {report['interpreter']}")
    return "\n".join(lines)
