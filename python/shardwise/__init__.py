"""shardwise from Python: model specs, machines, plan tables and predictions (the compiled part,
``shardwise._native``, built with ``-DSHARDWISE_PYTHON=ON``), and the oracle's results as pandas
DataFrames with the planner-accuracy metrics and plots (pure Python: ``results``, ``metrics``,
``plots``, ``report``).

    import shardwise
    t = shardwise.plan("nemo8b", "cli3", "4G", ctx=4096, threads=16, pcie_cap="16GB/s")
    t = shardwise.plan("nemo8b", budget="4G", profile="h200.profile.json")   # measured cost model
    p = shardwise.load_profile("h200.profile.json")   # fingerprint, counts, fits, ops (lists of dicts)
    shardwise.plans.predictions(t)          # tier x schedule predicted ms
    df = shardwise.load_results("results/planner_accuracy/oracle.jsonl")
    shardwise.metrics.summarize(df)
"""
from . import metrics, results
from .results import load_results, load_sweeps

try:
    from ._native import (  # noqa: F401
        Error, ModelSpec, HardwareSpec, Plan, PlanTable, TierEntry,
        builtin_specs, builtin_hardware, load_spec, weights_spec, load_hardware, parse_size, parse_bandwidth,
        default_tiers, plan, minimum_budget, experiment_config, expand_experiment, config_id, profile_hash, git_rev,
        load_profile,
    )
    from . import plans  # noqa: F401
    HAVE_NATIVE = True
    _native_error = None
except ImportError as _e:  # the pure-Python half (results, metrics, report) works without the build
    HAVE_NATIVE = False
    _native_error = _e

    def __getattr__(name):
        # AttributeError, not ImportError: `from shardwise import plots` asks for the attribute first and
        # imports the submodule only when it is missing.
        raise AttributeError(
            f"shardwise.{name} needs the compiled module shardwise._native ({_native_error}); build with "
            "`make` (or -DSHARDWISE_PYTHON=ON) and put <build>/python on PYTHONPATH, or `make install`")

__all__ = ["load_results", "load_sweeps", "metrics", "results", "HAVE_NATIVE"]
