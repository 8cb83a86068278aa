#!/usr/bin/env python3
"""The module rules of docs/DESIGN.md §3, checked on the include graph: each file of a module includes
(with #include "...") only headers of its own module and of the modules it may use. The planner's
contract (the plan, shard layouts, the executor's traits, the plan rules) is a module of its own that
depends on core only, so that the executor, which may use the contract, never reaches the cost model,
not even through a planner header; that is also checked on the transitive closure, by name.
usage: check_includes.py [REPO]   (exit 1 naming each include that breaks a rule)
       check_includes.py --self-test (a tree with known violations must be refused, a clean one kept)"""
import os
import re
import sys
import tempfile

EXTS = (".h", ".cpp", ".cu", ".cuh")
# The planner's contract: what the executor may read of the planner.
CONTRACT = {"planner/plan.h", "planner/plan.cpp", "planner/shard_layout.h", "planner/shard_layout.cpp",
            "planner/executor_traits.h", "planner/verify.h", "planner/verify.cpp"}
# Module -> the modules its files may include (besides its own). Modules not listed (cli, python,
# tests, dev, ...) may include everything.
RULES = {
    "core": set(),
    "costmodel": {"core"},
    "plan": {"core"},
    "planner": {"core", "costmodel", "plan"},
    "text": {"core"},
    "executor": {"core", "plan"},
    "vision": {"core", "plan", "executor"},
    "microbench": {"core", "costmodel", "plan", "executor"},
    "engine": {"core", "costmodel", "plan", "planner", "executor", "vision"},
    "oracle": {"core", "costmodel", "plan", "planner", "executor", "engine", "text", "vision"},
    "serve": {"core", "plan", "executor", "text", "vision"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def module_of(rel):
    if rel in CONTRACT:
        return "plan"
    return rel.split("/", 1)[0] if "/" in rel else ""


def violations(repo):
    """Each include of `repo` that breaks a rule, as one line."""
    includes = {}  # file (relative to the repo) -> the repo files it includes
    for top in RULES:
        for root, _, files in os.walk(os.path.join(repo, top)):
            for f in files:
                if f.endswith(EXTS):
                    path = os.path.join(root, f)
                    rel = os.path.relpath(path, repo)
                    text = open(path, encoding="utf-8", errors="replace").read()
                    includes[rel] = [i for i in INCLUDE.findall(text) if os.path.isfile(os.path.join(repo, i))]
    bad = []
    for rel, incs in sorted(includes.items()):
        mod = module_of(rel)
        for inc in incs:
            target = module_of(inc)
            if target != mod and target not in RULES[mod]:
                bad.append(f"{rel}: includes {inc} ({mod} may use {', '.join(sorted(RULES[mod])) or 'nothing of ours'})")
    # The executor never reaches the cost model, however deep.
    for rel in sorted(r for r in includes if module_of(r) == "executor"):
        seen, stack = set(), [(rel, [rel])]
        while stack:
            f, chain = stack.pop()
            for inc in includes.get(f, []):
                if inc in seen:
                    continue
                seen.add(inc)
                if inc.startswith("costmodel/"):
                    bad.append(f"{rel}: reaches the cost model: {' -> '.join(chain + [inc])}")
                stack.append((inc, chain + [inc]))
    return bad, len(includes)


def self_test():
    """The checker itself: a clean tree passes, and each kind of violation is named."""
    files = {
        "core/a.h": "",
        "costmodel/cost_model.h": '#include "core/a.h"\n',
        "planner/plan.h": '#include "core/a.h"\n',
        "planner/shard_ops.h": '#include "costmodel/cost_model.h"\n#include "planner/plan.h"\n',
        "executor/ok.cpp": '#include "planner/plan.h"\n#include "core/a.h"\n',
    }
    bad_files = {
        "executor/direct.cpp": '#include "costmodel/cost_model.h"\n',  # the cost model itself
        "executor/ops.cpp": '#include "planner/shard_ops.h"\n',  # the planner proper (and through it the cost model)
        "planner/plan.cpp": '#include "costmodel/cost_model.h"\n',  # the contract reaching past core
    }
    def run(tree):
        with tempfile.TemporaryDirectory() as d:
            for rel, text in tree.items():
                os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
                with open(os.path.join(d, rel), "w") as f:
                    f.write(text)
            return violations(d)[0]
    ok = run(files) == []
    bad = run({**files, **bad_files})
    for line in bad:
        print("found:", line)
    expected = ["executor/direct.cpp: includes costmodel/cost_model.h", "executor/direct.cpp: reaches the cost model",
                "executor/ops.cpp: includes planner/shard_ops.h", "executor/ops.cpp: reaches the cost model",
                "planner/plan.cpp: includes costmodel/cost_model.h"]
    missed = [e for e in expected if not any(line.startswith(e) for line in bad)]
    for e in missed:
        print("missed:", e)
    if not ok:
        print("a clean tree was refused")
    return 0 if ok and not missed else 1


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    repo = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
    bad, n_files = violations(repo)
    for line in bad:
        print(line)
    if bad:
        print(f"{len(bad)} include(s) break the module rules (docs/DESIGN.md §3)")
        return 1
    print(f"module rules kept: {n_files} files of {', '.join(RULES)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
