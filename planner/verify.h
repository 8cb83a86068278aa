// planner/verify.h — the rules every plan the executor runs keeps, checked in one place for the
// planner's own tables (build_plan_table verifies what it returns) and for tables read from a file
// (`run --plan`, checked against the model before any step): a plan that breaks one would run and
// print wrong tokens (two regions sharing VRAM, a layer never computed, a slot overwritten while a
// kernel reads it), so each is an Error naming the plan and the rule.
//
// A feasible plan:
//  - fits its budget: every arena region inside it, and the regions (pinned, slot0, slot1, scratch,
//    kv staging, kv: each at most once, scratch required) pairwise disjoint — all are live for the
//    whole step;
//  - places every shard once, by id, with the model's bytes: pinned weights inside "pinned", pinned
//    KV caches inside "kv" (exactly the layers kv_on_gpu names), no two pinned ranges overlapping,
//    streamed shards at a stream slot's offset, GPU shards pinned or streamed;
//  - computes the model once, in order: the embedding, then per layer its attention (whole, staged, or
//    pre/core/post) and its FFN (whole, or an MoE layer's CPU share, GPU share and their sum), then the
//    LM head (whole, or row pieces covering the vocabulary once), each on the device its placement
//    and part name; each step after the last one's result (dependencies and queue order), with the
//    residual stream copied between host and GPU where consecutive steps run on different sides; the
//    logits copied to the host when the LM head runs on the GPU;
//  - uses each stream slot safely: a compute reads the shard last copied into its slot, after that
//    copy; a copy of another shard into a slot waits for every compute that read the slot before.
// A table: a budget of at most kMaxVramBudget, ascending tiers, a chosen plan that is feasible, tiers
// running as chunks of smaller tiers, and one KV layout across the plans that run together (the chosen
// ones, and all of one schedule: switching plans never moves a cache).
#pragma once

#include <cstdint>
#include <string>

#include "core/model_spec.h"
#include "planner/plan.h"
#include "planner/shard_layout.h"

namespace shardwise {

// Throws Error "<where>: <rule broken>". `budget` is the table's; `shards` made for the table's ctx.
void verify_plan(const Plan& plan, const ModelSpec& spec, const ShardSet& shards, uint64_t budget,
                 const std::string& where);
// Every feasible candidate, and the table's own rules. `where` names the table (its file).
void verify_plan_table(const PlanTable& table, const ModelSpec& spec, const ShardSet& shards, const std::string& where);

}  // namespace shardwise
