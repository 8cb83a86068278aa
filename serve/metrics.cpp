// serve/metrics.cpp — see metrics.h.
#include "serve/metrics.h"

#include <malloc.h>

#include <cstdio>

namespace shardwise::serve {
namespace {

// "# HELP", "# TYPE" and the sample line of one metric without labels.
void metric(std::string& out, const char* name, const char* type, const char* help, double value) {
  char line[160];
  std::snprintf(line, sizeof line, "%.17g", value);
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " + line + "\n";
}

// The C heap as the allocator sees it: bytes handed out and live (small blocks and mmapped ones), and
// bytes it holds free without returning them to the system. Resident memory that grows while the live
// bytes stay flat is the allocator's retention, not a leak.
void heap_metrics(std::string& out) {
  const struct mallinfo2 m = mallinfo2();
  metric(out, "shardwise_heap_in_use_bytes", "gauge", "C heap bytes allocated and not freed",
         static_cast<double>(m.uordblks + m.hblkhd));
  metric(out, "shardwise_heap_free_bytes", "gauge", "C heap bytes freed but kept by the allocator",
         static_cast<double>(m.fordblks));
}

}  // namespace

void Metrics::reject(int status) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++rejected_[status];
}

void Metrics::set_device(const DeviceMemory& m) {
  std::lock_guard<std::mutex> lock(mutex_);
  device_ = m;
}

void Metrics::set_vision(const VisionEncodes& v) {
  std::lock_guard<std::mutex> lock(mutex_);
  vision_ = v;
}

std::string Metrics::prometheus() const {
  std::string out;
  auto u = [](const std::atomic<uint64_t>& v) { return static_cast<double>(v.load()); };
  auto i = [](const std::atomic<int64_t>& v) { return static_cast<double>(v.load()); };
  metric(out, "shardwise_http_requests_total", "counter", "HTTP requests received, any path", u(http_requests));
  metric(out, "shardwise_requests_total", "counter", "Generation requests admitted to the queue", u(requests));
  metric(out, "shardwise_requests_done_total", "counter", "Generations answered (finish_reason stop or length)",
         u(requests_done));
  metric(out, "shardwise_requests_cancelled_total", "counter", "Generations whose client disconnected first",
         u(requests_cancelled));
  metric(out, "shardwise_requests_timed_out_total", "counter", "Generations cut short or refused by --timeout",
         u(requests_timed_out));
  metric(out, "shardwise_requests_failed_total", "counter", "Generations that failed with an internal error",
         u(requests_failed));
  metric(out, "shardwise_requests_in_flight", "gauge", "Generations running now", i(in_flight));
  metric(out, "shardwise_requests_queued", "gauge", "Generations waiting for a slot", i(queued));
  metric(out, "shardwise_prompt_tokens_total", "counter", "Prompt tokens of started generations (cached included)",
         u(prompt_tokens));
  metric(out, "shardwise_prompt_tokens_cached_total", "counter",
         "Prompt tokens whose KV cache was reused from the previous request", u(cached_prompt_tokens));
  metric(out, "shardwise_generated_tokens_total", "counter", "Tokens generated", u(generated_tokens));
  metric(out, "shardwise_last_request_tokens_per_second", "gauge", "Decode tokens/s of the last finished generation",
         last_tokens_per_s.load());
  metric(out, "shardwise_batch_size", "gauge", "Sequences in the step running now", i(batch_size));
  metric(out, "shardwise_slots", "gauge", "Sequences the scheduler runs at once (--parallel)", slots_);
  heap_metrics(out);
  std::lock_guard<std::mutex> lock(mutex_);
  out +=
      "# HELP shardwise_requests_rejected_total Requests refused before generating, by HTTP status\n"
      "# TYPE shardwise_requests_rejected_total counter\n";
  for (const auto& [status, n] : rejected_)
    out += "shardwise_requests_rejected_total{code=\"" + std::to_string(status) + "\"} " + std::to_string(n) + "\n";
  if (device_) {
    metric(out, "shardwise_vram_arena_bytes", "gauge", "The VRAM arena (exactly the budget)",
           static_cast<double>(device_->budget_bytes));
    metric(out, "shardwise_vram_arena_peak_bytes", "gauge", "The largest extent of the arena any plan used",
           static_cast<double>(device_->arena_peak_bytes));
    metric(out, "shardwise_device_peak_bytes", "gauge", "Device memory taken since the arena was allocated",
           static_cast<double>(device_->device_peak_bytes));
    metric(out, "shardwise_device_context_bytes", "gauge", "Device context and modules, outside the budget",
           static_cast<double>(device_->context_bytes));
  }
  if (vision_) {
    out +=
        "# HELP shardwise_vision_encodes_total Requests whose images were encoded, by where the encoder ran\n"
        "# TYPE shardwise_vision_encodes_total counter\n"
        "shardwise_vision_encodes_total{on=\"device\"} " +
        std::to_string(vision_->device) + "\nshardwise_vision_encodes_total{on=\"cpu\"} " +
        std::to_string(vision_->cpu) + "\n";
    metric(out, "shardwise_vision_arena_bytes", "gauge", "The last device encode's arena (0: none yet)",
           static_cast<double>(vision_->arena_bytes));
    metric(out, "shardwise_vision_last_encode_milliseconds", "gauge",
           "The encoder's time for the last request's images, on the device or the CPU (0: none yet)",
           vision_->last_encode_ms);
    metric(out, "shardwise_vision_held_bytes", "gauge",
           "Device memory the image encoder holds while serving (--vision-budget; 0: none)",
           static_cast<double>(vision_->held_bytes));
  }
  return out;
}

}  // namespace shardwise::serve
