#!/usr/bin/env python3
"""One TSV line of scripts/gpu/vl_peers.sh from one run's log:

    vl_peer_row.py IMAGE BUDGET SYSTEM CONFIG REPEAT LOG WALL_MS

Columns: image, budget, system, config, repeat, rc, wall_ms, prompt_tokens, encode_ms, prefill_ms, decode_tps,
peak_mib (the two systems' image processors may give an image different token counts: prompt_tokens says).
shardwise's log holds `run --json`'s object (vision.encode_ms, ttft_ms: the language model's prefill of the
expanded prompt, decode_tokens_per_s); llama-mtmd-cli's, its own lines (the image's encode, llama_perf's
prompt eval time and eval rate). Both end with vl_peers.sh's `rc=N peak_mib=M`. A value the log lacks is
left empty.
"""
import json
import re
import sys


def shardwise(text):
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                j = json.loads(line)
            except ValueError:
                continue
            return (j.get("n_prompt_tokens"), j.get("vision", {}).get("encode_ms"), j.get("ttft_ms"),
                    j.get("decode_tokens_per_s"))
    return (None, None, None, None)


def last(pattern, text):
    found = re.findall(pattern, text)
    return float(found[-1]) if found else None


def mtmd(text):
    encode = last(r"(?:image|image/slice)(?: slice)? encoded in (\d+) ms", text)
    prefill = last(r"prompt eval time\s*=\s*([\d.]+) ms", text)
    tokens = last(r"prompt eval time\s*=\s*[\d.]+ ms /\s*(\d+) tokens", text)
    tps = last(r"\beval time\s*=.*?([\d.]+) tokens per second", "\n".join(
        line for line in text.splitlines() if "prompt eval" not in line))
    return (tokens, encode, prefill, tps)


def main():
    image, budget, system, config, repeat, log, wall = sys.argv[1:8]
    text = open(log, errors="replace").read()
    m = re.search(r"rc=(-?\d+) peak_mib=(-?\d+)", text)
    rc, peak = (m.group(1), m.group(2)) if m else ("", "")
    values = shardwise(text) if system == "shardwise" else mtmd(text)
    cells = [image, budget, system, config, repeat, rc, wall] + ["" if v is None else "%g" % v for v in values] + [peak]
    print("\t".join(cells))


if __name__ == "__main__":
    main()
