"""bench/quiet.py: the machine-wide bench lock, the load check and what they record in a result.

Every test uses a lock file under its own tmp_path and an injected load reading: none depends on
the machine's load or touches the real lock a benchmark may be holding."""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.bench import BENCH, load_bench

quiet = load_bench("quiet")


@pytest.fixture(autouse=True)
def _private_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "bench.lock"
    monkeypatch.setattr(quiet, "LOCK_PATH", path)
    return path


class FakeClock:
    """A clock that only moves when slept on."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += max(seconds, 0.001)


def options(**overrides: object) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    quiet.add_arguments(parser)
    args = parser.parse_args([])
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


# --- the lock -------------------------------------------------------------------------------------


def refused(name: str, path: Path, **kwargs: object) -> str:
    """The message of the ``LockTimeout`` that ``bench_lock(name, ...)`` raises (fails if it gets in)."""
    with pytest.raises(quiet.LockTimeout) as raised, quiet.bench_lock(name, path=path, **kwargs):
        pytest.fail(f"{name} took a lock that is held")
    return str(raised.value)


def test_a_second_holder_times_out_naming_the_first(_private_lock: Path) -> None:
    clock, lines = FakeClock(), []
    with quiet.bench_lock("runtime_bench", path=_private_lock, timeout=10):
        message = refused(
            "cache_bench", _private_lock, timeout=5, log=lines.append, clock=clock, sleep=clock.sleep
        )
    assert f"pid {os.getpid()} (runtime_bench, exclusive" in message
    assert "after 5 s" in message and "--lock-timeout 5" in message
    assert 4.9 <= clock.now <= 5.1  # waited the whole timeout, no more
    assert lines and "waiting for the bench lock" in lines[0] and "runtime_bench" in lines[0]


def test_timeout_zero_fails_at_once(_private_lock: Path) -> None:
    clock = FakeClock()
    with (
        quiet.bench_lock("first", path=_private_lock),
        pytest.raises(quiet.LockTimeout),
        quiet.bench_lock("second", path=_private_lock, timeout=0, clock=clock, sleep=clock.sleep),
    ):
        pass
    assert clock.sleeps == []


def test_a_second_holder_waits_and_gets_the_lock_once_released(_private_lock: Path) -> None:
    first = contextlib.ExitStack()
    first.enter_context(quiet.bench_lock("first", path=_private_lock))
    clock, lines = FakeClock(), []

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if len(clock.sleeps) == 3:  # the first benchmark ends while the second waits
            first.close()

    with quiet.bench_lock(
        "second", path=_private_lock, timeout=60, log=lines.append, clock=clock, sleep=sleep
    ) as waited:
        assert waited == pytest.approx(clock.now)
        assert len(clock.sleeps) == 3
        assert [h["name"] for h in quiet.holders(_private_lock)] == ["second"]
    assert "held by pid" in lines[0] and "(first, exclusive" in lines[0]
    assert "took the bench lock after" in lines[-1]
    assert _private_lock.read_text() == ""  # an exclusive holder leaves nothing behind


def test_the_lock_is_machine_wide_across_processes(_private_lock: Path) -> None:
    """Another process's hold (a real flock, not this process's bookkeeping) keeps us out."""
    script = (
        "import sys, time; sys.path.insert(0, sys.argv[1]); import quiet; from pathlib import Path\n"
        "with quiet.bench_lock('other', path=Path(sys.argv[2])):\n"
        "    print('held', flush=True); sys.stdin.readline()\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", script, str(BENCH), str(_private_lock)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as other:
        assert other.stdout is not None and other.stdin is not None
        assert other.stdout.readline().strip() == "held"
        assert f"pid {other.pid} (other, exclusive" in refused("me", _private_lock, timeout=0)
        other.stdin.write("\n")
        other.stdin.flush()
        assert other.wait(timeout=30) == 0
    with quiet.bench_lock("me", path=_private_lock, timeout=0):
        pass


def test_shared_holders_coexist_and_keep_an_exclusive_one_out(_private_lock: Path) -> None:
    with (
        quiet.bench_lock("sim_a", path=_private_lock, shared=True),
        quiet.bench_lock("sim_b", path=_private_lock, shared=True, timeout=0),
    ):
        assert sorted(h["name"] for h in quiet.holders(_private_lock)) == ["sim_a", "sim_b"]
        assert "sim_a, shared" in refused("runtime_bench", _private_lock, timeout=0)
    with quiet.bench_lock("runtime_bench", path=_private_lock, timeout=0):
        assert [h["name"] for h in quiet.holders(_private_lock)] == ["runtime_bench"]
        assert "runtime_bench, exclusive" in refused("sim_a", _private_lock, shared=True, timeout=0)


def test_holders_skip_processes_that_are_gone(_private_lock: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    lines = [
        json.dumps({"pid": gone.pid, "name": "dead", "mode": "shared", "since": 0}),
        "not json",
        json.dumps({"pid": os.getpid(), "name": "alive", "mode": "shared", "since": 0}),
    ]
    _private_lock.write_text("\n".join(lines) + "\n")
    assert [h["name"] for h in quiet.holders(_private_lock)] == ["alive"]
    _private_lock.write_text("")
    assert "not written its name" in quiet.describe_holders(_private_lock)


# --- the load check -------------------------------------------------------------------------------


def test_load_over_the_limit_is_refused_without_noisy() -> None:
    with pytest.raises(quiet.BusyMachine) as raised:
        quiet.check_load("cache_bench", noisy=False, settle=0, loadavg=lambda: (2.25, 2.1, 2.17))
    message = str(raised.value)
    assert "\n" not in message
    assert "1-minute load average 2.25" in message and "over 0.5" in message and "--noisy" in message


def test_load_at_the_limit_passes() -> None:
    load, waited, verdict = quiet.check_load("x", noisy=False, settle=0, loadavg=lambda: (0.5, 3.0, 3.0))
    assert load == (0.5, 3.0, 3.0) and waited == 0.0 and verdict == "passed"


def test_a_load_that_settles_in_time_passes_after_waiting() -> None:
    readings = iter([(1.5, 1, 1), (0.9, 1, 1), (0.45, 1, 1)])
    clock, lines = FakeClock(), []
    load, waited, verdict = quiet.check_load(
        "x",
        noisy=False,
        settle=60,
        loadavg=lambda: next(readings),
        log=lines.append,
        clock=clock,
        sleep=clock.sleep,
    )
    assert load[0] == 0.45 and verdict == "passed"
    assert waited == pytest.approx(2 * quiet.SETTLE_POLL_SECONDS)
    assert "waiting up to 60 s" in lines[0]


def test_a_load_that_does_not_settle_is_refused_after_the_wait() -> None:
    clock = FakeClock()
    with pytest.raises(quiet.BusyMachine, match="after 30 s"):
        quiet.check_load(
            "x", noisy=False, settle=30, loadavg=lambda: (0.7, 0.7, 0.7), clock=clock, sleep=clock.sleep
        )
    assert clock.now == pytest.approx(30)


def test_noisy_waives_the_check_without_waiting() -> None:
    clock = FakeClock()
    load, waited, verdict = quiet.check_load(
        "x", noisy=True, settle=300, loadavg=lambda: (3.0, 2.0, 1.0), clock=clock, sleep=clock.sleep
    )
    assert load == (3.0, 2.0, 1.0) and waited == 0.0 and verdict == "waived (--noisy)"
    assert clock.sleeps == []


# --- quiet_run: exit statuses and the JSON fields -------------------------------------------------


def test_quiet_run_on_a_busy_machine_exits_2_with_one_line_and_releases_the_lock(
    _private_lock: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    measured = []
    busy = options(settle_seconds=0)
    with (
        pytest.raises(SystemExit) as raised,
        quiet.quiet_run("cache_bench", busy, loadavg=lambda: (2.25, 2.1, 2.2)),
    ):
        measured.append(True)
    assert raised.value.code == quiet.EXIT_BUSY == 2
    assert measured == []
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "2.25" in err
    with quiet.bench_lock("next", path=_private_lock, timeout=0):
        pass


def test_quiet_run_with_noisy_records_noisy_and_the_machine(_private_lock: Path) -> None:
    readings = iter([(2.25, 2.1, 2.17), (1.75, 2.12, 2.2)])
    lines: list[str] = []
    with quiet.quiet_run(
        "cache_bench", options(noisy=True), loadavg=lambda: next(readings), log=lines.append
    ) as run:
        result = run.stamp({"figure": 1.0, "noisy": "overwritten"})
    assert result["figure"] == 1.0
    assert result["noisy"] is True
    m = result["machine"]
    assert m["loadavg_before"] == [2.25, 2.1, 2.17]
    assert m["loadavg_after"] == [1.75, 2.12, 2.2]
    assert m["load_limit_1m"] == 0.5 and m["load_check"] == "waived (--noisy)"
    assert m["cpus"] == os.cpu_count() and m["cpus_usable"] >= 1
    assert isinstance(m["cpu_model"], str) and m["cpu_model"]
    assert m["lock"] == {"path": str(_private_lock), "mode": "exclusive", "waited_seconds": 0.0}
    json.dumps(result, allow_nan=False)  # what the scripts write
    assert "a noisy run" in lines[-1]


def test_quiet_run_on_a_quiet_machine_is_not_noisy() -> None:
    with quiet.quiet_run("x", options(), loadavg=lambda: (0.1, 0.2, 0.3), log=lambda _m: None) as run:
        fields = run.fields()
    assert fields["noisy"] is False and fields["machine"]["load_check"] == "passed"


def test_quiet_run_lock_timeout_exits_3(_private_lock: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with (
        quiet.bench_lock("holder", path=_private_lock),
        pytest.raises(SystemExit) as raised,
        quiet.quiet_run("x", options(lock_timeout=0), loadavg=lambda: (0.0, 0.0, 0.0)),
    ):
        pass
    assert raised.value.code == quiet.EXIT_LOCK_TIMEOUT == 3
    assert "held by pid" in capsys.readouterr().err


def test_a_simulation_holds_the_lock_shared_and_skips_the_load_check(_private_lock: Path) -> None:
    parser = argparse.ArgumentParser()
    quiet.add_arguments(parser, simulation=True)
    args = parser.parse_args([])
    assert not hasattr(args, "noisy")
    with quiet.quiet_run(
        "autoscaler_sim", args, simulation=True, loadavg=lambda: (9.0, 9.0, 9.0), log=lambda _m: None
    ) as run:
        with quiet.bench_lock("autoscaler_frontier", path=_private_lock, shared=True, timeout=0):
            pass
        fields = run.fields()
    assert fields["noisy"] is False
    assert fields["machine"]["load_check"].startswith("not applied")
    assert fields["machine"]["lock"]["mode"] == "shared"


def test_cpu_model_from_cpuinfo() -> None:
    text = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\nprocessor\t: 1\n"
    assert quiet.cpu_model(text) == "AMD EPYC 7B13"
    assert quiet.cpu_model("processor\t: 0\n")  # no model name (ARM): still a string


def test_the_options_and_their_defaults() -> None:
    args = options()
    assert args.noisy is False
    assert args.lock_timeout == quiet.LOCK_TIMEOUT_SECONDS
    assert args.settle_seconds == quiet.SETTLE_SECONDS


# --- every benchmark that measures goes through it ------------------------------------------------

MEASURING = (
    "runtime_bench",
    "frontend_bench",
    "operator_bench",
    "ipc_bench",
    "cache_bench",
    "hostile_bench",
    "token_budget",
    "cold_start",
)
SIMULATIONS = ("autoscaler_sim",)  # adversary and frontier run through autoscaler_sim.run_per_trace


@pytest.mark.parametrize("name", MEASURING + SIMULATIONS)
def test_each_benchmark_runs_under_quiet_run(name: str) -> None:
    tree = ast.parse((BENCH / f"{name}.py").read_text(encoding="utf-8"))
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "quiet_run"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "quiet"
    ]
    assert calls, f"bench/{name}.py does not measure under quiet.quiet_run"
    simulation = any(kw.arg == "simulation" for call in calls for kw in call.keywords)
    assert simulation == (name in SIMULATIONS)


def test_no_committed_result_is_noisy() -> None:
    """A result taken with --noisy says so; none of those is a committed figure (bench/README.md)."""
    results = {p.name: json.loads(p.read_text(encoding="utf-8")) for p in (BENCH / "results").glob("*.json")}
    noisy = sorted(name for name, result in results.items() if result.get("noisy", False) is not False)
    assert noisy == [], f"noisy results committed under bench/results/: {noisy}"


def test_collector_paused_collects_first_keeps_the_collector_off_inside_and_restores_it() -> None:
    import gc
    import weakref

    class Node:
        pass

    def garbage_cycle() -> weakref.ref[Node]:
        a, b = Node(), Node()
        a.other, b.other = b, a  # type: ignore[attr-defined]
        return weakref.ref(a)

    before = garbage_cycle()
    assert gc.isenabled()
    with quiet.collector_paused():
        assert before() is None  # the full collection ran before the block
        assert not gc.isenabled()
        inside = garbage_cycle()
        kept = [Node() for _ in range(5000)]  # alive: far past the first generation's threshold (700)
        assert inside() is not None  # no collection ran inside
        del kept
    assert gc.isenabled()
    gc.collect()
    assert inside() is None
