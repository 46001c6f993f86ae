"""The fetch refuses an HTML page where a model's file was asked for (``runtime/fetch/htmlpage.py``): the
pure detector (first bytes, Content-Type, file names meant to be HTML) and the sink that applies it
to every file written, whatever its chunks."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from kubeinfer.runtime.fetch.errors import HTML_PAGE_CAUSE, FetchError
from kubeinfer.runtime.fetch.files import Sink, SizeBudget
from kubeinfer.runtime.fetch.htmlpage import (
    HEAD_BYTES,
    check_content_type,
    check_file,
    is_html_content_type,
    looks_like_html,
    may_be_html,
)
from kubeinfer.runtime.fetch.progress import Progress

pytestmark = pytest.mark.timeout(30)

LOGIN = b"<!DOCTYPE html>\n<html><head><title>Sign in</title></head><body><form>...</form></body></html>\n"


def test_the_message_says_html_and_what_to_check() -> None:
    assert HTML_PAGE_CAUSE == (
        "the server answered an HTML page, not a model (check the URI and the credentials)"
    )


@pytest.mark.parametrize(
    "head",
    [
        LOGIN,
        b"<!doctype html><title>x</title>",
        b"<!DocType HTML PUBLIC '-//W3C//DTD HTML 4.01//EN'>",
        b"<html lang='en'><body>",
        b"<HTML>",
        b"<html",  # all there is of a short answer
        b"\n\r\n  \t<html>",  # leading whitespace
        b"\xef\xbb\xbf<!doctype html>",  # UTF-8 byte order mark
        b"\xef\xbb\xbf \n<HTML>",
        "\ufeff<!doctype html>".encode("utf-16-le"),  # UTF-16 with its byte order mark
        "\ufeff\n<html>".encode("utf-16-be"),
    ],
)
def test_an_html_page_is_told_by_its_first_bytes(head: bytes) -> None:
    assert looks_like_html(head)


@pytest.mark.parametrize(
    "head",
    [
        b"",
        b"\x08\x07\x12\x07pytorch",  # an ONNX protobuf
        b"\x10\x00\x00\x00\x00\x00\x00\x00{",  # safetensors: a length, then JSON
        b"PK\x03\x04",  # a torch zip
        b"GGUF\x03\x00",
        b'{"architectures": ["BertModel"]}',  # config.json
        b"[PAD]\n[UNK]\n",  # vocab.txt
        b"<?xml version='1.0'?><Error><Code>AccessDenied</Code></Error>",  # XML, not HTML
        b"<!doctype htm",  # not the whole tag
        b"<htm",
        b"x<html>",  # HTML further in is no page
        b"<!-- a comment --><html>",
        b" " * HEAD_BYTES,
    ],
)
def test_a_model_or_other_text_is_not_html(head: bytes) -> None:
    assert not looks_like_html(head)


@pytest.mark.parametrize(
    ("value", "html"),
    [
        ("text/html", True),
        ("text/html; charset=utf-8", True),
        (" Text/HTML ;charset=UTF-8", True),
        ("application/xhtml+xml", True),
        ("application/octet-stream", False),
        ("binary/octet-stream", False),
        ("text/plain", False),
        ("application/json", False),
        ("", False),
        (None, False),
    ],
)
def test_an_html_content_type(value: str | None, html: bool) -> None:
    assert is_html_content_type(value) is html


def test_a_file_named_as_html_is_never_refused() -> None:
    assert may_be_html("README.html") and may_be_html("docs/Index.HTM") and may_be_html("a.xhtml")
    assert not may_be_html("model.onnx") and not may_be_html("html") and not may_be_html("config.json")
    check_content_type("index.html", "text/html")
    with pytest.raises(FetchError) as info:
        check_content_type("model.onnx", "text/html; charset=utf-8")
    assert info.value.cause == HTML_PAGE_CAUSE and not info.value.transient


def quiet() -> Progress:
    return Progress("t", stream=io.StringIO())


@pytest.mark.parametrize("chunk", [1, 7, HEAD_BYTES, 1 << 20])
def test_a_sink_refuses_an_html_page_whatever_its_chunks_and_leaves_nothing(
    tmp_path: Path, chunk: int
) -> None:
    page = LOGIN * 40  # longer than HEAD_BYTES
    budget, progress = SizeBudget(None), quiet()
    with (
        pytest.raises(FetchError) as info,
        Sink(tmp_path / "model.onnx", budget=budget, progress=progress) as sink,
    ):
        for i in range(0, len(page), chunk):
            sink.write(page[i : i + chunk])
        sink.commit()
    assert info.value.cause == HTML_PAGE_CAUSE and not info.value.transient
    assert list(tmp_path.iterdir()) == [] and budget.used == 0 and progress.done == 0


def test_a_short_html_page_is_refused_at_commit_and_a_short_model_kept(tmp_path: Path) -> None:
    with (
        pytest.raises(FetchError, match="HTML page"),
        Sink(tmp_path / "config.json", budget=SizeBudget(None), progress=quiet()) as sink,
    ):
        sink.write(b"  <html>")
        sink.commit()
    assert list(tmp_path.iterdir()) == []
    for name, data in (("config.json", b"{}"), ("page.html", LOGIN), ("m.onnx", b"\x08\x07" + LOGIN)):
        with Sink(tmp_path / name, budget=SizeBudget(None), progress=quiet()) as sink:
            for i in range(0, len(data), 5):
                sink.write(data[i : i + 5])
            sink.commit()
        assert (tmp_path / name).read_bytes() == data


def test_check_file_deletes_an_html_page(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"\xef\xbb\xbf" + LOGIN)
    (tmp_path / "tokenizer.json").write_bytes(b'{"version": "1.0"}')
    (tmp_path / "index.html").write_bytes(LOGIN)
    check_file(tmp_path / "tokenizer.json")
    check_file(tmp_path / "index.html")
    with pytest.raises(FetchError, match="HTML page"):
        check_file(tmp_path / "model.safetensors")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.html", "tokenizer.json"]
