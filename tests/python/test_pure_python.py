"""The package without its compiled part (the source tree's python/shardwise alone): the pure-Python
modules import and work, and only the names that need shardwise._native fail, when called, with an
ImportError that says what is missing and what to do. With the compiled part (PYTHONPATH=<build>/python),
the same submodules load on first use."""
import os
import shutil
import subprocess
import sys
import textwrap

from conftest import REPO, known_rows


def run_python(code, pythonpath, cwd):
    env = dict(os.environ, PYTHONPATH=str(pythonpath), MPLBACKEND="Agg")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def pure_package(tmp_path):
    """A copy of the source tree's package: the .py files, no compiled module."""
    dest = tmp_path / "pkg" / "shardwise"
    shutil.copytree(REPO / "python" / "shardwise", dest, ignore=shutil.ignore_patterns("_native*", "__pycache__"))
    return dest.parent


def test_pure_python_modules_import_without_the_compiled_module(tmp_path):
    import json
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in known_rows()))
    r = run_python(f"""
        import sys
        import shardwise
        assert not shardwise.HAVE_NATIVE
        assert "matplotlib" not in sys.modules, "import shardwise loads matplotlib"
        from shardwise import plots, report, metrics, results, plans      # the pure-Python modules
        import shardwise.plots, shardwise.report
        assert shardwise.plots is plots and shardwise.plans is plans
        df = shardwise.load_results({str(rows)!r})
        s = metrics.summarize(df)
        assert s["decisions"] == 5, s["decisions"]
        out = report.build_report(df, {str(tmp_path / "report")!r})
        print("report:", out)
        """, pure_package(tmp_path), tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "report" / "report.md").stat().st_size > 0


def test_names_that_need_the_compiled_module_fail_clearly_when_called(tmp_path):
    r = run_python("""
        import shardwise
        from shardwise import plan, parse_size, Error       # importable: stand-ins
        for f, args in [(plan, ("nemo8b", "cli3", "4G")), (parse_size, ("4G",)), (shardwise.load_spec, ("nemo8b",))]:
            try:
                f(*args)
            except ImportError as e:
                msg = str(e)
                assert msg.startswith(f"shardwise.{f.__name__} needs the compiled module shardwise._native"), msg
                assert "make" in msg and "PYTHONPATH" in msg, msg
            else:
                raise AssertionError(f"{f.__name__} ran without the compiled module")
        assert issubclass(Error, Exception)
        try:
            raise Error("x")
        except shardwise.Error:
            pass
        try:
            shardwise.no_such_name
        except AttributeError as e:
            assert "no_such_name" in str(e) and "_native" not in str(e), str(e)
        else:
            raise AssertionError("an unknown name did not raise AttributeError")
        print("ok")
        """, pure_package(tmp_path), tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_compiled_module_for_another_python_is_named(tmp_path):
    pkg = pure_package(tmp_path)
    (pkg / "shardwise" / "_native.cpython-29-x86_64-linux-gnu.so").write_bytes(b"")
    r = run_python("""
        import shardwise
        try:
            shardwise.plan("nemo8b")
        except ImportError as e:
            print(e)
        """, pkg, tmp_path)
    assert r.returncode == 0, r.stderr
    assert "_native.cpython-29-x86_64-linux-gnu.so" in r.stdout and "built for another Python" in r.stdout, r.stdout


def test_submodules_load_on_first_use_with_the_compiled_module():
    import shardwise
    if not shardwise.HAVE_NATIVE:
        import pytest
        pytest.skip("no compiled module on PYTHONPATH")
    assert shardwise.plots.__name__ == "shardwise.plots"
    assert shardwise.plans.__name__ == "shardwise.plans"
    assert shardwise.parse_size("4G") == 4 << 30
