"""The image cache (execution.image_cache): a split's images decoded once as uint8 pixels at the model's
input size; normalized where they are used, they are exactly the tensors the decode path gives."""
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from hnclip.data.feeding import image_batches
from hnclip.data.image_cache import CachedPixels, PixelTransform, array_path, record_path, write_image_cache
from hnclip.data.loader import PairDataset
from hnclip.data.manifest import ManifestRow, write_manifest
from hnclip.errors import StaleArtifactError
from hnclip.io import read_json
from hnclip.models.factory import create
from hnclip.training.methods import Method


@pytest.fixture(scope="module")
def backbone():
    return create("hnclip-tiny")


@pytest.fixture
def odd_images(tmp_path):
    """Images the transform must resize and crop: other sizes, aspect ratios and modes than its input."""
    gen = np.random.default_rng(0)
    rows = []
    for k, (size, mode, ext) in enumerate([((97, 71), "RGB", "png"), ((150, 100), "L", "jpg"),
                                          ((40, 90), "RGBA", "png"), ((64, 64), "RGB", "jpg")]):
        channels = {"RGB": 3, "L": 1, "RGBA": 4}[mode]
        pixels = gen.integers(0, 256, (size[1], size[0], channels), dtype=np.uint8).squeeze()
        Image.fromarray(pixels, mode).save(tmp_path / f"img{k}.{ext}")
        rows.append(ManifestRow(f"id{k}", f"img{k}.{ext}", f"caption {k}", None, "test", "0" * 64))
    manifest = tmp_path / "test.jsonl"
    write_manifest(manifest, rows)
    return manifest


def test_cached_pixels_normalize_to_exactly_the_decode_paths_tensors(backbone, odd_images, tiny_data, tmp_path):
    transform = PixelTransform.from_preprocess(backbone.preprocess)
    shutil.copytree(tiny_data["test"].parent, tmp_path / "docci")  # the session's data stays read-only
    for manifest in (odd_images, tmp_path / "docci" / tiny_data["test"].name):
        write_image_cache(manifest, transform)
        decoded = PairDataset.from_manifest(manifest, backbone.preprocess, backbone.tokenizer)
        cached = PairDataset.from_manifest(manifest, backbone.preprocess, backbone.tokenizer, image_cache=True)
        indices = list(range(len(decoded)))
        assert all(torch.equal(cached.image(i), decoded.image(i)) for i in indices)  # bit for bit
        pixels, tokens = cached.pixel_batch(indices[::-1])
        assert pixels.dtype == torch.uint8 and torch.equal(tokens, decoded.tokens[indices[::-1]])
        assert torch.equal(cached.normalize(pixels), decoded.batch(indices[::-1])[0])
        assert all(torch.equal(a, b) for a, b in zip(image_batches(cached, 3), image_batches(decoded, 3), strict=True))
        read_ahead = list(image_batches(cached, 3, workers=2))   # by two threads, in order
        assert len(read_ahead) == -(-len(indices) // 3) >= 2
        assert all(torch.equal(a, b) for a, b in zip(read_ahead, image_batches(decoded, 3), strict=True))
        assert cached.decodes == 0 and decoded.decodes == len(indices)  # each image decoded once, then the LRU
        # on an accelerator a micro-batch travels as uint8 and is normalized there (`Method.to_device`)
        method = Method("full", cached.pixel_batch, None, normalize=cached.normalize)
        images, tokens = method.to_device(method.load([2, 0]), torch.device("cpu"))
        assert torch.equal(images, decoded.batch([2, 0])[0]) and torch.equal(tokens, decoded.tokens[[2, 0]])
    record = read_json(record_path(odd_images))
    assert record["shape"] == [4, 3, 64, 64] and record["ids"] == ["id0", "id1", "id2", "id3"]
    assert np.load(array_path(odd_images), mmap_mode="r").dtype == np.uint8


def test_the_lookup_table_for_accelerators_is_torchvisions_arithmetic_for_every_value(backbone):
    transform = PixelTransform.from_preprocess(backbone.preprocess)
    every = torch.arange(256, dtype=torch.uint8).repeat(2, 3, 1).view(2, 3, 16, 16)
    expected = torch.stack([backbone.preprocess.transforms[-1](image.to(torch.float32).div(255)) for image in every])
    assert torch.equal(transform.lookup(every), expected) and torch.equal(transform.arithmetic(every), expected)


def test_a_cache_of_another_manifest_or_transform_is_refused(backbone, odd_images):
    transform = PixelTransform.from_preprocess(backbone.preprocess)
    with pytest.raises(StaleArtifactError, match="no image cache.*hnclip image-cache --dataset"):
        CachedPixels(odd_images, ["id0", "id1", "id2", "id3"], transform)
    write_image_cache(odd_images, transform)
    with pytest.raises(StaleArtifactError, match="another manifest"):
        CachedPixels(odd_images, ["id0", "id1", "id2"], transform)
    other = PixelTransform(transform.pil_steps, transform.mean, (0.5, 0.5, 0.5))
    with pytest.raises(StaleArtifactError, match="another transform"):
        CachedPixels(odd_images, ["id0", "id1", "id2", "id3"], other)
