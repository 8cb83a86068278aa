// serve/metrics.h — the server's counters and gauges, updated from the HTTP threads and the worker
// without locks (atomics), and written as Prometheus text for GET /metrics. Device values (the VRAM
// arena, the device's peak) exist only for a run with a device runtime, and the vision encoder's only for
// a model that takes images; they are omitted otherwise.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>

namespace shardwise::serve {

// What the device runtime reports of its memory (executor/runtime RuntimeMemory), read on the worker.
struct DeviceMemory {
  uint64_t budget_bytes = 0;       // the VRAM arena: exactly the budget, allocated once
  uint64_t arena_peak_bytes = 0;   // the largest extent of the arena any plan used
  uint64_t device_peak_bytes = 0;  // device memory taken since the arena was allocated
  uint64_t context_bytes = 0;      // CUDA context and modules, outside the budget
};

// The image encodes of a vision-language model's requests (serve/images.h): one per request with images.
struct VisionEncodes {
  uint64_t device = 0;        // encoded on the device, within --vision-budget
  uint64_t cpu = 0;           // encoded on the CPU (no --vision-budget, or the images did not fit it)
  uint64_t arena_bytes = 0;   // the last device encode's arena (0: none yet)
  uint64_t held_bytes = 0;    // the device memory the encoder holds for its life (--vision-budget; 0: none)
  double last_encode_ms = 0;  // the encoder's time for the last request's images (0: none yet)
};

class Metrics {
 public:
  explicit Metrics(int slots = 1) : slots_(slots) {}

  std::atomic<uint64_t> http_requests{0};         // every HTTP request, any path
  std::atomic<uint64_t> requests{0};              // generations admitted to the queue
  std::atomic<uint64_t> requests_done{0};         // generations answered (stop or length, timed out included)
  std::atomic<uint64_t> requests_cancelled{0};    // the client went away first
  std::atomic<uint64_t> requests_timed_out{0};    // cut short by --timeout, or never started before it
  std::atomic<uint64_t> requests_failed{0};       // an error while generating (500)
  std::atomic<int64_t> in_flight{0};              // generating now
  std::atomic<int64_t> queued{0};                 // admitted, waiting for a slot
  std::atomic<int64_t> batch_size{0};             // sequences in the step running now
  std::atomic<uint64_t> prompt_tokens{0};         // prompt tokens of started generations, cached ones included
  std::atomic<uint64_t> cached_prompt_tokens{0};  // of those, reused from the previous request's cache
  std::atomic<uint64_t> generated_tokens{0};
  std::atomic<double> last_tokens_per_s{0};  // decode tokens/s of the last generation that ended

  // A request answered with an error status (4xx, 503) before generating.
  void reject(int status);
  void set_device(const DeviceMemory& m);
  void set_vision(const VisionEncodes& v);

  std::string prometheus() const;

 private:
  int slots_;
  mutable std::mutex mutex_;
  std::map<int, uint64_t> rejected_;  // by status
  std::optional<DeviceMemory> device_;
  std::optional<VisionEncodes> vision_;
};

}  // namespace shardwise::serve
