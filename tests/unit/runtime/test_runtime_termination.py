"""The runtime's one-line fatal error in the termination log: what the pod's status shows
(``lastState.terminated.message``), never its log or its arguments."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from kubeinfer.runtime import cli
from kubeinfer.runtime.termination import MAX_CHARS, write_termination_message


@pytest.fixture
def termination_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "termination-log"
    path.write_text("")  # the kubelet creates the file; the runtime only writes an existing one
    monkeypatch.setenv("KUBEINFER_TERMINATION_LOG", str(path))
    return path


def test_one_line_at_most_max_chars_only_where_the_file_exists(
    termination_log: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_termination_message("model load failed:\n  FileNotFoundError: x" + "y" * 5000)
    text = termination_log.read_text()
    assert text.startswith("model load failed: FileNotFoundError: xyyy") and text.count("\n") == 1
    assert len(text) == MAX_CHARS + 1
    missing = tmp_path / "absent"
    monkeypatch.setenv("KUBEINFER_TERMINATION_LOG", str(missing))
    write_termination_message("nothing to write to")
    assert not missing.exists()  # outside a container: no file made


def test_bad_arguments_never_repeat_what_was_passed(termination_log: Path) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["serve", "--leak-hunter2-password"])
    assert info.value.code == 2
    message = termination_log.read_text()
    assert "invalid command-line arguments" in message and "hunter2" not in message


def test_an_invalid_configuration_is_the_message(termination_log: Path, tmp_path: Path) -> None:
    bad = tmp_path / "runtime.yaml"
    bad.write_text("batching:\n  max_batch_size: 0\n")
    assert cli.main(["serve", "--config", str(bad)]) == 2
    assert termination_log.read_text().startswith("invalid configuration: ")
    assert "max_batch_size" in termination_log.read_text()


def test_a_model_that_fails_to_load_is_the_message_and_exit_1(termination_log: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "runtime.yaml"
    cfg.write_text(f"model:\n  name: nope\n  source: {tmp_path / 'no-such-model'}\n")
    env = {"KUBEINFER_TERMINATION_LOG": str(termination_log), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kubeinfer.runtime.cli",
            "serve",
            "--config",
            str(cfg),
            "--port",
            "0",
            "--grpc-port",
            "0",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    message = termination_log.read_text()
    assert message.startswith("model load failed: ") and "no-such-model" in message, message
