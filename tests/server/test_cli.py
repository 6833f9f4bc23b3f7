"""`anydraft serve` argument handling, without starting a server."""

from __future__ import annotations

import subprocess
import sys

import pytest

from anydraft.cli import build_parser, main
from anydraft.server.cli import is_loopback


def test_serve_is_registered_with_defaults():
    args = build_parser().parse_args(["serve", "--target", "m"])
    assert (args.host, args.port, args.max_concurrency, args.max_queue) == ("127.0.0.1", 8000, 1, 64)
    assert args.api_key is None and args.method == "auto"


@pytest.mark.parametrize("host,loopback", [
    ("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("192.168.1.10", False), ("example.com", False),
])
def test_loopback_detection(host, loopback):
    assert is_loopback(host) is loopback


def test_public_address_warns_before_loading(capsys):
    # a bad --max-queue is rejected before anything is loaded; a public host warns first
    assert main(["serve", "--target", "m", "--host", "0.0.0.0", "--max-queue", "-1"]) == 2
    assert "max-queue" in capsys.readouterr().err
    assert main(["serve", "--target", "/no/such/model", "--host", "0.0.0.0", "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert "WARNING" in err and "0.0.0.0" in err and "no --api-key" in err


def test_importing_the_cli_does_not_import_fastapi():
    code = ("import sys, anydraft.cli; anydraft.cli.build_parser(); "
            "assert 'fastapi' not in sys.modules and 'uvicorn' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
