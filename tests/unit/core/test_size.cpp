// Tests for core/size: the unit rules of DESIGN.md §6.
#include <catch2/catch.hpp>

#include "core/error.h"
#include "core/size.h"

using namespace shardwise;
using Catch::Matchers::Contains;

TEST_CASE("sizes: K/M/G and KiB/MiB/GiB are binary, KB/MB/GB decimal", "[size]") {
  CHECK(parse_size("4G") == 4ull << 30);
  CHECK(parse_size("512M") == 512ull << 20);
  CHECK(parse_size("2000MB") == 2000000000ull);
  CHECK(parse_size("1.5GiB") == 3ull << 29);
  CHECK(parse_size("4GB") == 4000000000ull);
  CHECK(parse_size("123") == 123);
  CHECK(parse_size("16 KiB") == 16384);
  CHECK_THROWS_WITH(parse_size("4X", "--vram-budget"), Contains("--vram-budget") && Contains("unknown unit"));
  CHECK_THROWS_AS(parse_size(""), Error);
  CHECK_THROWS_AS(parse_size("-1G"), Error);
  CHECK_THROWS_AS(parse_size("1e30G"), Error);
}

TEST_CASE("bandwidths and token counts", "[size]") {
  CHECK(parse_bandwidth("16GB/s") == 16e9);
  CHECK(parse_bandwidth("13.5GB/s") == 13.5e9);
  CHECK(parse_bandwidth("none") == 0.0);
  CHECK_THROWS_WITH(parse_bandwidth("16GB"), Contains("/s"));
  CHECK_THROWS_AS(parse_bandwidth("0GB/s"), Error);
  CHECK(parse_token_count("1K") == 1024);
  CHECK(parse_token_count("16K") == 16384);
  CHECK(parse_token_count("512") == 512);
  CHECK_THROWS_AS(parse_token_count("0"), Error);
  CHECK_THROWS_AS(parse_token_count("1.5"), Error);
  CHECK(format_bytes(1536) == "1.5 KiB");
  CHECK(format_bytes(34) == "34 B");
}

TEST_CASE("format_fixed prints a fixed number of decimals", "[size]") {
  CHECK(format_fixed(7.82679, 2) == "7.83");
  CHECK(format_fixed(0.0653147, 2) == "0.07");
  CHECK(format_fixed(29.125, 1) == "29.1");
  CHECK(format_fixed(-1.5, 0) == "-2");
  CHECK(format_fixed(3.0, 3) == "3.000");
}
