// text/chat_template.cpp — the three built-in chat formats (see chat_template.h).
#include "text/chat_template.h"

#include "core/error.h"
#include "text/tokenizer.h"

namespace shardwise {

const char* chat_format_name(ChatFormat f) {
  switch (f) {
    case ChatFormat::ChatML:
      return "ChatML";
    case ChatFormat::Llama3:
      return "Llama-3";
    case ChatFormat::Mistral:
      return "Mistral [INST]";
  }
  return "?";
}

ChatChoice choose_chat_format(const std::string& file_template, Family family, const Tokenizer& tok) {
  if (file_template.find("<|im_start|>") != std::string::npos)
    return {ChatFormat::ChatML, true, "chat template: ChatML (the file's template)"};
  if (file_template.find("<|start_header_id|>") != std::string::npos)
    return {ChatFormat::Llama3, true, "chat template: Llama-3 (the file's template)"};
  if (file_template.find("[INST]") != std::string::npos)
    return {ChatFormat::Mistral, true, "chat template: Mistral [INST] (the file's template)"};
  ChatFormat f;
  if (family == Family::Qwen3 || family == Family::Qwen3Moe || family == Family::Qwen2)
    f = ChatFormat::ChatML;
  else if (tok.find_token("<|start_header_id|>") >= 0)
    f = ChatFormat::Llama3;
  else
    f = ChatFormat::Mistral;
  const std::string why =
      file_template.empty()
          ? "the file has no chat template"
          : "the file's chat template is not one we recognise (no <|im_start|>, <|start_header_id|> or [INST])";
  return {
      f, false,
      str_cat("chat template: built-in ", chat_format_name(f), " for a ", family_name(family), " model (", why, ")")};
}

std::string apply_chat_template(ChatFormat format, const std::vector<ChatMessage>& messages) {
  for (const auto& m : messages)
    if (m.role != "system" && m.role != "user" && m.role != "assistant")
      fail("chat message role '", m.role, "' is not one of system, user, assistant");
  std::string out;
  switch (format) {
    case ChatFormat::ChatML:
      for (const auto& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      out += "<|im_start|>assistant\n";
      break;
    case ChatFormat::Llama3:
      for (const auto& m : messages)
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + m.content + "<|eot_id|>";
      out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
    case ChatFormat::Mistral: {
      // Mistral's template has no system turn: the system text opens the first user turn.
      std::string system;
      for (const auto& m : messages) {
        if (m.role == "system") {
          system += (system.empty() ? "" : "\n\n") + m.content;
        } else if (m.role == "user") {
          out += "[INST] " + (system.empty() ? m.content : system + "\n\n" + m.content) + " [/INST]";
          system.clear();
        } else {
          out += " " + m.content + "</s>";
        }
      }
      break;
    }
  }
  return out;
}

std::string vl_image_placeholder(const Tokenizer& tok, int32_t vision_start_token_id, int32_t image_token_id) {
  const int32_t end = tok.find_token("<|vision_end|>");
  return tok.token_text(vision_start_token_id) + tok.token_text(image_token_id) + (end >= 0 ? tok.token_text(end) : "");
}

void add_vl_default_system(std::vector<ChatMessage>& messages) {
  if (messages.empty() || messages.front().role != "system")
    messages.insert(messages.begin(), ChatMessage{"system", "You are a helpful assistant."});
}

}  // namespace shardwise
