#!/usr/bin/env bash
# GPU machine: `serve --vision-budget` on CUDA against the same server on the CPU, on the HF fixture's
# Qwen2.5-VL: the same greedy chat request with an image (data: URL) to each; the generated token ids must
# be equal, and the CUDA server's /metrics must count the encode on the device. Exit 1 otherwise.
#   serve_vision.sh OUT      Env: BUNDLE, DEVICE (cuda; emu checks the script without a GPU)
set -uo pipefail
out=${1:?usage: serve_vision.sh OUT}
source "$(dirname "$0")/bundle_env.sh"
source "$(dirname "$0")/serve_env.sh"
mkdir -p "$out"
fixture=tests/fixtures/vl/qwen2_5_vl
image=$fixture/images/img_300x200/image.png
# The fixture has no tokenizer: a copy with a byte-level one for its vocabulary of 300 (byte b is token b;
# ChatML's and the vision tokens at the ids tests/vl_test_util.h gives them).
model=$(mktemp -d)
cp "$fixture"/config.json "$fixture"/model.safetensors "$fixture"/preprocessor_config.json "$model/"
python3 - "$model" <<'PY'
import json, sys
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
vocab = {chr(c): b for b, c in zip(bs, cs)}
specials = {280: "<|im_start|>", 281: "<|im_end|>", 290: "<|vision_start|>", 291: "<|vision_end|>", 292: "<|image_pad|>"}
json.dump({"model": {"type": "BPE", "vocab": vocab, "merges": []},
           "added_tokens": [{"id": i, "content": t, "special": True} for i, t in specials.items()],
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False}, "decoder": {"type": "ByteLevel"}},
          open(sys.argv[1] + "/tokenizer.json", "w"))
PY
ask() {  # URL OUT.json: one chat request with the image, 12 greedy tokens
  python3 - "$1" "$image" > "$2" <<'PY'
import base64, json, sys, urllib.error, urllib.request
url, image = sys.argv[1], sys.argv[2]
data = "data:image/png;base64," + base64.b64encode(open(image, "rb").read()).decode()
body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data}},
                                                  {"type": "text", "text": "What is in the image?"}]}],
        "max_tokens": 12, "temperature": 0, "return_tokens": True}
req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                             {"Content-Type": "application/json"})
try:
    print(urllib.request.urlopen(req, timeout=120).read().decode())
except urllib.error.HTTPError as e:
    sys.exit("HTTP %d: %s" % (e.code, e.read().decode()))
PY
}
rc=0
for side in cpu cuda; do
  args=(-m "$model" --device cpu)
  [ $side = cuda ] && args=(-m "$model" --device "${DEVICE:-cuda}" --vram-budget 512M --vision-budget 256M)
  start_serve "$out/serve_$side.out" "$out/serve_$side.log" "${args[@]}"
  if [ -z "$url" ]; then echo "$side server did not start: $(tail -2 "$out/serve_$side.log")"; rc=1; continue; fi
  ask "$url" "$out/answer_$side.json" || rc=1
  curl -s "$url/metrics" > "$out/metrics_$side.txt"
  kill "$pid"; wait "$pid" 2> /dev/null
done
python3 - "$out" <<'PY' || rc=1
import json, sys
d = sys.argv[1]
def tokens(side):
    j = json.load(open(f"{d}/answer_{side}.json"))
    c = j["choices"][0]
    return c.get("tokens") or c.get("token_ids") or c["message"]["content"]
a, b = tokens("cpu"), tokens("cuda")
device = [l for l in open(f"{d}/metrics_cuda.txt") if l.startswith("shardwise_vision_encodes_total") and 'on="device"' in l]
print("cpu:", a); print("cuda:", b); print("device encodes:", device)
ok = a == b and device and float(device[0].split()[-1]) >= 1
print("serve vision on CUDA:", "same tokens, encoded on the device" if ok else "FAILED")
sys.exit(0 if ok else 1)
PY
rm -rf "$model"
exit $rc
