"""Progress bars on a terminal (run under a pseudo-terminal): none for work under a second, none when
stderr is not a terminal, and a log line never lands on a bar (the bar is cleared before it and drawn
again after). Runs the binary ($SHARDWISE_BIN): `synth` and the smoke sweep on the emulated device."""
import os
import pty
import re
import subprocess
import time

import pytest

BAR = re.compile(r"\[[#.]{30}\]")
ELAPSED = re.compile(r"\[[#.]{30}\] +[0-9.]+%  ([0-9.]+) ?s elapsed")


def binary():
    b = os.environ.get("SHARDWISE_BIN")
    if not b or not os.path.exists(b):
        pytest.skip("no shardwise binary ($SHARDWISE_BIN; CTest sets it)")
    return b


def run_on_terminal(args, cwd):
    """Runs args with stderr on a pseudo-terminal; returns (exit code, what stderr received)."""
    leader, follower = pty.openpty()
    p = subprocess.Popen(args, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=follower)
    os.close(follower)
    out = b""
    deadline = time.time() + 300
    while time.time() < deadline:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    return p.wait(timeout=60), out.decode("utf-8", errors="replace")


def screen_lines(stream):
    """The lines a terminal shows for stream: '\\r' returns to column 0, ESC[K clears to the line's end,
    '\\n' ends the line, other characters overwrite. The last, unfinished line is included."""
    lines, cur, col, i = [], [], 0, 0
    while i < len(stream):
        if stream.startswith("\x1b[K", i):
            del cur[col:]
            i += 3
            continue
        c = stream[i]
        i += 1
        if c == "\r":
            col = 0
        elif c == "\n":
            lines.append("".join(cur).rstrip())
            cur, col = [], 0
        else:
            if col < len(cur):
                cur[col] = c
            else:
                cur.append(c)
            col += 1
    lines.append("".join(cur).rstrip())
    return lines


def test_the_emulated_terminal():
    assert screen_lines("a\r\x1b[Kbar [" + "#" * 30 + "]\r\x1b[Klog\nbar") == ["log", "bar"]
    assert screen_lines("bar\rlog line\n") == ["log line", ""]
    assert screen_lines("bar [x]log\n") == ["bar [x]log", ""]


def test_a_log_line_never_lands_on_a_bar(tmp_path):
    repo = os.environ.get("SHARDWISE_REPO", os.path.join(os.path.dirname(__file__), "..", ".."))
    rc, err = run_on_terminal([binary(), "sweep", os.path.join(repo, "experiments", "smoke.yaml"), "--device", "emu",
                               "--out", str(tmp_path / "smoke.jsonl")], tmp_path)
    assert rc == 0, err[-2000:]
    drawn = ELAPSED.findall(err)
    assert drawn, "the sweep (seconds of work) drew no progress bar on a terminal:\n" + err[-2000:]
    assert min(float(s) for s in drawn) >= 1.0, f"a bar was drawn before a second of work: {sorted(drawn)[:3]}"
    lines = screen_lines(err)
    assert any(line.startswith("loaded ") for line in lines), "expected the sweep's log lines"
    for line in lines:
        if BAR.search(line):
            # Only a bar (the final one stays, on a line of its own): nothing before it but its label, nothing
            # after its numbers.
            assert re.fullmatch(r"sweep \[[#.]{30}\] +[0-9.]+%  [0-9.]+ s( elapsed, ETA [0-9.]+ s)?", line), line


def test_no_bar_for_work_under_a_second(tmp_path):
    t0 = time.time()
    rc, err = run_on_terminal([binary(), "synth", "--spec", "tiny_llama", "--dtype", "f32", "--seed", "1",
                               "-o", str(tmp_path / "tiny.gguf")], tmp_path)
    assert rc == 0, err
    if time.time() - t0 > 0.9:
        pytest.skip("synth of tiny_llama took a second here: not a sub-second case")
    assert not BAR.search(err), repr(err)


def test_no_bar_off_a_terminal(tmp_path):
    # small_llama takes seconds: on a terminal it draws a bar; into a pipe, none.
    r = subprocess.run([binary(), "synth", "--spec", "small_llama", "--dtype", "q8_0", "--seed", "1",
                        "-o", str(tmp_path / "small.gguf")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert not BAR.search(r.stderr) and "\r" not in r.stderr, repr(r.stderr)
