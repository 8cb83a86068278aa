"""The compiled module: specs, hardware, plans (checked against `shardwise plan --json`), experiments."""
import json
import os
import subprocess

import pytest

import shardwise
from shardwise import plans


def test_module_loads():
    assert shardwise.HAVE_NATIVE, shardwise._native_error
    assert {"nemo8b", "qwen30b"} <= set(shardwise.builtin_specs())
    assert {"cli1", "cli2", "cli3", "h200-host"} <= set(shardwise.builtin_hardware())
    s = shardwise.load_spec("nemo8b")
    assert s.family == "llama" and s.num_hidden_layers == 40 and s.hidden_size == 4096
    assert 15e9 < s.total_bytes < 17e9
    q = shardwise.weights_spec("synthetic:qwen30b?dtype=q4_0&seed=1")
    assert q.is_moe and q.dtype == "q4_0" and q.num_experts == 128
    hw = shardwise.load_hardware("cli3")
    assert hw.cpu_cores >= 1 and hw.vram_bytes > 0
    assert shardwise.parse_size("4G") == 4 << 30 and shardwise.parse_bandwidth("16GB/s") == 16e9
    with pytest.raises(shardwise.Error, match="nemo9b"):
        shardwise.load_spec("nemo9b")


def test_plan_matches_the_cli():
    spec = shardwise.load_spec("qwen30b").with_dtype("q4_0")
    t = shardwise.plan(spec, "cli3", "4G", ctx=4096, threads=16, pcie_cap="16GB/s")
    assert [e.tokens for e in t.tiers] == shardwise.default_tiers()
    assert t.budget_bytes == 4 << 30 and t.threads == 16 and t.pcie_cap_gbps == pytest.approx(16)
    for e in t.tiers:
        feas = [p for p in e.candidates if p.feasible and p.schedule in ("gpu-only", "static", "dynamic")]
        if feas:
            assert e.chosen == min(feas, key=lambda p: p.predicted_ms).schedule
            assert all(p.vram_bytes <= t.budget_bytes for p in e.candidates)
    pred = plans.predictions(t)
    assert pred.shape == (11, 5)
    assert plans.chosen(t)[1] == t.lookup(1).chosen
    # The same numbers as the CLI.
    out = subprocess.run([os.environ["SHARDWISE_BIN"], "plan", "--model", "synthetic:qwen30b?dtype=q4_0", "--hw", "cli3",
                          "--vram-budget", "4G", "--ctx", "4096", "--threads", "16", "--pcie-cap", "16GB/s", "--json"],
                         capture_output=True, text=True, check=True).stdout
    j = json.loads(out)
    for te, je in zip(t.tiers, j["tiers"]):
        assert te.chosen == je["chosen"]
        for p, c in zip(te.candidates, je["candidates"]):
            assert p.schedule == c["schedule"] and p.feasible == c["feasible"]
            if p.feasible:
                assert p.predicted_ms == pytest.approx(c["predicted_ms"], rel=1e-9)
    assert 0 < shardwise.minimum_budget(spec, "cli3", ctx=4096, threads=16) < 4 << 30
    assert json.loads(t.to_json())["budget_bytes"] == 4 << 30


def test_plan_kv_dtype_f16():
    # An f16 KV cache (the default, as the CLI's) takes half the bytes: the plan table says so, and the
    # executor runs it; f32 stays selectable.
    spec = shardwise.load_spec("nemo8b")
    t = shardwise.plan(spec, "cli3", "4G", ctx=4096, threads=16)
    assert t.kv_dtype == "f16"
    assert shardwise.plan(spec, "cli3", "4G", ctx=4096, threads=16, kv_dtype="f32").kv_dtype == "f32"
    assert spec.kv_bytes_per_token("f16") * 2 == spec.kv_bytes_per_token("f32")
    assert spec.kv_bytes_per_token() == spec.kv_bytes_per_token("f16")


def test_plan_kv_layers():
    # nemo8b at 2G/1K on the GPU host's datasheet: whatever the chosen layout keeps on the host, the
    # 1024-token prefill attends on the GPU (over host caches staged in the arena), never with its core
    # on the CPU; a fixed split of 10 layers keeps exactly those, and Static can run it (their
    # attention is pinned).
    spec = shardwise.load_spec("nemo8b")
    chosen = shardwise.plan(spec, "h200-host", "2G", ctx=1024, threads=16)
    e = chosen.lookup(1024)
    prefill = next(p for p in e.candidates if p.schedule == e.chosen)
    parts = [a["part"] for a in json.loads(prefill.to_json())["actions"] if a["kind"] == "compute"]
    assert "attn_core" not in parts
    assert ("attn_staged" in parts) == (not all(chosen.kv_on_gpu))
    ten = shardwise.plan(spec, "h200-host", "2G", ctx=1024, threads=16, kv_layers=10)
    assert sum(ten.kv_on_gpu) == 10 and ten.kv_on_gpu[:10] == [True] * 10
    assert ten.lookup(1).chosen in ("static", "dynamic", "gpu-only")
    with pytest.raises(shardwise.Error, match="out of range"):
        shardwise.plan(spec, "h200-host", "2G", ctx=1024, threads=16, kv_layers=41)
    # The attention of those 30 host-KV layers in a 1024-token prefill: split costs more than staged.
    def prefill(how):
        t = shardwise.plan(spec, "h200-host", "2G", ctx=1024, threads=16, kv_layers=10, host_kv_attention=how)
        return next(p for p in t.lookup(1024).candidates if p.schedule == "gpu-only").predicted_ms
    assert prefill("staged") < prefill("split")
    with pytest.raises(shardwise.Error, match="host-kv-attention"):
        shardwise.plan(spec, "h200-host", "2G", ctx=1024, threads=16, host_kv_attention="maybe")


def test_plan_with_speculative_expert_prefetch():
    # qwen30b's GPU-only decode at 4G streams its experts: with the next layer's experts guessed (98% right)
    # they are copied a layer early, and the step is predicted faster; the plan's actions say so.
    spec = shardwise.load_spec("qwen30b")
    def gpu_only(hits):
        t = shardwise.plan(spec, "h200-host", "4G", ctx=1024, threads=16, tiers=[1], next_layer_hits=hits)
        return next(p for p in t.lookup(1).candidates if p.schedule == "gpu-only")
    plain, guessed = gpu_only(0.0), gpu_only(0.98)
    assert guessed.predicted_ms < 0.95 * plain.predicted_ms
    acts = json.loads(guessed.to_json())["actions"]
    assert any(a["speculative"] for a in acts) and any(a["part"] == "router_next" for a in acts)
    assert not any(a["speculative"] for a in json.loads(plain.to_json())["actions"])
    with pytest.raises(shardwise.Error, match="next_layer_hits"):
        gpu_only(2.0)


def test_experiment_expansion(repo):
    cfgs = shardwise.expand_experiment(str(repo / "experiments" / "smoke.yaml"))
    assert len(cfgs) > 10 and len({c["config_id"] for c in cfgs}) == len(cfgs)
    c = cfgs[0]
    assert c["config_id"] == shardwise.config_id(c["weights"], c["budget_bytes"], c["ctx"], c["threads"], c["pcie_cap_gbps"] * 1e9)
    assert shardwise.config_id("synthetic:nemo8b?dtype=f16&seed=1", 4 << 30, 4096, 16, 16e9) == "674ca5c8da1d4933"
    eff = json.loads(shardwise.experiment_config(str(repo / "experiments" / "planner_accuracy.yaml")))
    assert eff["tiers"] == [1, 512] and eff["profile"].endswith("h200-host.profile.json")
    assert shardwise.git_rev()
    # A vision encoder experiment: its configurations are images under budgets, not contexts.
    vis = shardwise.expand_experiment(str(repo / "experiments" / "vision_encoder.yaml"))
    eff = json.loads(shardwise.experiment_config(str(repo / "experiments" / "vision_encoder.yaml")))
    assert len(vis) == len(eff["models"]) * len(eff["budgets"]) * len(eff["images"])
    assert {c["image"] for c in vis} == set(eff["images"]) and "ctx" not in vis[0]
    assert (vis[-1]["image_width"], vis[-1]["image_height"]) == tuple(int(x) for x in eff["images"][-1].split("x"))


def test_profile_hash_matches_the_sweep(smoke_results):
    df = shardwise.load_results(smoke_results)
    r = df.iloc[0]
    cap = 0.0 if r["pcie_cap"] == "none" else shardwise.parse_bandwidth(r["pcie_cap"])
    assert shardwise.profile_hash("cli3", cap) == r["profile_hash"]


def test_plan_vision_matches_the_cli(repo):
    vl = str(repo / "tests/fixtures/vl/qwen2_5_vl")
    d = shardwise.plan_vision(vl, ["300x200", "64x300"], "10M", hardware="h200-host")
    out = subprocess.run([os.environ["SHARDWISE_BIN"], "plan", "--model", vl, "--hw", "h200-host", "--vram-budget",
                          "10M", "--image-size", "300x200", "--image-size", "64x300", "--json"],
                         check=True, capture_output=True, text=True).stdout
    cli = json.loads(out)["vision"]
    for key in ("schedule", "patches", "resident_blocks", "arena_bytes", "mlp_chunk", "workspace_bytes"):
        assert d[key] == cli[key], key
    assert d["predicted_ms"] == pytest.approx(cli["predicted_ms"], rel=1e-9)
    assert 0 < d["arena_bytes"] <= 10 << 20
    with pytest.raises(shardwise.Error, match="WIDTHxHEIGHT"):
        shardwise.plan_vision(vl, ["300by200"], "10M", hardware="h200-host")
    with pytest.raises(shardwise.Error, match="needs at least"):
        shardwise.plan_vision(vl, ["300x200"], "1M", hardware="h200-host")
