#!/usr/bin/python3
"""tests/fuzz/fuzz_inputs.py — mutation fuzzing of every file a user hands the `shardwise` CLI.

Takes the repo's fixtures (GGUF files, HF directories, tokenizer.json, a saved plan table, a profile,
an experiment YAML, JPEG and PNG images, an image processor's config), mutates copies of them (byte flips, extreme integers in binary headers, edits of
JSON / YAML values) and runs the CLI verb that reads each. The contract (the project's standards):
bad input exits 1 with one error line; never a crash (signal, sanitizer report), a hang or another exit
code. Build the CLI with `-DSHARDWISE_SANITIZE=address` (or any build) and run

    /usr/bin/python3 tests/fuzz/fuzz_inputs.py --cli BUILD/cli/shardwise --cases 300 --out /tmp/fuzz

CTest runs one bounded smoke run per kind (tests `cli_fuzz_<kind>`; under the ASan build too).

Besides random edits, each kind gets the structures that once crashed, hung or answered wrong: JSON
nested tens of thousands deep (a tokenizer.json Sequence, any plan or profile field), a GGUF tensor or
metadata count one off, plan tables with overlapping regions or actions removed, YAML with duplicate
keys, aliases, keys that are lists and deep nesting, experiments whose lists multiply past the limit.
--seconds bounds a run's time (CTest gives each kind a few seconds, under both builds).

Every violating input is kept under --out with the command that showed it (`repro.sh`). Exit status 1
when any case violated the contract. Deterministic for a given --seed (and --cases, when --seconds
does not cut the run short).
"""
import argparse
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIX = os.path.join(REPO, "tests", "fixtures")
EXTREME_U64 = [0, 1, 2, 3, 7, 0xFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 1 << 32, 1 << 40,
               (1 << 62), (1 << 63) - 1, 1 << 63, (1 << 64) - 1]


def flip_bytes(data, rng, region=None, k=None):
    b = bytearray(data)
    lo, hi = region or (0, len(b))
    hi = min(hi, len(b))
    for _ in range(k or rng.randint(1, 8)):
        i = rng.randrange(lo, hi)
        r = rng.random()
        if r < 0.4:
            b[i] ^= 1 << rng.randrange(8)
        elif r < 0.7:
            b[i] = rng.randrange(256)
        else:
            b[i] = rng.choice([0, 0xFF, 0x7F, 0x80])
    return bytes(b)


def extreme_word(data, rng, region):
    """Overwrite an aligned-or-not 4- or 8-byte little-endian integer with an extreme value."""
    b = bytearray(data)
    lo, hi = region
    w = rng.choice([4, 8])
    i = rng.randrange(lo, max(lo + 1, min(hi, len(b)) - w))
    v = rng.choice(EXTREME_U64) & ((1 << (8 * w)) - 1)
    b[i:i + w] = v.to_bytes(w, "little")
    return bytes(b)


def truncate(data, rng):
    return data[:rng.randrange(len(data))]


DEPTHS = [65, 2000, 100000]  # past the tokenizer's 64, yaml-cpp's 2000 guard, and a stack's worth


def nest_text(value_text, depth, rng):
    """value_text wrapped `depth` deep in arrays or objects, as text (json.dumps would recurse)."""
    if rng.random() < 0.5:
        return "[" * depth + value_text + "]" * depth
    return '{"k": ' * depth + value_text + "}" * depth


def deepen_json(obj, rng):
    """The document as text with one value (any path) replaced by a deep nest of itself."""
    paths = [p for p, _ in json_paths(obj)][1:] or [()]
    path = rng.choice(paths)
    marker = "@@deep@@"
    old = obj
    for k in path:
        old = old[k]
    inner = json.dumps(old)
    text = json.dumps(set_path(obj, path, marker))
    return text.replace(json.dumps(marker), nest_text(inner, rng.choice(DEPTHS), rng), 1)


def count_off_by_one(data, rng):
    """A GGUF's tensor count (bytes 8..16) or metadata count (16..24) one more or one less."""
    b = bytearray(data)
    at = rng.choice([8, 16])
    n = struct.unpack_from("<Q", b, at)[0]
    struct.pack_into("<Q", b, at, max(0, n + rng.choice([-1, 1])))
    return bytes(b)


def nested_tokenizer(obj, rng):
    """A normalizer, pre-tokenizer, decoder or post-processor Sequence nested deep, or a type of
    another JSON type (the readers once recursed copying each level, and skipped wrong types)."""
    field, key, leaf = rng.choice([("normalizer", "normalizers", '{"type": "NFC"}'),
                                   ("pre_tokenizer", "pretokenizers", '{"type": "Digits"}'),
                                   ("decoder", "decoders", '{"type": "Fuse"}'),
                                   ("post_processor", "processors", '{"type": "ByteLevel"}')])
    if rng.random() < 0.3:
        obj[field] = {"type": rng.choice([5, None, [], {}, True])}
        return json.dumps(obj)
    depth = rng.choice([1, 64] + DEPTHS)
    marker = "@@seq@@"
    obj[field] = marker
    return json.dumps(obj).replace(json.dumps(marker), '{"type": "Sequence", "%s": [' % key * depth + leaf + "]}" * depth, 1)


def hostile_plan(obj, rng):
    """A plan table whose arena regions overlap, or whose actions of one kind are gone (ids renumbered)."""
    for tier in obj.get("tiers", []):
        for c in tier.get("candidates", []):
            if rng.random() < 0.5:
                for r in c.get("arena", []):
                    r["offset"] = 0
                continue
            kind = rng.choice(["compute", "copy_weights", "copy_activations", "copy_logits"])
            kept = [a for a in c.get("actions", []) if a.get("kind") != kind]
            ids = {a["id"]: i for i, a in enumerate(kept)}
            for a in kept:
                a["deps"] = [ids[d] for d in a.get("deps", []) if d in ids]
                a["id"] = ids[a["id"]]
            c["actions"] = kept
    return json.dumps(obj)


def hostile_yaml(text, rng):
    """A key given twice, an alias, a key that is a list, or a value nested deep."""
    lines = text.split("\n")
    keyed = [i for i, l in enumerate(lines) if ":" in l and not l.lstrip().startswith(("#", "-"))] or [0]
    i = rng.choice(keyed)
    r = rng.random()
    if r < 0.3:
        lines.insert(i + 1, lines[i])
    elif r < 0.5:
        lines[i] = lines[i].split(":")[0] + ": &anchor " + (lines[i].partition(":")[2].strip() or "x")
        lines.append("alias_user: *anchor")
    elif r < 0.7:
        lines.insert(i, "[a, b]: 1")
    else:
        d = rng.choice(DEPTHS)
        lines[i] = lines[i].split(":")[0] + ": " + "[" * d + "1" + "]" * d
    return "\n".join(lines)


def multiplied_lists(text, rng):
    """An experiment whose ctx, threads and budgets lists multiply to far more configurations."""
    out = []
    for line in text.split("\n"):
        if line.startswith("ctx:"):
            line = "ctx: [" + ", ".join(str(64 * (i + 1)) for i in range(60)) + "]"
        elif line.startswith("threads:"):
            line = "threads: [" + ", ".join(str(i + 1) for i in range(60)) + "]"
        elif line.startswith("budgets:"):
            line = "budgets: [" + ", ".join("%dM" % (i + 2) for i in range(60)) + "]"
        out.append(line)
    return "\n".join(out)


def gguf_header_end(data):
    """Bytes of the GGUF header, metadata and tensor infos (where parsing decisions live): the
    offset of the first tensor's data is at least this; a rough bound is fine for fuzzing."""
    return min(len(data), 64 * 1024)


def mutate_gguf(data, rng):
    r = rng.random()
    head = gguf_header_end(data)
    if r < 0.1:
        return count_off_by_one(data, rng)
    if r < 0.45:
        return flip_bytes(data, rng, (0, head))
    if r < 0.8:
        return extreme_word(data, rng, (0, head))
    if r < 0.9:
        return truncate(data, rng)
    return flip_bytes(data, rng)  # anywhere, tensor data included


def rand_json_value(rng, depth=0):
    choices = [lambda: None, lambda: True, lambda: -1, lambda: 0, lambda: 1, lambda: 3, lambda: 2 ** 31,
               lambda: 2 ** 53, lambda: -2 ** 63, lambda: 1e308, lambda: -1.5, lambda: 0.5, lambda: "",
               lambda: "x" * rng.randint(1, 40), lambda: "F16", lambda: "Q4_0", lambda: [], lambda: {}]
    if depth < 2:
        choices += [lambda: [rand_json_value(rng, depth + 1) for _ in range(rng.randint(1, 3))],
                    lambda: {"k": rand_json_value(rng, depth + 1)}]
    return rng.choice(choices)()


def json_paths(v, path=()):
    yield path, v
    if isinstance(v, dict):
        for k, x in v.items():
            yield from json_paths(x, path + (k,))
    elif isinstance(v, list):
        for i, x in enumerate(v[:64]):
            yield from json_paths(x, path + (i,))


def set_path(root, path, value, delete=False):
    if not path:
        return value
    cur = root
    for p in path[:-1]:
        cur = cur[p]
    if delete:
        if isinstance(cur, dict):
            del cur[path[-1]]
        else:
            cur.pop(path[-1])
    else:
        cur[path[-1]] = value
    return root


def mutate_json_obj(obj, rng):
    paths = list(json_paths(obj))
    path, old = rng.choice(paths[1:] if len(paths) > 1 else paths)
    r = rng.random()
    if r < 0.2 and path:
        return set_path(obj, path, None, delete=True)
    if r < 0.5 and isinstance(old, (int, float)) and not isinstance(old, bool):
        return set_path(obj, path, rng.choice([-old, old * 2 + 1, old - 1, 0, -1, old * 1000, 2 ** 40, old + 0.5]))
    if r < 0.6 and isinstance(old, list) and old:
        return set_path(obj, path, old[: rng.randrange(len(old))])
    return set_path(obj, path, rand_json_value(rng))


def mutate_json_text(text, rng, hostile=None):
    r = rng.random()
    if r < 0.15:
        return flip_bytes(text.encode(), rng).decode("latin-1")
    if r < 0.25:
        return deepen_json(json.loads(text), rng)
    if hostile and r < 0.45:
        return hostile(json.loads(text), rng)
    obj = json.loads(text)
    for _ in range(rng.randint(1, 3)):
        obj = mutate_json_obj(obj, rng)
    return json.dumps(obj)


def mutate_safetensors(data, rng):
    n = struct.unpack("<Q", data[:8])[0]
    header, rest = data[8:8 + n], data[8 + n:]
    r = rng.random()
    if r < 0.25:
        return extreme_word(data, rng, (0, 8))
    if r < 0.35:
        return truncate(data, rng)
    if r < 0.45:
        return flip_bytes(data, rng, (0, 8 + n))
    h = json.loads(header)
    names = [k for k in h if k != "__metadata__"]
    name = rng.choice(names)
    field = rng.choice(["dtype", "shape", "data_offsets", "delete", "dup"])
    if field == "delete":
        del h[name]
    elif field == "dup":
        h[name + ".extra"] = dict(h[name])
    elif field == "dtype":
        h[name]["dtype"] = rng.choice(["F16", "BF16", "F32", "F64", "I8", "U8", "Q4", "", 7])
    elif field == "shape":
        s = list(h[name]["shape"])
        if s and rng.random() < 0.7:
            s[rng.randrange(len(s))] = rng.choice([0, -1, 1, 2 ** 31, 2 ** 62, s[0] * 2])
        else:
            s = rng.choice([[], [1, 2, 3, 4, 5], "x", None])
        h[name]["shape"] = s
    else:
        o = list(h[name]["data_offsets"])
        o[rng.randrange(2)] = rng.choice([0, -1, 2 ** 63, 2 ** 64 - 1, len(rest) + 1, o[0] + 1, 2 ** 40])
        h[name]["data_offsets"] = o
    hb = json.dumps(h).encode()
    return struct.pack("<Q", len(hb)) + hb + rest


def mutate_text(text, rng, hostile=None):
    if rng.random() < 0.25:
        return hostile_yaml(text, rng)
    if hostile and rng.random() < 0.1:
        return hostile(text, rng)
    lines = text.split("\n")
    r = rng.random()
    i = rng.randrange(len(lines))
    if r < 0.3:
        del lines[i]
    elif r < 0.6 and ":" in lines[i]:
        k, _, _ = lines[i].partition(":")
        lines[i] = k + ": " + rng.choice(["-1", "0", "1e300", "x", "[]", "{}", "[1, -2]", "99999999999999999999",
                                          "\"\"", "null", "[0, 0]", "16G", "-4G", "1/0"])
    elif r < 0.8:
        lines.insert(i, rng.choice(["bogus: 1", "- x", "  : :", "[", "models: []", "\t"]))
    else:
        return flip_bytes(text.encode(), rng).decode("latin-1")
    return "\n".join(lines)


def random_text(rng):
    """Prompt text: valid UTF-8 of every width, invalid sequences, control characters, special-token
    fragments and long runs (what a user's prompt file may hold)."""
    pieces = ["Hello", " world", "\n", "\t", "  ", "<|im_start|>", "<|im_end|>", "<s>", "</s>", "<|endoftext|>",
              "Ä", "ß", "日本語", "🙂", "\u200b", "\ufeff", "\x00", "\x7f", "123", "'s", "'ll", "\r\n",
              "▁", "Ġ", "a" * 300, " " * 50]
    out = b""
    for _ in range(rng.randint(0, 30)):
        r = rng.random()
        if r < 0.6:
            out += rng.choice(pieces).encode("utf-8")
        elif r < 0.63:
            out += bytes(rng.randrange(256) for _ in range(rng.randint(1, 6)))  # often invalid UTF-8
        else:
            out += chr(rng.randrange(0x20, 0x110000)).encode("utf-8", "surrogatepass")
    return out


def tiny_vision_model(d, rng):
    """A Qwen2.5-VL vision tower of 2-pixel patches in `d`: config.json, preprocessor_config.json and
    random f32 weights (safetensors), for `shardwise vision`."""
    h, f, out, depth, c, t, p = 16, 24, 8, 2, 3, 2, 2
    m = 4 * h
    shapes = {"visual.patch_embed.proj.weight": [h, c, t, p, p], "visual.merger.ln_q.weight": [h],
              "visual.merger.mlp.0.weight": [m, m], "visual.merger.mlp.0.bias": [m],
              "visual.merger.mlp.2.weight": [out, m], "visual.merger.mlp.2.bias": [out]}
    for i in range(depth):
        b = "visual.blocks.%d." % i
        shapes.update({b + "norm1.weight": [h], b + "norm2.weight": [h], b + "attn.qkv.weight": [3 * h, h],
                       b + "attn.qkv.bias": [3 * h], b + "attn.proj.weight": [h, h], b + "attn.proj.bias": [h],
                       b + "mlp.gate_proj.weight": [f, h], b + "mlp.gate_proj.bias": [f],
                       b + "mlp.up_proj.weight": [f, h], b + "mlp.up_proj.bias": [f],
                       b + "mlp.down_proj.weight": [h, f], b + "mlp.down_proj.bias": [h]})
    header, blob = {}, b""
    for name, shape in shapes.items():
        n = 1
        for x in shape:
            n *= x
        data = struct.pack("<%df" % n, *[rng.uniform(-0.3, 0.3) for _ in range(n)])
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    hb = json.dumps(header).encode()
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "model.safetensors"), "wb") as s:
        s.write(struct.pack("<Q", len(hb)) + hb + blob)
    vc = {"depth": depth, "hidden_size": h, "intermediate_size": f, "num_heads": 2, "out_hidden_size": out,
          "patch_size": p, "temporal_patch_size": t, "spatial_merge_size": 2, "window_size": 8,
          "fullatt_block_indexes": [1], "hidden_act": "silu"}
    with open(os.path.join(d, "config.json"), "w") as s:
        json.dump({"model_type": "qwen2_5_vl", "vision_config": vc}, s)
    with open(os.path.join(d, "preprocessor_config.json"), "w") as s:
        json.dump({"patch_size": p, "temporal_patch_size": t, "merge_size": 2, "min_pixels": 64, "max_pixels": 4096,
                   "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711]}, s)


class Case:
    def __init__(self, name, files, argv):
        self.name, self.files, self.argv = name, files, argv


def run_case(cli, argv, timeout, env):
    try:
        p = subprocess.run([cli] + argv, capture_output=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return "hang", "", "", None
    out = p.stdout.decode(errors="replace")
    err = p.stderr.decode(errors="replace")
    if "Sanitizer" in err or "runtime error:" in err:
        return "sanitizer", out, err, p.returncode
    if p.returncode not in (0, 1):
        return "exit %d" % p.returncode, out, err, p.returncode
    lines = [l for l in err.splitlines() if l.strip() and not l.startswith("warning")
             and "[warn]" not in l and "[info]" not in l]
    if p.returncode == 1 and len(lines) != 1:
        return "error lines %d" % len(lines), out, err, p.returncode
    return "ok", out, err, p.returncode


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cli", required=True)
    ap.add_argument("--cases", type=int, default=200, help="mutated inputs per target")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", required=True)
    ap.add_argument("--targets",
                    default="gguf,hf_config,safetensors,tokenizer,text,plan,profile,experiment,model_yaml,image,"
                            "preprocessor,vision_config")
    ap.add_argument("--timeout", type=float, default=20.0)
    ap.add_argument("--seconds", type=float, default=0, help="stop making cases after this long (0: run all --cases)")
    ap.add_argument("--verbose", action="store_true", help="also print every rejection's error line")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    cli = os.path.abspath(a.cli)
    os.makedirs(a.out, exist_ok=True)
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0:abort_on_error=0", UBSAN_OPTIONS="print_stacktrace=1")
    work = tempfile.mkdtemp(prefix="swfuzz-")
    gguf_dir = os.path.join(FIX, "llamacpp", "gguf")
    ggufs = sorted(os.path.join(gguf_dir, f) for f in os.listdir(gguf_dir) if f.endswith(".gguf"))
    hf_dirs = [os.path.join(FIX, "hf", d) for d in ("llama", "qwen3moe_norm")]
    toks = [os.path.join(FIX, "tokenizers", "reference", d, "tokenizer.json")
            for d in ("bbpe_qwen2", "spm_legacy", "bbpe_nfkc", "spm_metaspace")]  # Sequence normaliser, template
    toks = [t for t in toks if os.path.exists(t)]

    # Valid inputs made by the CLI itself: a plan table, a profile.
    base_plan = os.path.join(work, "plan.json")
    subprocess.run([cli, "plan", "--model", ggufs[0], "--hw", "h200-host", "--vram-budget", "2M", "--ctx", "64", "--save", base_plan],
                   capture_output=True, check=True)
    base_profile = os.path.join(REPO, "configs", "profiles", "h200-host.profile.json")
    experiment = os.path.join(REPO, "experiments", "smoke.yaml")
    shutil.copytree(os.path.join(REPO, "experiments", "models"), os.path.join(work, "models"))
    model_yamls = sorted(os.path.join(work, "models", f) for f in os.listdir(os.path.join(work, "models"))
                         if f.endswith(".yaml"))
    # A model with each reference tokenizer's vocabulary: the llama fixture with its vocabulary-sized
    # tensors (embedding, LM head) resized, so that `tokenize` loads the tokenizer.json under test.
    tok_models = []
    for t in toks:
        with open(t, encoding="utf-8") as s:
            tj = json.load(s)
        ids = list(tj["model"]["vocab"].values()) + [x["id"] for x in tj.get("added_tokens") or []]
        v = max(ids) + 1
        d = os.path.join(work, "tok%d" % len(tok_models))
        os.makedirs(d)
        src = hf_dirs[0]
        with open(os.path.join(src, "config.json")) as s:
            cfg = json.load(s)
        old_v = cfg["vocab_size"]
        cfg["vocab_size"] = v
        with open(os.path.join(d, "config.json"), "w") as s:
            json.dump(cfg, s)
        with open(os.path.join(src, "model.safetensors"), "rb") as s:
            data = s.read()
        n = struct.unpack("<Q", data[:8])[0]
        h, blob, out, off = json.loads(data[8:8 + n]), data[8 + n:], b"", 0
        for name in sorted(k for k in h if k != "__metadata__"):
            e = h[name]
            o0, o1 = e["data_offsets"]
            chunk = blob[o0:o1]
            if old_v in e["shape"]:
                e["shape"] = [v if x == old_v else x for x in e["shape"]]
                per = (o1 - o0) // old_v
                chunk = (chunk * (v // old_v + 1))[:per * v]
            e["data_offsets"] = [off, off + len(chunk)]
            out += chunk
            off += len(chunk)
        hb = json.dumps(h).encode()
        with open(os.path.join(d, "model.safetensors"), "wb") as s:
            s.write(struct.pack("<Q", len(hb)) + hb + out)
        shutil.copy(t, os.path.join(d, "tokenizer.json"))
        tok_models.append(d)

    vision_dir = os.path.join(work, "vision_model")
    tiny_vision_model(vision_dir, random.Random(7))
    processor_dir = os.path.join(work, "vision_model_processor")
    shutil.copytree(vision_dir, processor_dir)
    with open(os.path.join(vision_dir, "preprocessor_config.json")) as s:
        processor_orig = s.read()
    config_dir = os.path.join(work, "vision_model_config")
    shutil.copytree(vision_dir, config_dir)
    with open(os.path.join(vision_dir, "config.json")) as s:
        config_orig = s.read()
    img_dir = os.path.join(FIX, "vision", "images")
    images = sorted(os.path.join(img_dir, f) for f in os.listdir(img_dir) if f.endswith((".png", ".jpg")))

    def targets():
        names = a.targets.split(",")
        for i in range(a.cases):
            d = os.path.join(work, "c%d" % i)
            if "gguf" in names:
                src = rng.choice(ggufs)
                f = os.path.join(work, "m.gguf")
                with open(src, "rb") as s:
                    data = mutate_gguf(s.read(), rng)
                verb = rng.choice([["info", f], ["tokenize", "--model", f, "--text", "hello world"],
                                   ["run", "--model", f, "--device", "cpu", "--tokens", "1,2,3", "-n", "2", "--greedy"],
                                   ["plan", "--model", f, "--hw", "h200-host", "--vram-budget", "2M", "--ctx", "64"],
                                   ["run", "--model", f, "--device", "emu", "--vram-budget", "2M", "--tokens", "1,2",
                                    "-n", "2", "--greedy"]])
                yield Case("gguf", {f: data}, verb)
            if "hf_config" in names or "safetensors" in names:
                src = rng.choice(hf_dirs)
                shutil.rmtree(d, ignore_errors=True)
                os.makedirs(d)
                files = {}
                for fn in ("config.json", "model.safetensors"):
                    with open(os.path.join(src, fn), "rb") as s:
                        files[os.path.join(d, fn)] = s.read()
                verb = ["run", "--model", d, "--device", "cpu", "--tokens", "1,2,3", "-n", "2", "--greedy"]
                if "hf_config" in names:
                    cfg = dict(files)
                    k = os.path.join(d, "config.json")
                    cfg[k] = mutate_json_text(cfg[k].decode(), rng).encode("latin-1")
                    yield Case("hf_config", cfg, verb)
                if "safetensors" in names:
                    st = dict(files)
                    k = os.path.join(d, "model.safetensors")
                    st[k] = mutate_safetensors(st[k], rng)
                    yield Case("safetensors", st, verb)
            if "tokenizer" in names and tok_models:
                src = rng.choice(tok_models)
                files = {}
                with open(os.path.join(src, "tokenizer.json"), encoding="utf-8") as s:
                    orig = s.read()
                files[os.path.join(src, "tokenizer.json")] = mutate_json_text(orig, rng, nested_tokenizer).encode("utf-8", "replace")
                yield Case("tokenizer", files, ["tokenize", "--model", src, "--text", "Hello, world! 123 ÄÖ <|im_start|>"])
                with open(os.path.join(src, "tokenizer.json"), "w", encoding="utf-8") as s:
                    s.write(orig)
            if "text" in names:
                f = os.path.join(work, "prompt.txt")
                model = rng.choice(ggufs + tok_models)
                verb = rng.choice([["tokenize", "--model", model, "--file", f],
                                   ["tokenize", "--model", model, "--file", f, "--add-special", "--json"],
                                   ["tokenize", "--model", model, "--file", f, "--no-parse-special", "--ids"]])
                yield Case("text", {f: random_text(rng)}, verb)
            if "plan" in names:
                f = os.path.join(work, "p.json")
                with open(base_plan) as s:
                    txt = mutate_json_text(s.read(), rng, hostile_plan)
                yield Case("plan", {f: txt.encode("latin-1")},
                           ["run", "--model", ggufs[0], "--device", "emu", "--plan", f, "--tokens", "1,2", "-n", "2",
                            "--greedy"])
            if "profile" in names:
                f = os.path.join(work, "prof.json")
                with open(base_profile) as s:
                    txt = mutate_json_text(s.read(), rng)
                yield Case("profile", {f: txt.encode("latin-1")},
                           ["plan", "--model", "nemo8b", "--profile", f, "--vram-budget", "4G", "--ctx", "1024"])
            if "experiment" in names:
                f = os.path.join(work, "e.yaml")
                with open(experiment) as s:
                    txt = mutate_text(s.read(), rng, multiplied_lists)
                yield Case("experiment", {f: txt.encode("latin-1")},
                           ["sweep", f, "--predict", "--out", os.path.join(work, "sweep.jsonl")])
            if "model_yaml" in names:
                src = rng.choice(model_yamls)
                f = os.path.join(work, "models", "fuzz.yaml")
                with open(src) as s:
                    txt = mutate_text(s.read(), rng)
                yield Case("model_yaml", {f: txt.encode("latin-1")},
                           rng.choice([["info", f], ["plan", "--model", f, "--hw", "cli3", "--vram-budget", "4G", "--ctx", "256"],
                                       ["run", "--model", "synthetic:" + f + "?dtype=q8_0&seed=3", "--device", "cpu",
                                        "--tokens", "1,2", "-n", "2", "--greedy"]]))
            if "image" in names:
                src = rng.choice(images)
                f = os.path.join(work, "img" + os.path.splitext(src)[1])
                with open(src, "rb") as s:
                    data = s.read()
                data = truncate(data, rng) if rng.random() < 0.3 else flip_bytes(data, rng)
                yield Case("image", {f: data}, ["vision", "--model", vision_dir, "--image", f, "-t", "1"])
            if "preprocessor" in names:  # a copy of the model whose processor config is mutated
                f = os.path.join(processor_dir, "preprocessor_config.json")
                yield Case("preprocessor", {f: mutate_json_text(processor_orig, rng).encode("latin-1")},
                           ["vision", "--model", processor_dir, "--image", images[0], "-t", "1"])
            if "vision_config" in names:  # a copy of the model whose config.json (vision_config) is mutated
                f = os.path.join(config_dir, "config.json")
                yield Case("vision_config", {f: mutate_json_text(config_orig, rng).encode("latin-1")},
                           ["vision", "--model", config_dir, "--image", images[0], "-t", "1"])

    counts, bad = {}, 0
    t_start = time.monotonic()
    for n, c in enumerate(targets()):
        if a.seconds > 0 and time.monotonic() - t_start > a.seconds:
            break
        for path, data in c.files.items():
            with open(path, "wb") as f:
                f.write(data)
        sw = os.path.join(work, "sweep.jsonl")
        if os.path.exists(sw):
            os.remove(sw)
        verdict, out, err, rc = run_case(cli, c.argv, a.timeout, env)
        key = (c.name, "bad" if verdict != "ok" else "rejected" if rc == 1 else "accepted")
        counts[key] = counts.get(key, 0) + 1
        if a.verbose and verdict == "ok" and rc == 1:
            print("%-12s rejected: %s" % (c.name, err.strip().splitlines()[-1][:200]), flush=True)
        if verdict != "ok":
            bad += 1
            keep = os.path.join(a.out, "%s_%04d" % (c.name, n))
            os.makedirs(keep, exist_ok=True)
            argv = []
            for x in c.argv:
                for path in c.files:
                    if x == path or x == os.path.dirname(path):
                        x = os.path.join(keep, os.path.relpath(x, work))
                argv.append(x)
            for path, data in c.files.items():
                dst = os.path.join(keep, os.path.relpath(path, work))
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                with open(dst, "wb") as f:
                    f.write(data)
            with open(os.path.join(keep, "repro.sh"), "w") as f:
                f.write(" ".join([cli] + ["'%s'" % x for x in argv]) + "\n")
            with open(os.path.join(keep, "stderr.txt"), "w") as f:
                f.write(err[-20000:])
            print("%-12s %-16s %s" % (c.name, verdict, (err.strip().splitlines() or [""])[0][:160]), flush=True)
    shutil.rmtree(work, ignore_errors=True)
    for k in sorted(counts):
        print("%-12s %-8s %d" % (k[0], k[1], counts[k]))
    print("violations: %d" % bad)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
