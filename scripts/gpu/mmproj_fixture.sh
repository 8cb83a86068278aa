#!/usr/bin/env bash
# GPU machine (torch, safetensors and transformers are there): llama.cpp's own converter on the HF
# fixture's Qwen2.5-VL tower, for a test of `run --mmproj` on a file the converter wrote. The fixture in the
# released layout (visual.* names, the flat config) in a temporary directory, then convert_hf_to_gguf.py
# --mmproj --outtype f32 into OUT/mmproj_fixture.gguf.
#   mmproj_fixture.sh OUT     Env: CONVERTER (a folder with convert_hf_to_gguf.py and gguf-py; required)
set -uo pipefail
out=${1:?usage: mmproj_fixture.sh OUT}
conv=${CONVERTER:?CONVERTER=folder with convert_hf_to_gguf.py and gguf-py}
tmp=$(mktemp -d)
python3 - "$tmp" <<'PY'
import shutil
import sys
from safetensors.torch import load_file, save_file
d, src = sys.argv[1], "tests/fixtures/vl/qwen2_5_vl"
renamed = {}
for k, v in load_file(src + "/model.safetensors").items():
    if k.startswith("model.visual."):
        k = "visual." + k[len("model.visual."):]
    elif k.startswith("model.language_model."):
        k = "model." + k[len("model.language_model."):]
    renamed[k] = v.contiguous()
save_file(renamed, d + "/model.safetensors", metadata={"format": "pt"})
shutil.copy(src + "/config_flat.json", d + "/config.json")
shutil.copy(src + "/preprocessor_config.json", d + "/preprocessor_config.json")
print("released layout:", len(renamed), "tensors")
PY
PYTHONPATH="$conv/gguf-py" timeout 120 python3 "$conv/convert_hf_to_gguf.py" "$tmp" --mmproj --outtype f32 \
  --outfile "$out/mmproj_fixture.gguf" 2>&1 | tail -15
rm -rf "$tmp"
ls -la "$out/mmproj_fixture.gguf"
