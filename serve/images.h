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
  // encoder's own, holding no arena), each request's images are encoded there within budget_bytes (the
  // arena allocated per encode and released after), or on the CPU where they do not fit it.
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
  std::atomic<uint64_t> device_encodes_{0}, cpu_encodes_{0}, arena_bytes_{0};
};

}  // namespace shardwise::serve
