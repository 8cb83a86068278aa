// executor/traits.h — this executor's facts that plans depend on (planner/executor_traits.h), for
// whoever plans for it: the caller fills PlannerConfig::executor with executor_traits(spec, ...) and
// the planner reads them as plain data, so the planner never copies what the executor does.
#pragma once

#include <cstdint>

#include "core/model_spec.h"
#include "planner/executor_traits.h"

namespace shardwise {

// The CUDA attention block projects Q, K and V as one batched GEMV for steps of at most this many
// tokens when the three weights share a dtype (executor/cuda/blocks.cu: attention_pre).
constexpr int64_t kGpuFusedQkvMaxTokens = 8;
// Steps of at most this many tokens may route an MoE layer on the device (DeviceKernels::ffn_routed),
// where the plan copies no router logits for the layer (runtime.cpp).
constexpr int64_t kDeviceRoutingMaxTokens = 8;

// The traits of this executor for `spec`'s model. expert_copies: the copies one streamed routed expert
// takes as the weights lie (runtime.h: expert_copies_of, synthetic_expert_copies); 3 without experts.
// sequences: the most sequences one step runs (RuntimeOptions::slots).
ExecutorTraits executor_traits(const ModelSpec& spec, int expert_copies = 3, int sequences = 1);

}  // namespace shardwise
