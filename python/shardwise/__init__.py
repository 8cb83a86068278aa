"""shardwise from Python: model specs, machines, plan tables and predictions (the compiled part,
``shardwise._native``, built with ``-DSHARDWISE_PYTHON=ON``), and the oracle's results as pandas
DataFrames with the planner-accuracy metrics and plots (pure Python: ``results``, ``metrics``,
``plots``, ``report``, ``plans``).

    import shardwise
    t = shardwise.plan("nemo8b", "cli3", "4G", ctx=4096, threads=16, pcie_cap="16GB/s")
    t = shardwise.plan("nemo8b", budget="4G", profile="h200.profile.json")   # measured cost model
    p = shardwise.load_profile("h200.profile.json")   # fingerprint, counts, fits, ops (lists of dicts)
    shardwise.plans.predictions(t)          # tier x schedule predicted ms
    df = shardwise.load_results("results/planner_accuracy/oracle.jsonl")
    shardwise.metrics.summarize(df)

Without the compiled part (the source tree's python/ folder, or another Python than the one it was
built for) the pure-Python modules still import and work; each name of the compiled part is then a
stand-in that raises ImportError, saying why, when it is called (``HAVE_NATIVE`` is False).
"""
import glob
import importlib
import importlib.machinery
import os
import sys

from . import metrics, results
from .results import load_results, load_sweeps

# The names the compiled part provides.
_NATIVE_NAMES = (
    "Error", "ModelSpec", "HardwareSpec", "Plan", "PlanTable", "TierEntry",
    "builtin_specs", "builtin_hardware", "load_spec", "weights_spec", "load_hardware", "parse_size", "parse_bandwidth",
    "default_tiers", "plan", "plan_vision", "minimum_budget", "experiment_config", "expand_experiment", "config_id", "profile_hash",
    "git_rev", "load_profile",
)
# Pure-Python submodules imported on first use (plots and report load matplotlib; report selects its
# file-only backend), so `import shardwise` stays light and `shardwise.plots` works without an import.
_LAZY_SUBMODULES = ("plots", "report", "plans")

try:
    _native = importlib.import_module(f"{__name__}._native")
    HAVE_NATIVE = True
    _native_error = None
except ImportError as _e:
    _native = None
    HAVE_NATIVE = False
    _native_error = _e


def _native_missing_message(name):
    here = os.path.dirname(os.path.abspath(__file__))
    built = sorted(os.path.basename(p) for p in glob.glob(os.path.join(here, "_native*.so")))
    python = f"{sys.executable} (Python {sys.version_info[0]}.{sys.version_info[1]})"
    loadable = {"_native" + suffix for suffix in importlib.machinery.EXTENSION_SUFFIXES}  # names this Python loads
    if built and not loadable.intersection(built):
        why = (f"{', '.join(built)} in {here} was built for another Python than {python}; run that one "
               "(`make` builds it for /usr/bin/python3, Debian's, which has numpy, pandas and matplotlib)")
    elif built:  # this Python's, yet it does not load (a library it links is missing, ...)
        why = f"{', '.join(built)} in {here} does not load in {python}: {_native_error}"
    else:
        why = (f"there is none in {here} ({_native_error}). Build it with `make` and put build/python on "
               "PYTHONPATH, or `make install` (it prints what to set)")
    return f"shardwise.{name} needs the compiled module shardwise._native: {why}"


def _stand_in(name):
    def missing(*args, **kwargs):
        raise ImportError(_native_missing_message(name)) from _native_error
    missing.__name__ = missing.__qualname__ = name
    missing.__doc__ = f"Stands in for shardwise.{name}, which needs the compiled module (HAVE_NATIVE is False)."
    return missing


if HAVE_NATIVE:
    globals().update({n: getattr(_native, n) for n in _NATIVE_NAMES})
else:
    class Error(Exception):
        """The compiled module's error type; never raised without it (here so `except shardwise.Error` works)."""

    globals().update({n: _stand_in(n) for n in _NATIVE_NAMES if n != "Error"})


def __getattr__(name):
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY_SUBMODULES))


# Not plots or report: `from shardwise import *` would load matplotlib and, for report, its file-only backend.
__all__ = ["load_results", "load_sweeps", "metrics", "results", "plans", "HAVE_NATIVE", *_NATIVE_NAMES]
