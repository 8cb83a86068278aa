// Tests for vision/mrope: M-RoPE positions of prompts with images, worked out by hand from HF's
// get_rope_index, and the rotary sections of a head.
#include <catch2/catch.hpp>

#include "core/error.h"
#include "vision/mrope.h"

using namespace shardwise;
using Catch::Matchers::Contains;

namespace {
constexpr int32_t kVs = 200, kImg = 201, kVe = 202;
const MropeTokens kTokens{kImg, kVs, 2};
using P = std::array<int64_t, 3>;
}  // namespace

TEST_CASE("M-RoPE: text, then an image's rows and columns, then text counting on from the largest", "[vision]") {
  // Grid 1x4x6 patches -> 2x3 merged tokens.
  const std::vector<int32_t> ids = {10, 11, kVs, kImg, kImg, kImg, kImg, kImg, kImg, kVe, 12, 13};
  const MropePositions m = mrope_positions(ids, {GridThw{1, 4, 6}}, kTokens);
  const std::vector<P> want = {{0, 0, 0}, {1, 1, 1}, {2, 2, 2}, {3, 3, 3}, {3, 3, 4}, {3, 3, 5},
                               {3, 4, 3}, {3, 4, 4}, {3, 4, 5}, {6, 6, 6}, {7, 7, 7}, {8, 8, 8}};
  CHECK(m.pos == want);
  CHECK(m.delta == 9 - 12);  // the next token sits at 12 + delta = 9
}

TEST_CASE("M-RoPE: two images of different grids, and text alone is plain RoPE", "[vision]") {
  // Image A: 1x2x2 patches -> one token; image B: 2x4x2 (two frames) -> 2 x (2x1) tokens, temporal 0.
  const std::vector<int32_t> ids = {5, kVs, kImg, kVe, kVs, kImg, kImg, kImg, kImg, kVe, 6};
  const MropePositions m = mrope_positions(ids, {GridThw{1, 2, 2}, GridThw{2, 4, 2}}, kTokens);
  const std::vector<P> want = {{0, 0, 0}, {1, 1, 1}, {2, 2, 2}, {3, 3, 3}, {4, 4, 4}, {5, 5, 5},
                               {5, 6, 5}, {5, 5, 5}, {5, 6, 5}, {7, 7, 7}, {8, 8, 8}};
  CHECK(m.pos == want);
  CHECK(m.delta == 9 - 11);
  const MropePositions text = mrope_positions({1, 2, 3, 4}, {}, kTokens);
  CHECK(text.pos == std::vector<P>{{0, 0, 0}, {1, 1, 1}, {2, 2, 2}, {3, 3, 3}});
  CHECK(text.delta == 0);
}

TEST_CASE("M-RoPE: prompts that do not match their grids are refused", "[vision]") {
  const std::vector<int32_t> one = {kVs, kImg, kVe};
  CHECK_THROWS_WITH(mrope_positions(one, {}, kTokens), Contains("only 0 image grid"));
  CHECK_THROWS_WITH(mrope_positions(one, {GridThw{1, 4, 4}}, kTokens), Contains("needs 4"));
  CHECK_THROWS_WITH(mrope_positions(one, {GridThw{1, 2, 2}, GridThw{1, 2, 2}}, kTokens), Contains("2 image grid"));
  CHECK_THROWS_WITH(mrope_positions({kImg, kVe}, {GridThw{1, 2, 2}}, kTokens), Contains("vision-start"));
  CHECK_THROWS_WITH(mrope_positions(one, {GridThw{1, 3, 2}}, kTokens), Contains("merge size"));
  CHECK_THROWS_WITH(mrope_positions(one, {GridThw{0, 2, 2}}, kTokens), Contains("not a positive grid"));
}

TEST_CASE("M-RoPE: the rotary pairs of a head by section", "[vision]") {
  const std::vector<int> s = mrope_pair_sections({16, 24, 24}, 128);
  REQUIRE(s.size() == 64);
  CHECK(s[0] == 0);
  CHECK(s[15] == 0);
  CHECK(s[16] == 1);
  CHECK(s[39] == 1);
  CHECK(s[40] == 2);
  CHECK(s[63] == 2);
  CHECK_THROWS_WITH(mrope_pair_sections({16, 24, 23}, 128), Contains("adds up to 63"));
  CHECK_THROWS_WITH(mrope_pair_sections({16, 24}, 128), Contains("3 entries"));
  CHECK_THROWS_WITH(mrope_pair_sections({-1, 33, 32}, 128), Contains("out of range"));
}
