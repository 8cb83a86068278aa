// serve/channel.cpp — see channel.h.
#include "serve/channel.h"

namespace shardwise::serve {

const char* finish_name(Finish f) {
  return f == Finish::Stop ? "stop" : "length";
}

void Channel::push(Event e) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (e.kind == Event::Kind::Delta && !events_.empty() && events_.back().kind == Event::Kind::Delta) {
      Event& last = events_.back();
      last.text += e.text;
      last.tokens.insert(last.tokens.end(), e.tokens.begin(), e.tokens.end());
    } else {
      events_.push_back(std::move(e));
    }
  }
  ready_.notify_all();
  if (on_ready_) on_ready_();
}

std::vector<Event> Channel::take() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Event> out;
  out.swap(events_);
  return out;
}

std::vector<Event> Channel::wait_take(Clock::duration timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  ready_.wait_for(lock, timeout, [&] { return !events_.empty(); });
  std::vector<Event> out;
  out.swap(events_);
  return out;
}

}  // namespace shardwise::serve
