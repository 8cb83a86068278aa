#!/usr/bin/env python3
"""The vision-language benchmark's model, images and HF baseline (GPU machine: torch, transformers, Pillow).

    vl_bench.py make DIR            a Qwen2.5-VL-7B-shaped model with random weights, saved as transformers
                                    writes it (float16 safetensors, config.json), the released processor
                                    settings (preprocessor_config.json), test images at 480p/720p/1080p/1440p
                                    (DIR/images/RES.png) and DIR/prompts.json: per image the prompt as
                                    `shardwise run --tokens` takes it (one image token) and as HF takes it
                                    (the image token repeated once per merged patch).
    vl_bench.py images DIR          the test images and prompts.json alone (for GGUF files made elsewhere).
    vl_bench.py make-vision DIR     the same as make with the vision tower alone in the safetensors (what `shardwise
                                    vision` reads): seconds instead of minutes, for encoder-only runs.
    vl_bench.py hf DIR OUT.json     HF transformers on the GPU, whole model and encoder on the device, its
                                    default attention: per image, the vision tower alone and encode + prefill
                                    + 64 greedy tokens (min_new_tokens 64), best of REPEATS (env, default 2),
                                    and torch.cuda.max_memory_allocated; an out-of-memory is recorded as such.

The model has no tokenizer (the GPU machine reaches no hub): prompts are token ids. Weights are N(0, 0.02)
(embeddings and matrices) so activations stay finite; the output text means nothing, the work is a 7B's.
"""
import json
import math
import os
import sys
import time

RES = {"480p": (854, 480), "720p": (1280, 720), "1080p": (1920, 1080), "1440p": (2560, 1440)}
PATCH, MERGE = 14, 2
MIN_PIXELS, MAX_PIXELS = 3136, 12845056  # the released Qwen2.5-VL processor's
VISION_START, VISION_END, IMAGE_TOKEN = 151652, 151653, 151655
TEXT = dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
            num_attention_heads=28, num_key_value_heads=4, hidden_act="silu", max_position_embeddings=128000,
            rms_norm_eps=1e-6, use_sliding_window=False, max_window_layers=28, attention_dropout=0.0,
            initializer_range=0.02)
MROPE_SECTION, ROPE_THETA = [16, 24, 24], 1000000.0
VISION = dict(depth=32, hidden_size=1280, hidden_act="silu", intermediate_size=3420, num_heads=16, in_channels=3,
              patch_size=PATCH, spatial_merge_size=MERGE, temporal_patch_size=2, tokens_per_second=2,
              window_size=112, out_hidden_size=3584, fullatt_block_indexes=[7, 15, 23, 31])
PREFIX = [151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198, 151644, 872, 198]  # chat-like ids
SUFFIX = [74785, 419, 2168, 13, 151645, 198, 151644, 77091, 198]


def smart_resize(height, width, factor=PATCH * MERGE):
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > MAX_PIXELS:
        beta = math.sqrt(height * width / MAX_PIXELS)
        h_bar, w_bar = math.floor(height / beta / factor) * factor, math.floor(width / beta / factor) * factor
    elif h_bar * w_bar < MIN_PIXELS:
        beta = math.sqrt(MIN_PIXELS / (height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def make_image(path, width, height):
    import numpy as np
    from PIL import Image
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    u, v = x / (width - 1), y / (height - 1)
    img = np.stack([40 + 170 * u, 200 - 150 * v, 128 + 90 * np.sin(6.28 * (0.7 * u - 1.3 * v))], -1)
    img += np.random.default_rng(width).normal(0, 6, img.shape)
    Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(path)


def make(d, tower_only=False):
    import torch
    import transformers
    from transformers import Qwen2_5_VLForConditionalGeneration
    os.makedirs(f"{d}/images", exist_ok=True)
    # The fixture maker's config builder (it follows the config layout of the installed transformers), with
    # the 7B's sizes in place of the tiny model's.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures"))
    import make_vl_fixtures as fx
    fx.TEXT, fx.VISION, fx.MROPE_SECTION, fx.ROPE_THETA = TEXT, VISION, MROPE_SECTION, ROPE_THETA
    fx.IMAGE_TOKEN, fx.VIDEO_TOKEN, fx.VISION_START, fx.VISION_END = IMAGE_TOKEN, 151656, VISION_START, VISION_END
    cfg = fx.build_config(transformers, {})
    torch.manual_seed(1)
    t0 = time.time()
    torch.set_default_dtype(torch.float16)
    with torch.device("cuda"):
        if tower_only:
            from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel
            model = Qwen2_5_VisionTransformerPretrainedModel._from_config(cfg.vision_config)
        else:
            model = Qwen2_5_VLForConditionalGeneration._from_config(cfg)
    torch.set_default_dtype(torch.float32)
    model = model.half()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.02)
            elif "norm" in name or "ln_q" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
    if tower_only:
        from safetensors.torch import save_file
        save_file({"visual." + k: v.contiguous() for k, v in model.state_dict().items()}, f"{d}/model.safetensors",
                  metadata={"format": "pt"})
        cfg.to_json_file(f"{d}/config.json")
    else:
        try:
            model.save_pretrained(d, safe_serialization=True, max_shard_size="5GB")
        except TypeError:  # transformers 5 always writes safetensors
            model.save_pretrained(d, max_shard_size="5GB")
    print(f"made and saved the model in {time.time() - t0:.1f} s "
          f"({sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters)")
    json.dump({"image_processor_type": "Qwen2VLImageProcessor", "do_resize": True, "do_rescale": True,
               "do_normalize": True, "do_convert_rgb": True, "resample": 3, "rescale_factor": 1 / 255,
               "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
               "min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS, "patch_size": PATCH, "temporal_patch_size": 2,
               "merge_size": MERGE}, open(f"{d}/preprocessor_config.json", "w"), indent=1)
    images(d)


def images(d):
    """The test images and DIR/prompts.json (no model)."""
    os.makedirs(f"{d}/images", exist_ok=True)
    prompts = {}
    for res, (w, h) in RES.items():
        make_image(f"{d}/images/{res}.png", w, h)
        rh, rw = smart_resize(h, w)
        tokens = (rh // PATCH) * (rw // PATCH) // (MERGE * MERGE)
        head = PREFIX + [VISION_START]
        tail = [VISION_END] + SUFFIX
        prompts[res] = {"width": w, "height": h, "resized": [rw, rh], "image_tokens": tokens,
                        "patches": tokens * MERGE * MERGE, "shardwise": head + [IMAGE_TOKEN] + tail,
                        "hf": head + [IMAGE_TOKEN] * tokens + tail}
    json.dump(prompts, open(f"{d}/prompts.json", "w"))


def hf(d, out):
    import torch
    from PIL import Image
    from transformers import Qwen2_5_VLForConditionalGeneration
    import transformers
    reps = int(os.environ.get("REPEATS", "2"))
    prompts = json.load(open(f"{d}/prompts.json"))
    cls = getattr(transformers, "Qwen2VLImageProcessorPil", None) or transformers.Qwen2VLImageProcessor
    kw = dict(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS, patch_size=PATCH, temporal_patch_size=2, merge_size=MERGE)
    try:
        proc = cls(size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}, **kw)
    except (TypeError, ValueError):
        proc = cls(**kw)
    t0 = time.time()
    try:
        model = Qwen2_5_VLForConditionalGeneration.from_pretrained(d, dtype=torch.float16, device_map="cuda")
    except TypeError:
        model = Qwen2_5_VLForConditionalGeneration.from_pretrained(d, torch_dtype=torch.float16, device_map="cuda")
    model.eval()
    visual = model.visual if hasattr(model, "visual") else model.model.visual
    results = {"load_s": time.time() - t0, "attn_implementation": model.config._attn_implementation,
               "weights_bytes": torch.cuda.memory_allocated(), "images": {}}
    for res, p in prompts.items():
        r = {"patches": p["patches"], "image_tokens": p["image_tokens"]}
        try:
            px = proc(images=[Image.open(f"{d}/images/{res}.png").convert("RGB")], return_tensors="pt")
            pv, grid = px["pixel_values"].to("cuda", torch.float16), px["image_grid_thw"].to("cuda")
            ids = torch.tensor([p["hf"]], device="cuda")
            enc, e2e = [], []
            torch.cuda.reset_peak_memory_stats()
            for _ in range(reps):
                with torch.no_grad():
                    torch.cuda.synchronize()
                    t = time.time()
                    visual(pv, grid_thw=grid)
                    torch.cuda.synchronize()
                    enc.append(time.time() - t)
                    t = time.time()
                    gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=pv,
                                         image_grid_thw=grid, max_new_tokens=64, min_new_tokens=64, do_sample=False)
                    torch.cuda.synchronize()
                    e2e.append(time.time() - t)
            r.update(encode_s=enc, e2e_s=e2e, generated=int(gen.shape[1] - ids.shape[1]),
                     peak_bytes=torch.cuda.max_memory_allocated())
        except torch.cuda.OutOfMemoryError as e:
            r.update(oom=str(e).splitlines()[0], peak_bytes=torch.cuda.max_memory_allocated())
            torch.cuda.empty_cache()
        print(res, json.dumps(r))
        results["images"][res] = r
    json.dump(results, open(out, "w"), indent=1)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] in ("make", "make-vision"):
        make(sys.argv[2], tower_only=sys.argv[1] == "make-vision")
    elif len(sys.argv) >= 3 and sys.argv[1] == "images":
        images(sys.argv[2])
    elif len(sys.argv) >= 4 and sys.argv[1] == "hf":
        hf(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
