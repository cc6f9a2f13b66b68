"""What every ``bitfold`` command does with input it cannot use: one message, no traceback.

Unknown flags get the subcommand's own usage; a closed stdout ends the
command quietly; Ctrl-C ends it with status 130 and one line, also when the
interrupt lands inside a C callback (where Python would drop it).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from bitfold import cli

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def ctrl_c_as_a_terminal_gives_it():
    """Ctrl-C raises KeyboardInterrupt here and in the processes started from here, as in a
    shell. A library run earlier in this test process (a compile worker's initialiser) may
    have left SIGINT ignored, which started processes inherit; the test sets it itself."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    return env


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_an_unknown_flag_shows_the_subcommands_usage(command, tmp_path, capsys):
    extra = {"diff": ["a.jsonl", "b.jsonl"], "digest": ["x.npz"]}.get(command, [])
    with pytest.raises(SystemExit) as exit_info:
        cli.main([command, *extra, "--bogus"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: bitfold {command} ")
    assert f"bitfold {command}: error: unrecognized arguments: --bogus" in err
    assert "Traceback" not in err


def test_an_unknown_command_lists_the_commands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bogus"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'bogus'" in err and "digest" in err and "probe" in err


def test_a_closed_stdout_ends_the_command_quietly(tmp_path):
    np.savez(tmp_path / "w.npz", w=np.ones(3))
    files = [str(tmp_path / "w.npz")] * 2000  # more output than a pipe holds
    proc = subprocess.Popen([sys.executable, "-m", "bitfold", "digest", *files],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())  # fmt: skip
    proc.stdout.readline()
    proc.stdout.close()  # the reader goes away, as `bitfold digest ... | head -1` does
    err = proc.stderr.read().decode()
    proc.wait(timeout=120)
    assert proc.returncode == 141
    assert "Traceback" not in err and "BrokenPipeError" not in err


@pytest.mark.usefixtures("ctrl_c_as_a_terminal_gives_it")
def test_ctrl_c_ends_a_command_with_one_line(tmp_path):
    """SIGINT to the whole process group, as a terminal's Ctrl-C sends it, in mid-training."""
    argv = [sys.executable, "-m", "bitfold", "probe", "--D", "8", "--hid", "16", "--K", "5",
            "--reps", "1", "--steps", "100000000", "--batch", "4", "--no-torch"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(),
                            start_new_session=True)  # fmt: skip
    try:
        time.sleep(6)  # past the imports: the training runs of question 4 are under way
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # not interrupted: its 10^8 steps must not outlive the test
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = (out + err).decode()
    assert proc.returncode == 130, text[-2000:]
    assert err.decode().strip().splitlines()[-1] == "bitfold probe: interrupted"
    assert "Traceback" not in text


@pytest.mark.usefixtures("ctrl_c_as_a_terminal_gives_it")
def test_an_interrupt_dropped_in_a_c_callback_is_raised_again():
    """Numba's compiler calls Python back through ctypes; a Ctrl-C there must still stop us."""

    def callback() -> None:
        raise KeyboardInterrupt

    call = ctypes.CFUNCTYPE(None)(callback)
    before = sys.unraisablehook
    with pytest.raises(KeyboardInterrupt), cli._interrupts_reach_main():
        call()  # Python drops the interrupt here ("Exception ignored ...")
        deadline = time.monotonic() + 10  # and it arrives again, a moment later (between two
        while time.monotonic() < deadline:  # short sleeps: it wakes no sleep, as no signal does)
            time.sleep(0.01)
    assert sys.unraisablehook is before
