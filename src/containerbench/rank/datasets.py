"""Training input: synthetic tensors, or ImageNet TFRecords through tf.data.

Real data uses the layout of ImageNet TFRecords as sites keep them (the
tensorflow/models `build_imagenet_data.py` format: `train-00000-of-01024`,
features `image/encoded` JPEG and `image/class/label` 1..1000). `generate`
writes a small set of that shape with random JPEGs, so decoding and
augmentation cost what they cost on ImageNet, only the files are fewer.

    python -m containerbench.rank.datasets generate build/data/imagenet-sample --images 512 --shards 8
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

TRAIN_PATTERN = "train-*-of-*"


def synthetic_batch(tf, batch_size: int, shape: tuple, seed: int):
    """One random batch held in device memory, as Horovod's synthetic benchmark does. Stateless: the same
    values wherever it is made, eagerly or in a graph (a parameter-server worker's dataset, and the
    coordinator's fixed batch its final loss is taken on)."""
    images = tf.random.stateless_uniform((batch_size, *shape), seed=(seed, 0))
    labels = tf.random.stateless_uniform((batch_size,), seed=(seed, 1), maxval=1000, dtype=tf.int64)
    return images, labels


def train_files(data_dir: str) -> list[str]:
    files = sorted(glob.glob(os.path.join(data_dir, TRAIN_PATTERN)))
    if not files:
        raise FileNotFoundError(f"no ImageNet TFRecords ({TRAIN_PATTERN}) in {data_dir!r}; "
                                "make a sample with `python -m containerbench.rank.datasets generate DIR`")
    return files


def _parse_and_augment(tf, record, image_size: int, channels_first: bool):
    """Decode a random crop of the JPEG, resize, flip: the ResNet training preprocessing."""
    features = tf.io.parse_single_example(record, {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64, default_value=-1),
    })
    jpeg = features["image/encoded"]
    box = tf.image.sample_distorted_bounding_box(
        tf.image.extract_jpeg_shape(jpeg), bounding_boxes=tf.zeros((1, 0, 4)), min_object_covered=0.1,
        aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0), max_attempts=10, use_image_if_no_bounding_boxes=True)
    offset_y, offset_x, _ = tf.unstack(box[0])
    height, width, _ = tf.unstack(box[1])
    image = tf.image.decode_and_crop_jpeg(jpeg, tf.stack([offset_y, offset_x, height, width]), channels=3)
    image = tf.image.resize(image, (image_size, image_size))  # float32
    image = tf.image.random_flip_left_right(image)
    image = (image - 127.5) / 127.5
    if channels_first:
        image = tf.transpose(image, (2, 0, 1))
    return image, features["image/class/label"] - 1  # labels are stored 1..1000


def imagenet_pipeline(tf, data_dir: str, batch_size: int, image_size: int, rank: int, ranks: int,
                      channels_first: bool = False, seed: int = 1234):
    """Parallel read, decode, crop and flip, batch, prefetch; each rank reads its own share."""
    files = train_files(data_dir)
    autotune = tf.data.AUTOTUNE
    dataset = tf.data.Dataset.from_tensor_slices(files)
    if len(files) >= ranks:  # whole files per rank when there are enough, else every ranks-th record
        dataset = dataset.shard(ranks, rank)
    dataset = dataset.shuffle(len(files), seed=seed + rank).repeat()
    dataset = dataset.interleave(tf.data.TFRecordDataset, cycle_length=min(len(files), 8),
                                 num_parallel_calls=autotune, deterministic=False)
    if len(files) < ranks:
        dataset = dataset.shard(ranks, rank)
    dataset = dataset.shuffle(1024, seed=seed + rank)
    dataset = dataset.map(lambda record: _parse_and_augment(tf, record, image_size, channels_first),
                          num_parallel_calls=autotune, deterministic=False)
    return dataset.batch(batch_size, drop_remainder=True).prefetch(autotune)


def fixed_batch(tf, data_dir: str, batch_size: int, image_size: int, channels_first: bool = False):
    """The data's first `batch_size` images, read in order from the first file, decoded whole and resized, with no
    random crop or flip: the same batch in every run (the loss at equal images is taken on it, parameterservers)."""
    def decode(record):
        features = tf.io.parse_single_example(record, {
            "image/encoded": tf.io.FixedLenFeature([], tf.string),
            "image/class/label": tf.io.FixedLenFeature([], tf.int64, default_value=-1)})
        image = tf.image.resize(tf.io.decode_jpeg(features["image/encoded"], channels=3), (image_size, image_size))
        image = (image - 127.5) / 127.5
        return tf.transpose(image, (2, 0, 1)) if channels_first else image, features["image/class/label"] - 1

    dataset = tf.data.TFRecordDataset(train_files(data_dir)).map(decode).batch(batch_size, drop_remainder=True)
    return next(iter(dataset))


def generate(out_dir: str, images: int = 512, shards: int = 8, size: int = 256, seed: int = 0) -> list[str]:
    """Write `images` random JPEGs (`size` px, quality 90) with random labels into `shards` TFRecords."""
    import numpy as np
    import tensorflow as tf

    if images < shards:
        raise ValueError(f"--images {images} must be at least --shards {shards}")
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for shard in range(shards):
        path = os.path.join(out_dir, f"train-{shard:05d}-of-{shards:05d}")
        partial = path + ".partial"  # a killed run never leaves a short shard under the real name
        with tf.io.TFRecordWriter(partial) as writer:
            for _ in range(images // shards + (shard < images % shards)):
                # Smooth noise compresses like a photograph (plain noise makes 4x larger JPEGs).
                coarse = rng.integers(0, 256, (size // 8, size // 8, 3), dtype=np.uint8)
                pixels = tf.image.resize(coarse[None], (size, size), method="bilinear")[0]
                jpeg = tf.io.encode_jpeg(tf.cast(pixels, tf.uint8), quality=90).numpy()
                feature = {
                    "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
                    "image/format": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"JPEG"])),
                    "image/class/label": tf.train.Feature(
                        int64_list=tf.train.Int64List(value=[int(rng.integers(1, 1001))])),
                    "image/height": tf.train.Feature(int64_list=tf.train.Int64List(value=[size])),
                    "image/width": tf.train.Feature(int64_list=tf.train.Int64List(value=[size])),
                }
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
        os.replace(partial, path)
        paths.append(path)
    manifest = {"format": "imagenet-tfrecord", "generated_by": "containerbench.rank.datasets", "images": images,
                "jpeg_size": size, "seed": seed,
                "files": {os.path.basename(p): os.path.getsize(p) for p in paths}}
    with open(os.path.join(out_dir, "manifest.json"), "w") as handle:
        json.dump(manifest, handle, indent=1)
    return paths


def parser() -> argparse.ArgumentParser:
    cli = argparse.ArgumentParser(prog="python -m containerbench.rank.datasets", description=__doc__.split("\n\n")[0])
    commands = cli.add_subparsers(dest="command", required=True)
    make = commands.add_parser("generate", help="write a small ImageNet-shaped TFRecord set of random JPEGs")
    make.add_argument("out_dir")
    make.add_argument("--images", type=int, default=512)
    make.add_argument("--shards", type=int, default=8)
    make.add_argument("--size", type=int, default=256, help="JPEG side in pixels (ImageNet averages ~400x350)")
    make.add_argument("--seed", type=int, default=0)
    return cli


def main(argv=None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    for name in ("images", "shards", "size"):
        if getattr(args, name) < 1:
            cli.error(f"--{name} must be positive, got {getattr(args, name)}")
    paths = generate(args.out_dir, args.images, args.shards, args.size, args.seed)
    total = sum(os.path.getsize(p) for p in paths)
    print(f"containerbench: wrote {args.images} JPEGs ({args.size} px) in {len(paths)} TFRecord shards, "
          f"{total / 2**20:.1f} MiB, to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
