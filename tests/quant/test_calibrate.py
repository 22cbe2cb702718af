"""Calibration of real models: one entry per float tensor, deterministic tables, clear errors."""

import numpy as np
import pytest

from tests import material
from tftpu import errors, frontend, models, quant


@pytest.fixture(scope="module")
def resnet():
    return frontend.load(models.resnet18_like((64, 64, 3)))


@pytest.fixture(scope="module")
def photo_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("photos")
    for i, name in enumerate(material.COLOUR_PHOTOS[:4]):
        img = material.image(name, (64, 64)).astype(np.float32) / 127.5 - 1
        np.savez(d / f"{i:02d}.npz", x=img[None])
    return d


def test_tables_cover_every_tensor_and_are_byte_identical(resnet, photo_dir, tmp_path):
    samples = quant.load_samples(resnet, photo_dir)
    assert len(samples) == 4
    dump = frontend_dump(resnet, samples[0])
    for method in quant.METHODS:
        table = quant.calibrate(resnet, samples, method)
        assert list(table.entries) == [k for k, v in dump.items() if v.dtype.kind == "f"]
        for name, (t, lo, hi) in table.entries.items():
            assert lo <= hi and 0 <= t <= max(abs(lo), abs(hi)) + 1e-6, (method, name)
        table.save(tmp_path / f"{method}.txt")
        again = quant.calibrate(resnet, samples, method)
        again.save(tmp_path / f"{method}_again.txt")
        assert (tmp_path / f"{method}.txt").read_bytes() == (tmp_path / f"{method}_again.txt").read_bytes()
        back = quant.read_table(tmp_path / f"{method}.txt")
        assert back.method == method and back.samples == 4 and list(back.entries) == list(table.entries)
        for name in table.entries:
            np.testing.assert_allclose(back.entries[name], table.entries[name], rtol=1e-8)
    relu = next(n for n in table.entries if "relu" in n.lower())
    assert table.entries[relu][1] == 0.0  # a ReLU's min


def frontend_dump(model, sample):
    from tftpu.interp.top_interpreter import run
    return run(model, sample, dump_all=True)


def test_images_are_preprocessed_like_the_npz_inputs(resnet, tmp_path):
    img = material.image("astronaut.png", (64, 64))
    import tensorflow as tf
    (tmp_path / "a.png").write_bytes(tf.io.encode_png(img).numpy())
    (sample,) = quant.load_samples(resnet, tmp_path, mean=[127.5], scale=[1 / 127.5])
    x = sample[resnet.input_names[0]]
    assert x.shape == (1, 64, 64, 3) and x.dtype == np.float32
    np.testing.assert_allclose(x[0], img.astype(np.float32) / 127.5 - 1, atol=1e-6)
    (bgr,) = quant.load_samples(resnet, tmp_path, pixel_format="bgr")
    np.testing.assert_array_equal(bgr[resnet.input_names[0]][0], img[..., ::-1].astype(np.float32))


def test_bad_datasets_and_tables(resnet, tmp_path):
    with pytest.raises(errors.InputError, match="directory"):
        quant.load_samples(resnet, tmp_path / "missing")
    with pytest.raises(errors.InputError, match="no images"):
        quant.load_samples(resnet, tmp_path)
    np.savez(tmp_path / "wrong.npz", x=np.zeros((1, 32, 32, 3), np.float32))
    with pytest.raises(errors.ShapeError, match="wrong.npz"):
        quant.load_samples(resnet, tmp_path)
    (tmp_path / "wrong.npz").unlink()
    (tmp_path / "broken.png").write_bytes(b"\x89PNG not really")
    with pytest.raises(errors.ModelFileError, match="broken.png"):
        quant.load_samples(resnet, tmp_path)
    with pytest.raises(errors.UsageError, match="method"):
        quant.calibrate(resnet, [{}], "entropy")
    bad = tmp_path / "table.txt"
    for text, needle in (
            ("# op_name threshold min max\nconv1 1.0 -1.0\n", r"table.txt:2"),
            ("conv1 nan -1 1\n", "finite"),
            ("conv1 1 -1 1\nconv2 11.5 100 8.25\n", r"table.txt:2: tensor 'conv2': min 100 is above max 8.25"),
            ("conv1 0 -12 8.25\n", r"table.txt:1: tensor 'conv1': threshold 0"),
            ("# alternates: tail_mse\nconv1 1 -1 1\n#tail_mse conv1 1 -1\n", r"table.txt:3"),
            ("# alternates: tail_mse\nconv1 1 -1 1\n#tail_mse conv1 1 -1 1\n#tail_mse conv1 2 -1 1\n",
             r"table.txt:4: tensor 'conv1' listed twice"),
            ("# alternates: tail_mse\nconv1 1 -1 1\n", "no '#tail_mse' rows")):
        bad.write_text(text)
        with pytest.raises(errors.ModelFileError, match=needle):
            quant.read_table(bad)
    bad.write_text("zeros 0 0 0\n")                     # (a tensor that is always 0)
    assert quant.read_table(bad).entries["zeros"] == (0.0, 0.0, 0.0)


def test_alternates_come_from_the_same_statistics_and_read_back(resnet, photo_dir, tmp_path):
    samples = quant.load_samples(resnet, photo_dir)
    table = quant.calibrate(resnet, samples, "mse, tail_mse,minmax", asymmetric=True)
    assert table.method == "mse" and list(table.alternates) == ["tail_mse", "minmax"]
    for method, got in table.tables().items():
        assert got.entries == quant.calibrate(resnet, samples, method, asymmetric=True).entries
        assert not got.alternates and got.asymmetric and got.samples == 4
    assert quant.calibrate_each(resnet, samples, ["mse", "tail_mse", "minmax"]).keys() == table.tables().keys()
    table.save(tmp_path / "t.txt")
    back = quant.read_table(tmp_path / "t.txt")
    assert back.text() == table.text()
    assert {m: t.entries for m, t in back.tables().items()} == {m: t.entries for m, t in table.tables().items()}
    assert quant.CalibrationTable.from_json(table.to_json()).text() == table.text()


def test_samples_on_worker_threads_give_the_same_table_and_name_a_bad_sample(resnet, photo_dir, monkeypatch):
    import importlib
    calibrate_module = importlib.import_module("tftpu.quant.calibrate")
    samples = quant.load_samples(resnet, photo_dir)
    tables = {}
    for n in (1, 3):
        monkeypatch.setattr(calibrate_module, "pool_size", lambda n=n: n)
        tables[n] = quant.calibrate_each(resnet, samples, ["mse", "tail_mse"], asymmetric=True)
    for method in ("mse", "tail_mse"):
        assert tables[1][method].entries == tables[3][method].entries
    bad = [dict(s) for s in samples]
    bad[2] = {k: np.full_like(v, np.nan) for k, v in bad[2].items()}
    with pytest.raises(errors.InputError, match="sample 2: tensor .* non-finite"):
        quant.calibrate(resnet, bad, "mse")
