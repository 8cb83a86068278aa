// vision/mrope.cpp — M-RoPE positions (see mrope.h).
#include "vision/mrope.h"

#include <algorithm>

#include "core/error.h"

namespace shardwise {

namespace {

// Appends `n` text positions starting at `start` (all three equal).
void append_text(std::vector<std::array<int64_t, 3>>& pos, int64_t start, int64_t n) {
  for (int64_t i = 0; i < n; ++i) pos.push_back({start + i, start + i, start + i});
}

int64_t next_start(const std::vector<std::array<int64_t, 3>>& pos) {
  int64_t m = -1;
  for (const auto& p : pos) m = std::max({m, p[0], p[1], p[2]});
  return m + 1;
}

// The merged token count of a grid, checked.
int64_t image_tokens(const GridThw& g, int64_t merge, size_t index) {
  const int64_t limit = int64_t(1) << 24;
  if (g[0] < 1 || g[1] < 1 || g[2] < 1 || g[0] > limit || g[1] > limit || g[2] > limit)
    fail("image ", index, ": grid ", g[0], "x", g[1], "x", g[2], " is not a positive grid");
  if (g[1] % merge != 0 || g[2] % merge != 0)
    fail("image ", index, ": grid ", g[1], "x", g[2], " is not a multiple of the merge size ", merge);
  return g[0] * (g[1] / merge) * (g[2] / merge);
}

}  // namespace

MropePositions mrope_positions(const std::vector<int32_t>& ids, const std::vector<GridThw>& grids,
                               const MropeTokens& tokens) {
  SW_CHECK(tokens.spatial_merge_size >= 1, "M-RoPE: spatial_merge_size must be positive");
  const int64_t n = static_cast<int64_t>(ids.size()), merge = tokens.spatial_merge_size;
  MropePositions out;
  out.pos.reserve(ids.size());
  int64_t st = 0;
  size_t image = 0;
  for (int64_t i = 0; i < n;) {
    if (ids[static_cast<size_t>(i)] != tokens.image_token_id) {
      ++i;
      continue;
    }
    // A run of image tokens starts at i: the text before it, then the image's grid positions.
    if (image >= grids.size()) fail("M-RoPE: image tokens at ", i, " but only ", grids.size(), " image grid(s) given");
    if (i == 0 || ids[static_cast<size_t>(i - 1)] != tokens.vision_start_token_id)
      fail("M-RoPE: the image tokens at ", i, " do not follow a vision-start token");
    const GridThw& g = grids[image];
    const int64_t count = image_tokens(g, merge, image), gh = g[1] / merge, gw = g[2] / merge;
    int64_t run = 0;
    while (i + run < n && ids[static_cast<size_t>(i + run)] == tokens.image_token_id) ++run;
    if (run != count)
      fail("M-RoPE: image ", image, " has ", run, " tokens in the prompt, its grid ", g[0], "x", g[1], "x", g[2],
           " needs ", count);
    append_text(out.pos, next_start(out.pos), i - st);
    const int64_t base = next_start(out.pos);
    for (int64_t t = 0; t < g[0]; ++t)  // an image's frames all sit at temporal 0 (no time between them)
      for (int64_t h = 0; h < gh; ++h)
        for (int64_t w = 0; w < gw; ++w) out.pos.push_back({base, base + h, base + w});
    i += run;
    st = i;
    ++image;
  }
  if (image != grids.size())
    fail("M-RoPE: ", grids.size(), " image grid(s) given, the prompt has ", image, " image(s)");
  append_text(out.pos, next_start(out.pos), n - st);
  out.delta = next_start(out.pos) - n;
  return out;
}

std::vector<int> mrope_pair_sections(const std::vector<int64_t>& sections, int64_t head_dim) {
  if (sections.size() != 3) fail("mrope_section must have 3 entries, got ", sections.size());
  int64_t sum = 0;
  for (int64_t s : sections) {
    if (s < 0 || s > head_dim) fail("mrope_section entry ", s, " is out of range for head_dim ", head_dim);
    sum += s;
  }
  if (sum != head_dim / 2)
    fail("mrope_section adds up to ", sum, " pairs, the head has ", head_dim / 2, " (head_dim ", head_dim, ")");
  std::vector<int> out;
  for (int s = 0; s < 3; ++s) out.insert(out.end(), static_cast<size_t>(sections[static_cast<size_t>(s)]), s);
  return out;
}

}  // namespace shardwise
