// text/chat_template.h — chat prompts for the families we run, without a Jinja engine.
// A file's template is recognised by its markers ("<|im_start|>" -> ChatML, "<|start_header_id|>"
// -> Llama-3, "[INST]" -> Mistral); with no template, or one we do not recognise, a built-in one is
// chosen by family (Llama-3 for llama models with a Llama-3 vocabulary, ChatML for qwen3 and
// qwen3_moe, Mistral [INST] otherwise) and the choice says so.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/model_spec.h"

namespace shardwise {

class Tokenizer;

enum class ChatFormat { ChatML, Llama3, Mistral };
const char* chat_format_name(ChatFormat f);  // "ChatML", "Llama-3", "Mistral [INST]"

struct ChatChoice {
  ChatFormat format;
  bool from_file;    // the file's own template was recognised
  std::string note;  // one line for the user: which template and why
};

ChatChoice choose_chat_format(const std::string& file_template, Family family, const Tokenizer& tokenizer);

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

// The prompt text for `messages`, ending where the assistant's reply starts. BOS is not written:
// encode(text, add_special = true) adds it when the model asks for it.
std::string apply_chat_template(ChatFormat format, const std::vector<ChatMessage>& messages);

// Qwen2-VL's chat template for messages with images (what `run --image` and `serve` write): the text that
// stands for one image in a message, its vision-start, image and vision-end tokens as their vocabulary
// strings (piece() writes control tokens as nothing; the vision-end token is left out when the vocabulary
// has no "<|vision_end|>"); the text is encoded with control tokens parsed.
std::string vl_image_placeholder(const Tokenizer& tok, int32_t vision_start_token_id, int32_t image_token_id);
// The system message that template adds when the conversation starts without one.
void add_vl_default_system(std::vector<ChatMessage>& messages);

}  // namespace shardwise
