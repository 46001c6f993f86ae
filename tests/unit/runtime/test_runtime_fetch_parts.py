"""The fetch's pure parts: redaction, retry classification and backoff, progress lines, the atomic
finish with sha256 while streaming, the size limit, safe paths, the report, leftovers, options."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pytest
from kubeinfer.runtime import cli
from kubeinfer.runtime.fetch import FetchOptions
from kubeinfer.runtime.fetch.errors import FetchError
from kubeinfer.runtime.fetch.files import (
    Sink,
    SizeBudget,
    check_sha256,
    count_files,
    remove_leftovers,
    safe_path,
)
from kubeinfer.runtime.fetch.progress import Progress, done_line, progress_line
from kubeinfer.runtime.fetch.redact import redact_text, redact_url, secrets_from
from kubeinfer.runtime.fetch.report import REPORT_NAME, FetchReport, read_report, write_report
from kubeinfer.runtime.fetch.retry import backoff_seconds, retrying, transient_status
from kubeinfer.runtime.fetch.run import check_options, fetch, not_fetched
from kubeinfer.runtime.fetch.source import parse_source

pytestmark = pytest.mark.timeout(30)


# ----- redaction ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "redacted"),
    [
        ("https://host/m.onnx", "https://host/m.onnx"),
        ("https://alice:pw@host:8443/m.onnx", "https://***@host:8443/m.onnx"),
        ("https://host/m.onnx?X-Amz-Signature=abc&X-Amz-Credential=k", "https://host/m.onnx?***"),
        ("https://tok@host/m?a=1#frag", "https://***@host/m?***"),
        ("s3://bucket/key", "s3://bucket/key"),
        ("hf://org/repo@v2", "hf://org/repo@v2"),  # the @ of a revision is no userinfo
        ("not a url", "not a url"),
        # an unencoded '/', '?' or '#' in a password: a URL parser reads part of it as the port
        ("http://bob:SECRETab/cd@127.0.0.1:33883/m.onnx", "http://***@127.0.0.1:33883/m.onnx"),
        ("http://bob:ab?cdSECRET@h/m.onnx", "http://***?***"),
        ("http://bob:ab#cdSECRET@h/m.onnx", "http://***"),
        ("https://[::1]:8443/m.onnx", "https://[::1]:8443/m.onnx"),
    ],
)
def test_redact_url(url: str, redacted: str) -> None:
    assert redact_url(url) == redacted


def test_redact_text_masks_urls_and_secret_values() -> None:
    env = {
        "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI",
        "HF_TOKEN": "hf_abc123",
        "KUBEINFER_FETCH_BEARER_TOKEN": "x",
        "PATH": "/bin",
    }
    secrets = secrets_from(env)
    assert secrets == ["wJalrXUtnFEMI", "hf_abc123"]  # a 1-character value would mask ordinary text
    text = "GET https://u:p@h/m?sig=1 failed; key wJalrXUtnFEMI, token hf_abc123 in 'https://h/x?t=2'"
    assert (
        redact_text(text, secrets)
        == "GET https://***@h/m?*** failed; key ***, token *** in 'https://h/x?***'"
    )
    once = redact_text("https://u:p@h/m.onnx?sig=1: 401 Unauthorized (see https://h/doc).")
    assert once == "https://***@h/m.onnx?***: 401 Unauthorized (see https://h/doc)."  # punctuation is no URL
    assert redact_text(once) == once


# ----- retries --------------------------------------------------------------------------------------


def test_transient_statuses_and_backoff() -> None:
    assert [s for s in (200, 400, 401, 403, 404, 408, 429, 500, 502, 503, 599) if transient_status(s)] == [
        429,
        500,
        502,
        503,
        599,
    ]
    assert [backoff_seconds(i) for i in range(7)] == [1, 2, 4, 8, 16, 30, 30]


def test_retrying_retries_transient_failures_with_backoff_and_says_so() -> None:
    calls, sleeps, lines = [], [], []

    def attempt() -> str:
        calls.append(1)
        if len(calls) < 4:
            raise FetchError("503 Service Unavailable", transient=True)
        return "ok"

    assert retrying(attempt, retries=3, log=lines.append, label="s3://b/k", sleep=sleeps.append) == "ok"
    assert sleeps == [1, 2, 4] and len(calls) == 4
    assert lines[0] == "fetch: s3://b/k: 503 Service Unavailable; retrying in 1 s (attempt 2 of 4)"


def test_retrying_fails_at_once_on_a_permanent_failure_and_counts_attempts_when_exhausted() -> None:
    sleeps: list[float] = []

    def permanent() -> None:
        raise FetchError("403 AccessDenied")

    with pytest.raises(FetchError, match=r"^403 AccessDenied$"):
        retrying(permanent, retries=3, log=print, label="x", sleep=sleeps.append)
    assert sleeps == []

    def stalls() -> None:
        raise FetchError("stalled: no data for 60 s", transient=True)

    with pytest.raises(FetchError, match=r"^stalled: no data for 60 s \(after 3 attempts\)$"):
        retrying(stalls, retries=2, log=lambda _l: None, label="x", sleep=sleeps.append)
    assert sleeps == [1, 2]
    with pytest.raises(FetchError, match=r"^stalled: no data for 60 s$"):  # one attempt: the cause as it is
        retrying(stalls, retries=0, log=lambda _l: None, label="x", sleep=sleeps.append)


# ----- progress -------------------------------------------------------------------------------------


def test_progress_lines_at_most_every_five_seconds_and_at_the_end() -> None:
    now = [0.0]
    out = io.StringIO()
    p = Progress("s3://b/p", total=400_000_000, stream=out, clock=lambda: now[0])
    for _ in range(40):  # 1 MB every 0.25 s for 10 s
        now[0] += 0.25
        p.add(1_000_000)
    assert p.finish(3) == "fetch: done: 3 files, 40.0 MB in 10.0 s"
    lines = out.getvalue().splitlines()
    assert lines == [
        "fetch: s3://b/p: 20.0 MB of 400.0 MB (5 %), 4.0 MB/s",
        "fetch: s3://b/p: 40.0 MB of 400.0 MB (10 %), 4.0 MB/s",
        "fetch: s3://b/p: 40.0 MB of 400.0 MB (10 %), 4.0 MB/s",
        "fetch: done: 3 files, 40.0 MB in 10.0 s",
    ]
    assert progress_line("https://h/m", 12_000_000, None, 6e6) == "fetch: https://h/m: 12.0 MB, 6.0 MB/s"
    assert done_line(1, 0, 0.04) == "fetch: done: 1 file, 0.0 MB in 0.0 s"


# ----- the atomic finish, sha256, the size limit ---------------------------------------------------


def quiet() -> Progress:
    return Progress("t", stream=io.StringIO())


def test_a_sink_writes_a_hidden_temp_file_and_renames_it_when_the_sha256_matches(tmp_path: Path) -> None:
    data = b"model bytes" * 1000
    final = tmp_path / "m.onnx"
    with Sink(
        final, budget=SizeBudget(None), progress=quiet(), sha256=hashlib.sha256(data).hexdigest()
    ) as sink:
        sink.write(data[:5000])
        assert sink.path.name.startswith(".m.onnx.") and sink.path.name.endswith(".kubeinfer-partial")
        assert not final.exists()  # nothing under the real name until the end
        sink.write(data[5000:])
        sink.commit()
    assert final.read_bytes() == data and sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_a_sha256_mismatch_leaves_nothing(tmp_path: Path) -> None:
    expected = "ab12" + "0" * 60
    with Sink(tmp_path / "m.onnx", budget=SizeBudget(None), progress=quiet(), sha256=expected) as sink:
        sink.write(b"other bytes")
        with pytest.raises(FetchError) as info:
            sink.commit()
    got = hashlib.sha256(b"other bytes").hexdigest()
    assert info.value.cause == f"sha256 mismatch (expected ab1200000000..., got {got[:12]}...)"
    assert not info.value.transient and list(tmp_path.iterdir()) == []


def test_a_failed_write_discards_the_temp_file_and_gives_the_bytes_back(tmp_path: Path) -> None:
    budget = SizeBudget(100)
    progress = quiet()
    with (
        pytest.raises(FetchError, match=r"more than --size-limit 0.0 MB \(100 bytes\) received"),
        Sink(tmp_path / "m.bin", budget=budget, progress=progress) as sink,
    ):
        sink.write(b"x" * 60)
        sink.write(b"x" * 60)
    assert list(tmp_path.iterdir()) == [] and budget.used == 0 and progress.done == 0


def test_the_size_limit_refuses_a_stated_total_before_starting() -> None:
    budget = SizeBudget(10_000_000)
    budget.check_total(10_000_000)
    with pytest.raises(FetchError) as info:
        budget.check_total(12_000_000)
    assert (
        info.value.cause
        == "12.0 MB (12000000 bytes) to fetch, more than --size-limit 10.0 MB (10000000 bytes)"
    )
    SizeBudget(None).check_total(10**15)


@pytest.mark.parametrize("bad", ["../x", "a/../../x", "/etc/passwd", "a\\b", "a//b", "", "a\0b"])
def test_safe_path_refuses_what_escapes(tmp_path: Path, bad: str) -> None:
    with pytest.raises(FetchError, match="escapes the destination"):
        safe_path(tmp_path, bad, "object key")


def test_safe_path_keeps_relative_paths_and_refuses_a_symlinked_way_out(tmp_path: Path) -> None:
    assert safe_path(tmp_path, "a/b/c.bin", "object key") == tmp_path / "a" / "b" / "c.bin"
    (tmp_path / "out").symlink_to("/tmp")
    with pytest.raises(FetchError, match="object key out/x escapes the destination"):
        safe_path(tmp_path, "out/x", "object key")


def test_check_sha256() -> None:
    assert check_sha256(" " + "AB" * 32 + "\n") == "ab" * 32
    with pytest.raises(ValueError, match="64 hexadecimal digits, got 3 characters"):
        check_sha256("abc")


# ----- the report, leftovers, counting -------------------------------------------------------------


def test_the_report_round_trips_and_a_bad_one_is_a_value_error(tmp_path: Path) -> None:
    assert read_report(tmp_path) is None and read_report(tmp_path / "missing") is None
    report = FetchReport(source="s3://b/p", files=3, bytes=400, seconds=9.8)
    path = write_report(tmp_path, report)
    assert path.name == REPORT_NAME == ".kubeinfer-fetch.json"
    assert json.loads(path.read_text()) == {"source": "s3://b/p", "files": 3, "bytes": 400, "seconds": 9.8}
    assert read_report(tmp_path) == report and [p.name for p in tmp_path.iterdir()] == [REPORT_NAME]
    for bad in ("{", '{"source": "x"}', '{"source": "x", "files": -1, "bytes": 1, "seconds": 1}', "[]"):
        path.write_text(bad)
        with pytest.raises(ValueError, match="not a fetch report"):
            read_report(tmp_path)


def test_leftovers_of_an_interrupted_attempt_are_removed_and_hidden_files_not_counted(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / ".w.bin.1234.kubeinfer-partial").write_bytes(b"half")
    (tmp_path / ".kubeinfer-unpack-abcd").mkdir()
    (tmp_path / ".kubeinfer-unpack-abcd" / "x").write_bytes(b"x")
    (tmp_path / "config.json").write_bytes(b"{}")
    (tmp_path / REPORT_NAME).write_text("{}")
    assert remove_leftovers(tmp_path) == 2
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        ".kubeinfer-fetch.json",
        "config.json",
        "sub",
    ]
    assert count_files(tmp_path) == (1, 2)


# ----- options and the steps around the backends ---------------------------------------------------


def test_options_are_checked() -> None:
    assert check_options(FetchOptions(sha256="AB" * 32)).sha256 == "ab" * 32
    for bad, message in [
        (FetchOptions(retries=-1), "--retries must be 0 or more"),
        (FetchOptions(stall_timeout=0), "--stall-timeout must be a positive number"),
        (FetchOptions(connect_timeout=float("nan")), "--connect-timeout must be a positive number"),
        (FetchOptions(size_limit=0), "--size-limit must be a positive number of bytes"),
        (FetchOptions(sha256="xyz"), "--sha256 must be 64 hexadecimal digits"),
    ]:
        with pytest.raises(ValueError, match=message):
            check_options(bad)


def test_sources_that_are_not_fetched_are_refused(tmp_path: Path) -> None:
    for uri in ("default", "/models/x", "pvc://claim/x", "oci://reg/m:1"):
        assert not_fetched(parse_source(uri))
        with pytest.raises(FetchError, match="nothing to fetch"):
            fetch(uri, tmp_path, FetchOptions())
    assert not_fetched(parse_source("s3://models/k")) is None


def test_plain_http_is_refused_without_allow_http(tmp_path: Path) -> None:
    with pytest.raises(FetchError, match="plain http:// is refused without --allow-http"):
        fetch("http://127.0.0.1:9/m.onnx", tmp_path / "d", FetchOptions(), stream=io.StringIO())


def test_a_destination_whose_report_names_the_source_is_not_fetched_again(tmp_path: Path) -> None:
    report = FetchReport(source="https://h/m.onnx?***", files=1, bytes=5, seconds=1.0)
    write_report(tmp_path, report)
    out = io.StringIO()
    assert fetch("https://h/m.onnx?sig=new", tmp_path, FetchOptions(), stream=out) == report
    assert "already in" in out.getvalue() and "sig=new" not in out.getvalue()


# ----- the command line ----------------------------------------------------------------------------


def test_size_limits_in_bytes_or_quantities() -> None:
    assert [cli.parse_size(s) for s in ("1000", "10Gi", "500M", "1k", "2Ki")] == [
        1000,
        10 * 2**30,
        500 * 10**6,
        1000,
        2048,
    ]
    for bad in ("", "1.5Gi", "10X", "Gi", "-1"):
        with pytest.raises(ValueError):
            cli.parse_size(bad)


def test_the_fetch_command_line_takes_the_contract_options() -> None:
    args = cli.build_parser().parse_args(
        [
            "fetch", "--source", "s3://b/p", "--dest", "/mnt/models", "--sha256", "a" * 64,
            "--s3-endpoint", "http://minio:9000", "--s3-region", "eu-west-1", "--s3-addressing-style", "path",
            "--hf-endpoint", "http://hub", "--allow-pattern", "*.json", "--allow-pattern", "1_Pooling/*",
            "--allow-http", "--ca-file", "/etc/kubeinfer/model-ca/ca.crt",
            "--size-limit", "20Gi", "--connect-timeout", "5", "--stall-timeout", "2",
            "--retries", "0", "--termination-log", "/tmp/t",
        ]
    )  # fmt: skip
    opts = cli.fetch_options(args)
    assert opts == FetchOptions(
        sha256="a" * 64,
        s3_endpoint="http://minio:9000",
        s3_region="eu-west-1",
        s3_addressing_style="path",
        hf_endpoint="http://hub",
        allow_patterns=("*.json", "1_Pooling/*"),
        allow_http=True,
        ca_file="/etc/kubeinfer/model-ca/ca.crt",
        size_limit=20 * 2**30,
        connect_timeout=5.0,
        stall_timeout=2.0,
        retries=0,
    )
    assert args.termination_log == "/tmp/t"
    defaults = cli.fetch_options(cli.build_parser().parse_args(["fetch", "--source", "x", "--dest", "y"]))
    assert defaults == FetchOptions()
    assert (defaults.connect_timeout, defaults.stall_timeout, defaults.retries) == (10.0, 60.0, 3)


def test_a_failing_fetch_exits_1_with_one_redacted_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "termination-log"
    code = cli.main(
        [
            "fetch",
            "--source",
            "https://u:hunter2@h/x/",
            "--dest",
            str(tmp_path / "d"),
            "--termination-log",
            str(log),
        ]
    )
    assert code == 1
    line = log.read_text()
    assert line.count("\n") == 1 and line.startswith(
        "model.source 'https://***@h/x/': the URL's path must end"
    )
    assert "hunter2" not in line and "hunter2" not in capsys.readouterr().err


def test_an_unexpected_error_in_the_fetch_is_still_one_line_and_exit_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kubeinfer.runtime.fetch.run as run

    def broken(*_: object) -> None:
        raise AttributeError("module 'tarfile' has no attribute 'FilterError'")

    monkeypatch.setattr(run, "fetch", broken)
    log = tmp_path / "termination-log"
    args = ["fetch", "--source", "https://h/m.tar.gz", "--dest", str(tmp_path), "--termination-log", str(log)]
    assert cli.main(args) == 1
    assert log.read_text() == (
        "https://h/m.tar.gz: internal error: AttributeError: "
        "module 'tarfile' has no attribute 'FilterError'\n"
    )


def test_the_operators_fetch_init_containers_parse() -> None:
    """The operator's golden pod specs (tests/unit/operator/golden) run ``kubeinfer-runtime fetch``
    with arguments this parser takes, a source ``parse_source`` takes and options in range."""
    import yaml

    golden = Path(__file__).resolve().parents[1] / "operator" / "golden"
    seen = 0
    for path in sorted(golden.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        pod = doc.get("pod") if isinstance(doc, dict) else None
        for container in (pod or {}).get("initContainers") or []:
            args = container.get("args") or []
            if container.get("command") == ["kubeinfer-runtime"] and args[:1] == ["fetch"]:
                parsed = cli.build_parser().parse_args(args)
                check_options(cli.fetch_options(parsed))
                assert parse_source(parsed.source).fetched, path.name
                seen += 1
    assert seen >= 1, f"no fetch init container in {golden}"


def test_a_credential_from_a_file_with_a_trailing_newline_is_stripped_and_masked_in_every_form() -> None:
    """``kubectl create secret --from-file`` keeps the file's final newline; a client refusing the
    header quotes the value escaped (``b'Bearer tok\\n'``), which must be masked too."""
    from kubeinfer.runtime.fetch.redact import credentials_stripped

    env = {"KUBEINFER_FETCH_BEARER_TOKEN": "tok3nSECRETzz\n", "HF_TOKEN": "hf_SECRET\r\n", "PATH": "/bin"}
    assert credentials_stripped(env) == {
        "KUBEINFER_FETCH_BEARER_TOKEN": "tok3nSECRETzz",
        "HF_TOKEN": "hf_SECRET",
        "PATH": "/bin",
    }
    assert env["HF_TOKEN"] == "hf_SECRET\r\n", "the caller's mapping is left as it was"
    secrets = secrets_from(env)
    text = (
        "connection broken: Illegal header value b'Bearer tok3nSECRETzz\\n'; "
        "LocalProtocolError: Illegal header value b'Bearer hf_SECRET\\r\\n'; raw tok3nSECRETzz"
    )
    out = redact_text(text, secrets)
    assert "tok3nSECRET" not in out and "hf_SECRET" not in out, out
    assert out.count("***") == 3, out


def test_the_fetch_command_strips_credentials_before_any_backend_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    import kubeinfer.runtime.fetch.run as run

    seen: dict[str, str | None] = {}

    def spy(*_: object) -> None:
        seen["token"] = os.environ.get("KUBEINFER_FETCH_BEARER_TOKEN")
        raise FetchError("404 Not Found")

    monkeypatch.setenv("KUBEINFER_FETCH_BEARER_TOKEN", "tok3nSECRETzz\n")
    monkeypatch.setattr(run, "fetch", spy)
    log = tmp_path / "termination-log"
    args = ["fetch", "--source", "https://h/m.onnx", "--dest", str(tmp_path), "--termination-log", str(log)]
    assert cli.main(args) == 1
    assert seen["token"] == "tok3nSECRETzz"
    assert log.read_text() == "https://h/m.onnx: 404 Not Found\n"
