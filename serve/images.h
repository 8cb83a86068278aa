// serve/images.h — a vision-language model's images for the server: a request's data: URL images
// decoded, preprocessed and encoded (the vision encoder, on the CPU or on a device within a budget of its
// own), and its prompt's placeholders expanded into the rows the scheduler steps (ImagePrompt).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "core/thread_pool.h"
#include "serve/api.h"
#include "serve/channel.h"
#include "serve/metrics.h"
#include "vision/vl_prompt.h"

namespace shardwise::serve {

struct EncodedPrompt {
  std::vector<int32_t> ids;  // the prompt with each image's placeholder expanded to its image tokens
  std::shared_ptr<const ImagePrompt> image;
};

class ImageEncoder {
 public:
  // model: the served model's vision side; token_embd: its language model's embedding table (a view of
  // weights that outlive the encoder); threads: the encoder's CPU threads. With a device (one of the
  // encoder's own, holding no arena), the encoder's kernels are set up and an arena of budget_bytes is
  // allocated now and kept for the encoder's life; each request's images are encoded in it, or on the CPU
  // where they do not fit it. Nothing is allocated or released on the device per request: that would
  // synchronise the whole GPU while the language model's device works on it (and break its CUDA graphs).
  ImageEncoder(VlModel model, const TensorView& token_embd, int threads, std::unique_ptr<Device> device = nullptr,
               uint64_t budget_bytes = 0);

  const MropeTokens& tokens() const { return model_.tokens; }
  // The encodes so far (for /metrics); any thread.
  VisionEncodes encodes() const;

  // `ids` holds one image token per image, at its place. Each image is decoded and preprocessed in turn
  // (refused once the expanded prompt would be longer than `context`), then all are encoded together
  // and the prompt expanded. One request at a time (the others wait): the encoder's pool, device and the
  // pixel memory serve one. Throws ApiFailure (400) for an image that does not decode, a prompt too long,
  // or placeholders that do not match the images (image tokens written in the text).
  EncodedPrompt encode(const std::vector<int32_t>& ids, const std::vector<ApiImage>& images, int64_t context);

 private:
  VlModel model_;
  TensorView token_embd_;
  std::mutex mutex_;
  ThreadPool pool_;
  std::unique_ptr<Device> device_;
  uint64_t budget_bytes_ = 0;
  uint8_t* arena_ = nullptr;  // device_'s, budget_bytes_ of it
  std::atomic<uint64_t> device_encodes_{0}, cpu_encodes_{0}, arena_bytes_{0};
  std::atomic<double> last_encode_ms_{0};
};

}  // namespace shardwise::serve
