"""Host input-pipeline throughput with space-to-depth (images/s, 224x224x3, batch 32).

    python benchmarks/s2d_host_pipeline.py [--batches 40] [--rounds 9] [--only memory|jpeg]

Two pipelines, each without S2D, with the naive S2D placements of PEERS.md, with other
placements of the permutation (uint8 S2D per image inside the parallel crop map, then the float
conversion fused after `batch()`), with `tftpu.data.space_to_depth` (its native kernel, the default,
and its XLA fusion), and fused with the device's input layout:
  memory: 256x256 uint8 images in memory -> random crop 224 -> flip -> scale to float -> batch 32
  jpeg:   the same images (real photos) encoded as JPEG in memory -> decode -> crop -> flip ->
          per-channel normalize -> batch 32
The peer is the same pipeline without S2D, measured in the same run (for the variants fused with a
device layout, also the pipeline that produces that layout without S2D); variants are interleaved
over `--rounds` rounds and each reports its median. Ratios are against the fastest S2D-free
baseline (float conversion per image, on the uint8 batch, or on the uint8 batch compiled with
XLA as tftpu does), taken round by round. Both wall-clock images/s and images per CPU-second of this process are
printed: on a shared machine the CPU figure is the stable one.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BATCH, SIZE, SOURCE = 32, 224, 256
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _photos(n):
    """n uint8 256x256x3 crops of the real skimage photos (random images if unavailable)."""
    import numpy as np

    rng = np.random.default_rng(0)
    try:
        from tftpu import datasets as material

        photos = [material.image(name, (512, 512)) for name in material.COLOUR_PHOTOS]
    except Exception as exc:  # offline: still measure, say so
        print(f"(real photos unavailable: {exc}; using random images)")
        return rng.integers(0, 256, (n, SOURCE, SOURCE, 3), dtype=np.uint8)
    out = []
    for i in range(n):
        p = photos[i % len(photos)]
        y, x = rng.integers(0, p.shape[0] - SOURCE), rng.integers(0, p.shape[1] - SOURCE)
        out.append(p[y:y + SOURCE, x:x + SOURCE])
    return np.stack(out)


def _variants(tf, images, jpegs):
    import numpy as np

    import tftpu.data

    A = tf.data.AUTOTUNE
    mean, std = tf.constant(MEAN), tf.constant(STD)

    def crop_flip(x):
        return tf.image.random_flip_left_right(tf.image.random_crop(x, [SIZE, SIZE, 3]))

    def scale(x):
        return tf.cast(x, tf.float32) * (1 / 255)

    def normalize(x):
        return (tf.cast(x, tf.float32) * (1 / 255) - mean) / std

    xla_scale = tf.function(scale, jit_compile=True)
    xla_normalize = tf.function(normalize, jit_compile=True)

    def naive_transpose(x):  # reshape + 5-D transpose + reshape, per image
        x = tf.reshape(x, [SIZE // 2, 2, SIZE // 2, 2, 3])
        return tf.reshape(tf.transpose(x, [0, 2, 1, 3, 4]), [SIZE // 2, SIZE // 2, 12])

    per_image_s2d = lambda x: tf.nn.space_to_depth(x[None], 2)[0]  # noqa: E731
    xla_naive_transpose = tf.function(naive_transpose, jit_compile=True)

    def blocked_convert(scale, offset):
        """XLA float conversion of uint8 S2D batches: per-channel constants tiled over the b*b block."""
        s = tf.constant(np.tile(np.asarray(scale, np.float32), 4))
        o = tf.constant(np.tile(np.asarray(offset, np.float32), 4))
        return tf.function(lambda x: tf.cast(x, tf.float32) * s + o, jit_compile=True)
    batch_s2d = lambda x: tf.nn.space_to_depth(x, 2)  # noqa: E731
    hwcn = lambda x: tf.transpose(x, [1, 2, 3, 0])  # noqa: E731

    mem = lambda: tf.data.Dataset.from_tensor_slices(images).repeat()  # noqa: E731
    jpg = lambda: tf.data.Dataset.from_tensor_slices(jpegs).repeat().map(  # noqa: E731
        lambda s: tf.io.decode_jpeg(s, channels=3), num_parallel_calls=A)

    def per_image(src, convert, *extra):
        def f(x):
            x = convert(crop_flip(x))
            for e in extra:
                x = e(x)
            return x
        return src().map(f, num_parallel_calls=A).batch(BATCH)

    def on_batch(src, fn):
        return src().map(crop_flip, num_parallel_calls=A).batch(BATCH).map(fn, num_parallel_calls=A)

    s2d_scale = dict(dtype=tf.float32, scale=1 / 255)
    s2d_norm = dict(dtype=tf.float32, scale=[1 / (255 * s) for s in STD], offset=[-m / s for m, s in zip(MEAN, STD)])
    u8 = lambda src: src().map(crop_flip, num_parallel_calls=A).batch(BATCH)  # noqa: E731
    scale_blocked = blocked_convert([1 / 255] * 3, [0.0] * 3)
    norm_blocked = blocked_convert(s2d_norm["scale"], s2d_norm["offset"])

    def u8_per_image(src, s2d, convert):  # uint8 S2D in the parallel crop map, float after batch
        return src().map(lambda x: s2d(crop_flip(x)), num_parallel_calls=A).batch(BATCH).map(
            convert, num_parallel_calls=A)

    def tftpu_variants(src, convert):  # the native kernel (the default) and the XLA fusion
        return {
            "tftpu native: S2D + float conversion": tftpu.data.space_to_depth(
                u8(src), 2, implementation="native", **convert),
            "tftpu xla: S2D + float conversion": tftpu.data.space_to_depth(
                u8(src), 2, implementation="xla", **convert),
            "tftpu xla fused: S2D + float conversion + NCHW": tftpu.data.space_to_depth(
                u8(src), 2, layout="NCHW", **convert),
            "tftpu xla fused: S2D + HWCN double transpose": tftpu.data.space_to_depth(
                u8(src), 2, layout="HWCN", **convert),
        }

    def layout_only(src, convert):  # the device layout without S2D: the peer of the fused variants
        return {f"layout only (no S2D), XLA: {name}": on_batch(src, tf.function(
                    lambda x, perm=perm: tf.transpose(convert(x), perm), jit_compile=True))
                for name, perm in (("NCHW", [0, 3, 1, 2]), ("HWCN", [1, 2, 3, 0]))}

    def placements(src, convert):
        return {
            "placement: uint8 transpose per image, float after batch": u8_per_image(src, naive_transpose, convert),
            "placement: uint8 XLA S2D per image, float after batch": u8_per_image(src, xla_naive_transpose, convert),
            "placement: uint8 nn.space_to_depth per image, float after": u8_per_image(src, per_image_s2d, convert),
        }
    return {
        "memory": {
            "baseline: float per image": per_image(mem, scale),
            "baseline: float on uint8 batch": on_batch(mem, scale),
            "baseline: float on uint8 batch, XLA": on_batch(mem, xla_scale),
            "naive: tf.nn.space_to_depth after batch": per_image(mem, scale).map(batch_s2d, num_parallel_calls=A),
            "naive: tf.nn.space_to_depth per image": per_image(mem, scale, per_image_s2d),
            "naive: reshape+transpose+reshape per image": per_image(mem, scale, naive_transpose),
            **placements(mem, scale_blocked),
            "tftpu: S2D of the float batches": tftpu.data.space_to_depth(per_image(mem, scale), 2),
            **tftpu_variants(mem, s2d_scale),
            **layout_only(mem, scale),
            "two-step: S2D then HWCN transpose": per_image(mem, scale).map(
                lambda x: hwcn(batch_s2d(x)), num_parallel_calls=A),
        },
        "jpeg": {
            "baseline: float per image": per_image(jpg, normalize),
            "baseline: float on uint8 batch": on_batch(jpg, normalize),
            "baseline: float on uint8 batch, XLA": on_batch(jpg, xla_normalize),
            "naive: tf.nn.space_to_depth after batch": per_image(jpg, normalize).map(batch_s2d, num_parallel_calls=A),
            "naive: tf.nn.space_to_depth per image": per_image(jpg, normalize, per_image_s2d),
            **placements(jpg, norm_blocked),
            "tftpu: S2D of the float batches": tftpu.data.space_to_depth(per_image(jpg, normalize), 2),
            **tftpu_variants(jpg, s2d_norm),
            **layout_only(jpg, normalize),
        },
    }


def _rate(ds, batches):
    """(images per wall second, images per CPU second of this process)."""
    it = iter(ds.prefetch(2))
    for _ in range(8):
        next(it)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(batches):
        next(it)
    n = batches * BATCH
    return n / (time.perf_counter() - wall), n / (time.process_time() - cpu)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=40, help="timed batches per variant and round")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--images", type=int, default=128, help="distinct source images")
    ap.add_argument("--only", choices=("memory", "jpeg"))
    args = ap.parse_args()
    import tensorflow as tf

    images = _photos(args.images)
    jpegs = [tf.io.encode_jpeg(img, quality=90).numpy() for img in images]
    pipelines = _variants(tf, images, jpegs)
    for name, variants in pipelines.items():
        if args.only and name != args.only:
            continue
        rates = {v: [] for v in variants}
        for _ in range(args.rounds):
            for v, ds in variants.items():
                rates[v].append(_rate(ds, args.batches))
        _print(name, variants, rates, args)


def _print(name, variants, rates, args):
    """Medians, and ratios taken round by round against a peer timed in the same round.

    Each ratio is the median over rounds of (variant / peer) within a round, so the slow drifts
    of a shared machine cancel; the range over rounds follows it.
    """
    wall = {v: statistics.median(r[0] for r in rs) for v, rs in rates.items()}
    cpu = {v: statistics.median(r[1] for r in rs) for v, rs in rates.items()}
    bases = [v for v in variants if v.startswith("baseline")]
    peer = max(bases, key=lambda v: cpu[v])

    def ratio(v, ref, i):
        per_round = sorted(a[i] / b[i] for a, b in zip(rates[v], rates[ref]))
        return statistics.median(per_round), per_round[0], per_round[-1]

    print(f"\n{name} pipeline ({BATCH}x{SIZE}x{SIZE}x3, {args.rounds} rounds x {args.batches} batches; "
          f"ratios against '{peer}', round by round: median [min-max])")
    print(f"  {'variant':58s} {'images/s':>9s} {'wall ratio':>17s} {'img/CPU-s':>10s} {'CPU ratio':>17s}")
    for v in variants:
        (rw, lw, hw), (rc, lc, hc) = ratio(v, peer, 0), ratio(v, peer, 1)
        print(f"  {v:58s} {wall[v]:9.0f} {rw:5.2f}x [{lw:.2f}-{hw:.2f}] {cpu[v]:10.0f} {rc:5.2f}x [{lc:.2f}-{hc:.2f}]")
    for layout, fused in (("NCHW", "tftpu xla fused: S2D + float conversion + NCHW"),
                          ("HWCN", "tftpu xla fused: S2D + HWCN double transpose")):
        (rw, _, _), (rc, _, _) = ratio(fused, f"layout only (no S2D), XLA: {layout}", 0), \
            ratio(fused, f"layout only (no S2D), XLA: {layout}", 1)
        print(f"  fused S2D+{layout} vs the {layout} layout alone: {rw:.2f}x wall, {rc:.2f}x CPU")

if __name__ == "__main__":
    main()
