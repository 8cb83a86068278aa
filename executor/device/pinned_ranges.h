// executor/device/pinned_ranges.h — the page ranges of host memory a Device has pinned: which parts of
// a new range still need pinning (adjacent tensors share pages), which to unpin, how many bytes are
// pinned, and where a copy's host side crosses from one range (or unpinned memory) into another.
// Bookkeeping only: the device does the pinning (the CUDA device registers with the driver, the
// emulated one only records).
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>

namespace shardwise {

class PinnedRanges {
 public:
  explicit PinnedRanges(uint64_t page) : page_(page) {}

  // Calls pin(begin, end) for each page-rounded piece of [ptr, ptr + bytes) that no recorded range
  // covers, and records the pieces for which it returns true.
  template <class Pin>
  void add(const void* ptr, uint64_t bytes, Pin&& pin) {
    if (!ptr || bytes == 0) return;
    const uint64_t end = round_up(reinterpret_cast<uint64_t>(ptr) + bytes);
    for (uint64_t at = round_down(reinterpret_cast<uint64_t>(ptr)); at < end;) {
      auto it = ranges_.upper_bound(at);
      if (it != ranges_.begin() && std::prev(it)->second > at) {
        at = std::prev(it)->second;
        continue;
      }
      const uint64_t stop = it != ranges_.end() ? std::min(end, it->first) : end;
      if (stop > at && pin(at, stop)) ranges_[at] = stop;
      at = stop;
    }
  }

  // Calls unpin(begin) for each recorded range that starts inside the page-rounded [ptr, ptr + bytes)
  // and forgets it.
  template <class Unpin>
  void remove(const void* ptr, uint64_t bytes, Unpin&& unpin) {
    if (!ptr || bytes == 0) return;
    const uint64_t end = round_up(reinterpret_cast<uint64_t>(ptr) + bytes);
    for (auto it = ranges_.lower_bound(round_down(reinterpret_cast<uint64_t>(ptr)));
         it != ranges_.end() && it->first < end;) {
      unpin(it->first);
      it = ranges_.erase(it);
    }
  }

  uint64_t bytes() const {
    uint64_t sum = 0;
    for (const auto& r : ranges_) sum += r.second - r.first;
    return sum;
  }

  bool pinned(uint64_t at) const {
    auto it = ranges_.upper_bound(at);
    return it != ranges_.begin() && std::prev(it)->second > at;
  }

  // The longest piece from `at`, at most `max` bytes, that stays inside one range or one gap.
  uint64_t run_from(uint64_t at, uint64_t max) const {
    auto it = ranges_.upper_bound(at);
    if (it != ranges_.begin() && std::prev(it)->second > at) return std::min(max, std::prev(it)->second - at);
    return it != ranges_.end() ? std::min(max, it->first - at) : max;
  }

  const std::map<uint64_t, uint64_t>& ranges() const { return ranges_; }

 private:
  uint64_t round_down(uint64_t a) const { return a / page_ * page_; }
  uint64_t round_up(uint64_t a) const { return (a + page_ - 1) / page_ * page_; }

  uint64_t page_;
  std::map<uint64_t, uint64_t> ranges_;  // begin -> end
};

}  // namespace shardwise
