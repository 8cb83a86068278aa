// cli/verb_info.cpp — `shardwise info MODEL`: the model's shape, parameters and bytes per tensor kind.
#include <sys/stat.h>

#include <cstdio>
#include <map>

#include "cli/common.h"
#include "core/error.h"
#include "core/size.h"

namespace shardwise::cli {
namespace {

struct InfoArgs {
  std::string model;
  bool json = false;
};

void run_info(const InfoArgs& a) {
  std::string origin;
  DType dt;
  bool has_weights;
  std::map<std::string, DType> file_dtypes;
  ModelSpec s = resolve_model_spec(a.model, &origin, &dt, &has_weights, &file_dtypes);
  std::map<std::string, uint64_t> bytes_by_kind, bytes_by_type;
  std::map<std::string, int> tensors_by_type;
  uint64_t attn_shard = 0, ffn_shard = 0, total = 0;
  for (auto t : s.tensors()) {
    const auto f = file_dtypes.find(t.name);  // a file's own types (real files mix them)
    if (f != file_dtypes.end() && f->second != t.dtype) {
      t.bytes = t.bytes / dtype_row_bytes(t.dtype, t.shape.back()) * dtype_row_bytes(f->second, t.shape.back());
      t.dtype = f->second;
    }
    bytes_by_type[dtype_name(t.dtype)] += t.bytes;
    ++tensors_by_type[dtype_name(t.dtype)];
    total += t.bytes;
    bytes_by_kind[tensor_kind_name(t.kind)] += t.bytes;
    if (t.layer == 0) {
      const bool ffn = t.kind == TensorKind::FfnNorm || t.kind == TensorKind::FfnGate || t.kind == TensorKind::FfnUp ||
                       t.kind == TensorKind::FfnDown || t.kind == TensorKind::MoeGate || t.kind == TensorKind::MoeUp ||
                       t.kind == TensorKind::MoeDown;
      (ffn ? ffn_shard : attn_shard) += t.bytes;
    }
  }
  if (a.json) {
    nlohmann::json j;
    j["model"] = origin;
    j["name"] = s.name;
    j["family"] = family_name(s.family);
    j["dtype"] = dtype_name(s.dtype);
    j["hidden_size"] = s.hidden_size;
    j["num_hidden_layers"] = s.num_hidden_layers;
    j["num_attention_heads"] = s.num_attention_heads;
    j["num_key_value_heads"] = s.num_key_value_heads;
    j["head_dim"] = s.head_dim;
    j["intermediate_size"] = s.intermediate_size;
    j["vocab_size"] = s.vocab_size;
    if (s.is_moe()) {
      j["num_experts"] = s.num_experts;
      j["num_experts_per_tok"] = s.num_experts_per_tok;
      j["moe_intermediate_size"] = s.moe_intermediate_size;
      j["norm_topk_prob"] = s.norm_topk_prob;
    }
    j["tie_word_embeddings"] = s.tie_word_embeddings;
    j["rope_theta"] = s.rope_theta;
    j["n_params"] = s.n_params();
    j["total_bytes"] = total;
    j["bytes_by_type"] = bytes_by_type;
    j["tensors_by_type"] = tensors_by_type;
    j["bytes_by_kind"] = bytes_by_kind;
    j["layer0_attention_bytes"] = attn_shard;
    j["layer0_ffn_bytes"] = ffn_shard;
    j["kv_bytes_per_token_f32"] = s.kv_bytes_per_token(DType::F32);
    j["kv_bytes_per_token_f16"] = s.kv_bytes_per_token(DType::F16);
    print_json(j);
    return;
  }
  std::printf("model      %s\n", origin.c_str());
  std::printf("family     %s (%s)\n", family_name(s.family), s.name.c_str());
  std::printf("dtype      %s\n", dtype_name(s.dtype));
  std::printf("shape      %lld layers, hidden %lld, heads %lld/%lld kv, head_dim %lld, vocab %lld\n",
              (long long)s.num_hidden_layers, (long long)s.hidden_size, (long long)s.num_attention_heads,
              (long long)s.num_key_value_heads, (long long)s.head_dim, (long long)s.vocab_size);
  if (s.is_moe())
    std::printf("experts    %lld (top %lld%s), expert FFN %lld\n", (long long)s.num_experts,
                (long long)s.num_experts_per_tok, s.norm_topk_prob ? ", renormalised" : "",
                (long long)s.moe_intermediate_size);
  else
    std::printf("ffn        %lld\n", (long long)s.intermediate_size);
  const double params = static_cast<double>(s.n_params());
  std::printf("params     %.3f %s%s\n", params >= 1e9 ? params / 1e9 : params / 1e6, params >= 1e9 ? "B" : "M",
              s.tie_word_embeddings ? " (tied embeddings)" : "");
  std::printf("bytes      %s (%llu)\n", format_bytes(total).c_str(), (unsigned long long)total);
  std::string types;
  for (const auto& kv : bytes_by_type)
    types += (types.empty() ? "" : ", ") + kv.first + " " + std::to_string(tensors_by_type[kv.first]) + " tensors " +
             format_bytes(kv.second);
  std::printf("types      %s\n", types.c_str());
  std::printf("per layer  attention shard %s, FFN shard %s\n", format_bytes(attn_shard).c_str(),
              format_bytes(ffn_shard).c_str());
  // q8_0 where the head_dim allows it (whole blocks of 32 per head).
  const std::string q8 =
      s.head_dim % kQK8_0 == 0 ? ", " + format_bytes(s.kv_bytes_per_token(DType::Q8_0)) + " (q8_0)" : "";
  std::printf("KV/token   %s (f32), %s (f16)%s\n", format_bytes(s.kv_bytes_per_token(DType::F32)).c_str(),
              format_bytes(s.kv_bytes_per_token(DType::F16)).c_str(), q8.c_str());
  std::printf("by kind:\n");
  for (const auto& kv : bytes_by_kind) std::printf("  %-16s %12s\n", kv.first.c_str(), format_bytes(kv.second).c_str());
}

}  // namespace

void register_info(CLI::App& app) {
  auto a = std::make_shared<InfoArgs>();
  CLI::App* sub = app.add_subcommand("info", "Show a model's shape, parameters and bytes per tensor kind");
  sub->add_option("model", a->model, "A .gguf file, an HF directory, synthetic:SPEC, or a builtin spec name")
      ->required();
  sub->add_flag("--json", a->json, "Print one JSON object");
  sub->callback([a] { run_info(*a); });
}

}  // namespace shardwise::cli
