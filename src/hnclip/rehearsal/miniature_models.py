"""Tiny models of the real classes, in the real file layouts: what the paper profile's rehearsal
serves in place of Long-CLIP-L, SAM ViT-H and CLIP ViT-L/14-336 (the tests use them too).

- `longclip_layout_state_dict`: a Long-CLIP checkpoint's exact key layout (OpenAI CLIP names plus
  `positional_embedding_res`), at any width and depth (`LONGCLIP_L`: the real one's);
  `hnclip.models.longclip.load_longclip` reads it as it reads `longclip-L.pt`.
- `save_tiny_sam`: a random `SamModel` with its image processor, as the Hub repo holds them
  (config.json, preprocessor_config.json, model.safetensors), loaded by transformers'
  "mask-generation" pipeline.
- `save_tiny_clip`: a random `CLIPModel` with CLIP's own BPE vocabulary (from open_clip) and an
  image processor, as the Hub repo holds them (config, processor and tokenizer files,
  pytorch_model.bin), loaded by `CLIPModel`/`CLIPProcessor.from_pretrained`.

Everything is a pure function of its arguments (seeded), so the files are byte-identical from one
build to the next under the same library versions: the rehearsal pins their sha256.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch

LONGCLIP_VOCAB = 49408    # CLIP's BPE vocabulary: the token embedding has this many rows
LONGCLIP_CONTEXT = 248    # Long-CLIP's text context
# Long-CLIP-L's architecture (ViT-L/14 at 224 px, a 768-wide 12-block text tower), as
# `longclip_layout_state_dict` arguments: the released longclip-L.pt's shapes
LONGCLIP_L = {"width": 1024, "layers": 24, "image": 224, "patch": 14, "embed": 768, "text_width": 768,
              "text_layers": 12}


def _block_tensors(prefix: str, width: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    def randn(*shape, std):
        return torch.randn(*shape, generator=gen) * std

    return {
        f"{prefix}.attn.in_proj_weight": randn(3 * width, width, std=width ** -0.5),
        f"{prefix}.attn.in_proj_bias": randn(3 * width, std=0.02),
        f"{prefix}.attn.out_proj.weight": randn(width, width, std=width ** -0.5),
        f"{prefix}.attn.out_proj.bias": randn(width, std=0.02),
        f"{prefix}.ln_1.weight": 1 + randn(width, std=0.1),
        f"{prefix}.ln_1.bias": randn(width, std=0.02),
        f"{prefix}.mlp.c_fc.weight": randn(4 * width, width, std=width ** -0.5),
        f"{prefix}.mlp.c_fc.bias": randn(4 * width, std=0.02),
        f"{prefix}.mlp.c_proj.weight": randn(width, 4 * width, std=(4 * width) ** -0.5),
        f"{prefix}.mlp.c_proj.bias": randn(width, std=0.02),
        f"{prefix}.ln_2.weight": 1 + randn(width, std=0.1),
        f"{prefix}.ln_2.bias": randn(width, std=0.02),
    }


def longclip_layout_state_dict(*, width: int = 64, layers: int = 2, image: int = 32, patch: int = 8,
                               embed: int = 64, vocab: int = LONGCLIP_VOCAB, context: int = LONGCLIP_CONTEXT,
                               seed: int = 0, with_res: bool = True, text_width: int | None = None,
                               text_layers: int | None = None) -> dict[str, torch.Tensor]:
    """A random state dict with exactly the released Long-CLIP key layout: the image tower `width` wide
    and `layers` deep, the text tower `text_width` wide and `text_layers` deep (default: as the image
    tower; Long-CLIP-L is `LONGCLIP_L`). `with_res=False` leaves out `positional_embedding_res` (a plain
    OpenAI layout)."""
    text_width = width if text_width is None else text_width
    text_layers = layers if text_layers is None else text_layers
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape, std):
        return torch.randn(*shape, generator=gen) * std

    grid = image // patch
    sd = {
        "visual.class_embedding": randn(width, std=width ** -0.5),
        "visual.positional_embedding": randn(grid * grid + 1, width, std=0.1),
        "visual.conv1.weight": randn(width, 3, patch, patch, std=0.1),
        "visual.ln_pre.weight": 1 + randn(width, std=0.1),
        "visual.ln_pre.bias": randn(width, std=0.02),
    }
    for layer in range(layers):
        sd.update(_block_tensors(f"visual.transformer.resblocks.{layer}", width, gen))
    sd.update({
        "visual.ln_post.weight": 1 + randn(width, std=0.1),
        "visual.ln_post.bias": randn(width, std=0.02),
        "visual.proj": randn(width, embed, std=width ** -0.5),
        "token_embedding.weight": randn(vocab, text_width, std=0.1),
        "positional_embedding": randn(context, text_width, std=0.1),
    })
    if with_res:  # deliberately different from positional_embedding, so a wrong merge shows
        sd["positional_embedding_res"] = randn(context, text_width, std=0.1)
    for layer in range(text_layers):
        sd.update(_block_tensors(f"transformer.resblocks.{layer}", text_width, gen))
    sd.update({
        "ln_final.weight": 1 + randn(text_width, std=0.1),
        "ln_final.bias": randn(text_width, std=0.02),
        "text_projection": randn(text_width, embed, std=text_width ** -0.5),
        "logit_scale": torch.tensor(math.log(100.0)),
    })
    return sd


def save_longclip_checkpoint(path: str | Path, **architecture) -> Path:
    """`longclip_layout_state_dict(**architecture)` pickled as the release is (a plain state dict)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(longclip_layout_state_dict(**architecture), path)
    return path


# ---------------------------------------------------------------------------------------------
# SAM
# ---------------------------------------------------------------------------------------------

def save_tiny_sam(path: str | Path, *, image_size: int = 64, hidden: int = 16, seed: int = 0,
                  confident: bool = False) -> Path:
    """A random SamModel (one layer per part, `hidden` wide, `image_size` px input) and its image
    processor in the Hub layout: config.json, preprocessor_config.json, model.safetensors.

    A random SAM predicts low IoUs and unstable masks, so the released quality thresholds (IoU 0.88,
    stability 0.95) would drop every mask. `confident=True` spreads the predicted IoUs around 0.6 and
    scales the mask logits up (stable masks), so that a few percent of the masks pass them and the
    segments path downstream runs; every mask kept costs the pipeline's post-processing time."""
    from transformers import (
        SamConfig,
        SamImageProcessor,
        SamMaskDecoderConfig,
        SamModel,
        SamPromptEncoderConfig,
        SamVisionConfig,
    )
    torch.manual_seed(seed)
    vision = SamVisionConfig(hidden_size=hidden, output_channels=hidden, num_hidden_layers=1, num_attention_heads=1,
                             image_size=image_size, patch_size=16, mlp_dim=2 * hidden, window_size=4,
                             global_attn_indexes=[0], num_pos_feats=hidden // 2)
    prompt = SamPromptEncoderConfig(hidden_size=hidden, image_size=image_size, patch_size=16, mask_input_channels=4)
    decoder = SamMaskDecoderConfig(hidden_size=hidden, num_hidden_layers=1, num_attention_heads=1, mlp_dim=2 * hidden,
                                   iou_head_hidden_dim=hidden)
    model = SamModel(SamConfig(vision_config=vision.to_dict(), prompt_encoder_config=prompt.to_dict(),
                               mask_decoder_config=decoder.to_dict()))
    if confident:
        with torch.no_grad():
            head = model.mask_decoder.iou_prediction_head.proj_out
            head.weight.mul_(1e3)   # predicted IoUs spread around 0.6: a few percent pass 0.88
            head.bias.fill_(0.75)
            for mlp in model.mask_decoder.output_hypernetworks_mlps:
                mlp.proj_out.weight.mul_(1e8)   # logits far from 0: stability ~1
    path = Path(path)
    model.save_pretrained(path)
    side = {"height": image_size, "width": image_size}
    SamImageProcessor(size={"longest_edge": image_size}, pad_size=side).save_pretrained(path)  # preprocessor_config
    return path


# ---------------------------------------------------------------------------------------------
# CLIP (the matcher)
# ---------------------------------------------------------------------------------------------

HF_BOS, HF_EOS = "<|startoftext|>", "<|endoftext|>"
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


def clip_bpe() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """CLIP's BPE vocabulary and merges (open_clip's copy), with the Hub's names for the special
    tokens: what openai/clip-* repos hold in vocab.json and merges.txt."""
    from open_clip.tokenizer import SimpleTokenizer
    simple = SimpleTokenizer()
    vocab = {token: index for token, index in simple.encoder.items() if not token.startswith("<start_of")
             and not token.startswith("<end_of")}
    vocab[HF_BOS], vocab[HF_EOS] = len(vocab), len(vocab) + 1
    merges = [pair for pair, _ in sorted(simple.bpe_ranks.items(), key=lambda item: item[1])]
    return vocab, merges


def save_tiny_clip(path: str | Path, *, image_size: int = 32, patch: int = 8, hidden: int = 16, projection: int = 8,
                   text_context: int = 77, seed: int = 0, vocab: dict[str, int] | None = None,
                   merges: list[tuple[str, str]] | None = None, weights: str = "pytorch_model.bin") -> Path:
    """A random CLIPModel with its processor in the Hub layout of openai/clip-vit-large-patch14-336:
    config.json, preprocessor_config.json, tokenizer.json, tokenizer_config.json, vocab.json, merges.txt,
    special_tokens_map.json and the weights (`weights`: pytorch_model.bin as there, or model.safetensors).
    The tokenizer is CLIP's own BPE unless `vocab`/`merges` are given (tests use a character vocabulary)."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPTokenizer

    if vocab is None:
        vocab, merges = clip_bpe()
    merges = list(merges or [])
    tokenizer = CLIPTokenizer(vocab=vocab, merges=merges, bos_token=HF_BOS, eos_token=HF_EOS, unk_token=HF_EOS,
                              pad_token=HF_EOS, model_max_length=text_context)
    torch.manual_seed(seed)
    text = {"vocab_size": len(vocab), "hidden_size": hidden, "intermediate_size": 2 * hidden, "num_hidden_layers": 1,
            "num_attention_heads": 2, "max_position_embeddings": text_context, "bos_token_id": vocab[HF_BOS],
            "eos_token_id": vocab[HF_EOS], "pad_token_id": vocab[HF_EOS]}
    vision = {"hidden_size": hidden, "intermediate_size": 2 * hidden, "num_hidden_layers": 1, "num_attention_heads": 2,
              "image_size": image_size, "patch_size": patch}
    model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=projection))
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if weights == "pytorch_model.bin":
        model.config.save_pretrained(path)
        torch.save(model.state_dict(), path / weights)
    elif weights == "model.safetensors":
        model.save_pretrained(path)
    else:
        raise ValueError(f"weights must be pytorch_model.bin or model.safetensors, not {weights!r}")
    CLIPImageProcessor(size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size},
                       image_mean=CLIP_MEAN, image_std=CLIP_STD).save_pretrained(path)
    tokenizer.save_pretrained(path)  # tokenizer.json, tokenizer_config.json
    # the slow tokenizer's files, which the Hub repo holds too
    (path / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (path / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")
    special = {"bos_token": HF_BOS, "eos_token": HF_EOS, "unk_token": HF_EOS, "pad_token": HF_EOS}
    (path / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n", encoding="utf-8")
    return path
