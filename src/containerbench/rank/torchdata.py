"""The PyTorch side's real data: the very TFRecords TensorFlow's pipeline reads (datasets.py), with the
same work per image, in DataLoader worker processes.

Per image, as `datasets._parse_and_augment`: the JPEG decoded, a random window of 8% to 100% of
its area with an aspect ratio of 3/4 to 4/3 (10 tries, else the whole image: what
`sample_distorted_bounding_box` does without boxes), resized bilinearly to the model's side,
flipped left-right half the time, scaled to [-1, 1]. TensorFlow decodes only the window's
blocks (`decode_and_crop_jpeg`); Pillow decodes the whole JPEG and crops it in the resize.

Each rank reads its own share: whole files when there are at least as many as ranks (TF's
`shard` on the file list), else every ranks-th record; a rank's workers split its share the same
way. Files are shuffled per pass and records through a 1024-record buffer, seeded per rank and
worker, as TF's pipeline is seeded per rank.
"""

from __future__ import annotations

import io
import itertools
import math
import random

from containerbench.rank.datasets import train_files

SHUFFLE_BUFFER = 1024
AREA_RANGE = (0.08, 1.0)
ASPECT_RANGE = (3 / 4, 4 / 3)
CROP_TRIES = 10
FEATURES = {"image/encoded": "byte", "image/class/label": "int"}


def crop_window(rng: random.Random, width: int, height: int) -> tuple[int, int, int, int]:
    """(left, top, width, height) of a random window, as sample_distorted_bounding_box draws it."""
    for _ in range(CROP_TRIES):
        area = width * height * rng.uniform(*AREA_RANGE)
        aspect = rng.uniform(*ASPECT_RANGE)
        w, h = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, width - w), rng.randint(0, height - h), w, h
    return 0, 0, width, height


def augment(jpeg: bytes, image_size: int, rng: random.Random):
    """One training image: HWC float32 in [-1, 1]."""
    import numpy as np
    from PIL import Image

    with Image.open(io.BytesIO(jpeg)) as image:
        image = image.convert("RGB")
        left, top, w, h = crop_window(rng, *image.size)
        image = image.resize((image_size, image_size), Image.BILINEAR, box=(left, top, left + w, top + h))
    if rng.random() < 0.5:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
    return (np.asarray(image, dtype=np.float32) - 127.5) / 127.5


def share(items: list, part: int, parts: int) -> tuple[list, int, int]:
    """(the files of part `part` of `parts`, record offset, record stride): whole files when there
    are enough, else all the files and every parts-th record."""
    if len(items) >= parts:
        return items[part::parts], 0, 1
    return items, part, parts


def records(files: list[str], order_rng: random.Random, offset: int, stride: int):
    """(jpeg, label 0..999) of the files, every `stride`-th from `offset`, pass after pass; the files
    in `order_rng`'s order (the same in every worker of a rank, so that their strides do not overlap)."""
    from tfrecord.reader import tfrecord_loader

    while True:
        order = list(files)
        order_rng.shuffle(order)
        stream = itertools.chain.from_iterable(tfrecord_loader(path, None, FEATURES) for path in order)
        for example in itertools.islice(stream, offset, None, stride):
            yield bytes(example["image/encoded"]), int(example["image/class/label"][0]) - 1  # stored 1..1000


def shuffled(stream, rng: random.Random, size: int = SHUFFLE_BUFFER):
    buffer = list(itertools.islice(stream, size))
    for item in stream:
        index = rng.randrange(len(buffer))
        yield buffer[index]
        buffer[index] = item


def dataset(data_dir: str, image_size: int, rank: int, ranks: int, seed: int):
    """This rank's endless stream of (image, label), split among its DataLoader workers."""
    import numpy as np
    import torch

    files, rank_offset, rank_stride = share(train_files(data_dir), rank, ranks)

    class ImageNetShare(torch.utils.data.IterableDataset):
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            worker, workers = (info.id, info.num_workers) if info else (0, 1)
            mine, offset, stride = share(files, worker, workers)
            rng = random.Random(f"{seed}/{rank}/{worker}")
            stream = records(mine, random.Random(f"{seed}/{rank}"), rank_offset + offset * rank_stride,
                             rank_stride * stride)
            for jpeg, label in shuffled(stream, rng):
                yield torch.from_numpy(augment(jpeg, image_size, rng)), np.int64(label)

    return ImageNetShare()


def loader(data_dir: str, batch_size: int, image_size: int, rank: int, ranks: int, seed: int, workers: int,
           pin_memory: bool):
    """Batches of (images NCHW in channels_last memory, labels): the collated NHWC batch viewed as NCHW."""
    import torch

    batches = torch.utils.data.DataLoader(
        dataset(data_dir, image_size, rank, ranks, seed), batch_size=batch_size, num_workers=workers,
        pin_memory=pin_memory, drop_last=True, persistent_workers=workers > 0,
        prefetch_factor=4 if workers else None)
    for images, labels in batches:
        yield images.permute(0, 3, 1, 2), labels
