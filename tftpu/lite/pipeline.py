"""What `TFLiteConverter.convert()` does once a tftpu option is set: S2D source rewrite ->
TensorFlow's conversion (tftpu's INT8 ranges in its quantizer) -> S2D metadata -> TAC."""

from __future__ import annotations

import contextlib

from tftpu import errors
from tftpu.lite import runtime, s2d
from tftpu.lite import options


def _check_quantization(converter) -> None:
    if converter.calibration_method is None:
        return
    import tensorflow as tf

    if not set(converter.optimizations or ()) & {tf.lite.Optimize.DEFAULT, tf.lite.Optimize.OPTIMIZE_FOR_SIZE,
                                                 tf.lite.Optimize.OPTIMIZE_FOR_LATENCY}:
        raise errors.UsageError("calibration_method needs optimizations=[tf.lite.Optimize.DEFAULT] "
                                "(post-training INT8 quantization)")


def convert(converter, factory) -> tuple[bytes, dict]:
    """(the `.tflite` bytes, the report) for a converter with tftpu options set; `factory` is
    `tftpu.lite.TFLiteConverter` (for a rebuilt source)."""
    options.check_options(converter)
    _check_quantization(converter)
    report: dict = {"interpreter": runtime.name()}
    meta = None
    with contextlib.ExitStack() as stack:
        target = converter
        if not (converter.space_to_depth is None or converter.space_to_depth is False):
            target, report["space_to_depth"], meta = _space_to_depth(factory, converter, stack)
        target._tftpu_ranges = None
        data = bytes(target._tf_convert())
        if converter.calibration_method is not None:
            ranges = getattr(target, "_tftpu_ranges", None)
            if ranges is None:
                raise errors.UsageError("calibration_method: TensorFlow did not run INT8 calibration for this "
                                        "conversion (set optimizations and representative_dataset)")
            report["int8"] = ranges
    if meta is not None or converter.device_specs:
        from tftpu.tac import export, tflite_io

        if meta is not None:
            model = tflite_io.read(data)
            export.set_metadata(model, s2d.METADATA_NAME, meta)
            data = tflite_io.write(model)
        if converter.device_specs:
            from tftpu import tac

            result = tac.run(data, device_specs=converter.device_specs)
            data = result.tflite()
            report["tac"] = result.report
    return data, report


def _space_to_depth(factory, converter, stack):
    block, forced = (2, False) if converter.space_to_depth is True else (int(converter.space_to_depth), True)
    kind = converter._tftpu_source[0]
    if kind == "jax":
        raise errors.UsageError("space_to_depth works on Keras models, SavedModels and concrete functions, "
                                "not on a JAX source (convert it to a SavedModel first)")
    keep = {"calibration_method": converter.calibration_method}
    if kind != "keras":
        if converter.s2d_input:
            raise errors.UsageError("s2d_input=True works for Keras models; SavedModels and concrete functions "
                                    "keep their image input (S2D runs at the start of the graph)")
        source, info = s2d.graph_source(converter, block, forced, stack)
        return rebuild(factory, converter, source, **keep), info, None
    model = converter._tftpu_source[1]
    info = s2d.estimate(model, block, converter.s2d_target)
    if forced and not info["applies"] and "stride" in info["reason"]:
        raise errors.ShapeError(f"space_to_depth={block}: {info['reason']}")
    if not (info["applies"] or forced):
        return converter, info, None
    info["applies"] = True
    info["forced"] = forced
    source, meta = s2d.keras_source(model, block, bool(converter.s2d_input))
    new = rebuild(factory, converter, ("keras", source), **keep)
    if meta is not None and converter.representative_dataset is not None:
        dataset = converter.representative_dataset
        gen = dataset.input_gen if hasattr(dataset, "input_gen") else dataset
        new.representative_dataset = s2d.host_dataset(gen, block)
    info["input"] = "s2d" if meta is not None else "image (SPACE_TO_DEPTH op in the model)"
    return new, info, meta


def rebuild(factory, converter, source, **tftpu_options):
    """A tftpu converter for another `source` with `converter`'s settings and the given options."""
    kind = source[0]
    if kind == "keras":
        new = factory.from_keras_model(source[1])
    elif kind == "saved_model":
        new = factory.from_saved_model(*source[1:])
    else:
        new = factory.from_concrete_functions(*source[1:])
    for k, v in options.settings(converter).items():
        setattr(new, k, v)
    for k, v in tftpu_options.items():
        setattr(new, k, v)
    return new
