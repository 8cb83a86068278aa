// vision/mrope.h — the multimodal RoPE positions of Qwen2-VL / Qwen2.5-VL language models (M-RoPE).
// Each token has three positions (temporal, height, width). Text tokens have three equal positions that
// count on from the previous token's largest; the tokens of an image count from where the text before it
// ended: temporal 0, and its merged patch's row and column. The rotary pairs of a head are split into
// three sections (`mrope_section`, e.g. 16/24/24 pairs of a 128-wide head), each rotated by one of the
// three positions. A prompt of text alone gets the plain 1-D positions, so M-RoPE equals RoPE there.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "vision/vision_spec.h"  // GridThw

namespace shardwise {

struct MropeTokens {
  int32_t image_token_id = -1;         // the placeholder repeated once per merged image token
  int32_t vision_start_token_id = -1;  // precedes each image's placeholders
  int64_t spatial_merge_size = 2;      // patches merged per side into one token
};

struct MropePositions {
  std::vector<std::array<int64_t, 3>> pos;  // per token: temporal, height, width
  // Decode continues at position n_tokens + delta (all three sections equal), as HF's rope_deltas.
  int64_t delta = 0;
};

// The positions of a prompt, as HF's get_rope_index computes them for images. Each run of image tokens
// must follow a vision-start token and hold exactly t*(h/m)*(w/m) tokens of its grid, in order; any other
// arrangement (a run of the wrong length, more runs than grids, grids left over) is an Error naming it.
MropePositions mrope_positions(const std::vector<int32_t>& ids, const std::vector<GridThw>& grids,
                               const MropeTokens& tokens);

// For each rotary pair p of a head (head_dim / 2 pairs), which of the three positions rotates it:
// the first sections[0] pairs the temporal one, the next sections[1] the height, the rest the width.
// Refuses sections that do not add up to head_dim / 2.
std::vector<int> mrope_pair_sections(const std::vector<int64_t>& sections, int64_t head_dim);

}  // namespace shardwise
