"""The matcher loads the CLIP ViT-L/14-336 folder as `hnclip download clip_vit_l14_336` leaves it:
exactly the files the source table pins, weights in `pytorch_model.bin` (the repo has no
model.safetensors) in the 2022 layout (legacy pickle, with the position_ids buffers), and the
2022-style tokenizer and preprocessor files. A tiny random CLIPModel stands in for the 1.7 GB weights."""
from __future__ import annotations

import json
import shutil
import string

import numpy as np
import pytest
import torch
from PIL import Image

from hnclip.auxiliary.lism import hf_clip_encoders
from hnclip.data.sources import get_source
from hnclip.data.verified_files import verify_existing

pytestmark = pytest.mark.usefixtures("one_thread")


def _added(content: str) -> dict:
    return {"content": content, "single_word": False, "lstrip": False, "rstrip": False, "normalized": True,
            "__type": "AddedToken"}


@pytest.fixture(scope="module")
def clip_folder(tmp_path_factory):
    """(folder laid out like openai/clip-vit-large-patch14-336 at its pinned commit, the model it holds)."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPTokenizer
    torch.manual_seed(0)
    folder, scratch = tmp_path_factory.mktemp("clip_vit_l14_336") / "raw", tmp_path_factory.mktemp("scratch")
    folder.mkdir()
    chars = string.ascii_lowercase
    vocab = {c: i for i, c in enumerate(chars)} | {c + "</w>": i + len(chars) for i, c in enumerate(chars)}
    vocab |= {"<|startoftext|>": len(vocab), "<|endoftext|>": len(vocab) + 1}
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    CLIPTokenizer(vocab=vocab, merges=[]).save_pretrained(scratch)
    shutil.copy(scratch / "tokenizer.json", folder)
    end, start = _added("<|endoftext|>"), _added("<|startoftext|>")
    (folder / "tokenizer_config.json").write_text(json.dumps({  # as written in 2022
        "unk_token": end, "bos_token": start, "eos_token": end, "pad_token": "<|endoftext|>", "add_prefix_space": False,
        "errors": "replace", "do_lower_case": True, "name_or_path": "openai/clip-vit-base-patch32",
        "model_max_length": 77, "tokenizer_class": "CLIPTokenizer"}))
    (folder / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": start, "eos_token": end, "unk_token": end, "pad_token": "<|endoftext|>"}))
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(folder)
    text = {"vocab_size": len(vocab), "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
            "num_attention_heads": 2, "max_position_embeddings": 20, "bos_token_id": vocab["<|startoftext|>"],
            "eos_token_id": vocab["<|endoftext|>"], "pad_token_id": vocab["<|endoftext|>"]}
    vision = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "image_size": 32, "patch_size": 8}
    config = CLIPConfig(text_config=text, vision_config=vision, projection_dim=8)
    config.save_pretrained(folder)
    model = CLIPModel(config).eval()
    weights = dict(model.state_dict())
    weights["text_model.embeddings.position_ids"] = torch.arange(20)[None]  # buffers the 2022 file carries
    weights["vision_model.embeddings.position_ids"] = torch.arange(17)[None]
    torch.save(weights, folder / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    for path in list(folder.iterdir()):
        assert verify_existing(path, None)  # the .complete markers a download leaves next to each file
    return folder, model


def test_the_folder_holds_exactly_the_pinned_files(clip_folder):
    folder, _ = clip_folder
    files = {path.name for path in folder.iterdir() if not path.name.endswith(".complete")}
    assert files == {source_file.name for source_file in get_source("clip_vit_l14_336").files}


def test_the_matcher_loads_the_weights_from_pytorch_model_bin(clip_folder):
    from transformers import CLIPProcessor
    folder, model = clip_folder
    encoders = hf_clip_encoders(folder, batch_size=2)
    images = [Image.new("RGB", (40, 30), (200, 30, 30)), Image.new("RGB", (32, 32), (20, 90, 200))]
    texts = ["a red square", "blue"]
    processor = CLIPProcessor.from_pretrained(folder)
    with torch.no_grad():
        reference = model(**processor(text=texts, images=images, return_tensors="pt", padding=True))
    assert np.allclose(encoders.encode_images(images), reference.image_embeds.numpy(), atol=1e-5)
    assert np.allclose(encoders.encode_texts(texts), reference.text_embeds.numpy(), atol=1e-5)
    assert encoders.count_tokens("ab c") == 5 and encoders.context_length == 20
