// serve/images.cpp — see images.h.
#include "serve/images.h"

#include "core/error.h"
#include "vision/image.h"
#include "vision/preprocess.h"
#include "vision/vision_runtime.h"

namespace shardwise::serve {
namespace {

[[noreturn]] void bad(const char* code, const std::string& message) {
  throw ApiFailure({400, "invalid_request_error", code, message});
}

}  // namespace

ImageEncoder::ImageEncoder(VlModel model, const TensorView& token_embd, int threads, std::unique_ptr<Device> device,
                           uint64_t budget_bytes)
    : model_(std::move(model)),
      token_embd_(token_embd),
      pool_(threads),
      device_(std::move(device)),
      budget_bytes_(budget_bytes) {
  if (!device_) return;
  device_->vision_kernels(model_.vision.spec.head_dim());  // set up (and warmed) before the arena
  arena_ = device_->allocate_arena(budget_bytes_);
  // Every request copies the tower to the device: pinned once, the copies run at the link's speed.
  // device_ is destroyed (and unpins) before model_.
  pin_vision_matrices(*device_, model_.vision.weights);
}

VisionEncodes ImageEncoder::encodes() const {
  return {device_encodes_.load(), cpu_encodes_.load(), arena_bytes_.load(), arena_ ? budget_bytes_ : 0,
          last_encode_ms_.load()};
}

EncodedPrompt ImageEncoder::encode(const std::vector<int32_t>& ids, const std::vector<ApiImage>& images,
                                   int64_t context) {
  std::lock_guard<std::mutex> lock(mutex_);
  // The prompt's length once expanded: its ids less the placeholders, plus each image's tokens.
  int64_t length = static_cast<int64_t>(ids.size()) - static_cast<int64_t>(images.size());
  EncodedImages encoded;  // pixel values and grids here, the tokens once encoded
  for (size_t i = 0; i < images.size(); ++i) {
    const std::string what = str_cat("image ", i + 1);
    PreprocessedImage p;
    try {
      const std::string& b = images[i].bytes;
      const Image im = decode_image(reinterpret_cast<const uint8_t*>(b.data()), b.size(), what);
      p = preprocess_image(im, model_.processor);
    } catch (const Error& e) {
      bad("invalid_image", str_cat("cannot read the request's ", e.what()));
    }
    length += p.n_merged_tokens();
    if (length > context)
      bad("context_length_exceeded", str_cat("the prompt with its images has more than ", context,
                                             " tokens, the context (the server's --ctx-size per slot); ", what,
                                             " alone gives ", p.n_merged_tokens()));
    encoded.pixel_values.insert(encoded.pixel_values.end(), p.pixel_values.begin(), p.pixel_values.end());
    encoded.grids.push_back({p.grid_t, p.grid_h, p.grid_w});
  }
  encode_preprocessed_images(model_.vision, encoded, pool_, device_.get(), budget_bytes_, arena_);
  if (encoded.device == "cpu") {
    ++cpu_encodes_;
  } else {
    ++device_encodes_;
    arena_bytes_ = encoded.run.plan.arena_bytes;
  }
  last_encode_ms_ = encoded.encode_ms;
  const int64_t H = token_embd_.cols();
  VlInput in;
  try {
    in = build_vl_input(ids, encoded.grids, encoded.tokens.data(), static_cast<int64_t>(encoded.tokens.size()) / H,
                        token_embd_, model_.tokens);
  } catch (const Error& e) {  // e.g. image tokens written in the text as well
    bad("invalid_value", str_cat("the prompt's image placeholders do not match its images: ", e.what()));
  }
  auto image = std::make_shared<ImagePrompt>();
  image->embeddings = std::move(in.embeddings);
  image->pos3.reserve(in.positions.pos.size() * 3);
  for (const auto& p : in.positions.pos) image->pos3.insert(image->pos3.end(), p.begin(), p.end());
  image->delta = in.positions.delta;
  image->first_image_row = static_cast<int64_t>(in.ids.size());
  for (size_t r = 0; r < in.ids.size(); ++r)
    if (in.ids[r] == model_.tokens.image_token_id) {
      image->first_image_row = static_cast<int64_t>(r);
      break;
    }
  return {std::move(in.ids), std::move(image)};
}

}  // namespace shardwise::serve
