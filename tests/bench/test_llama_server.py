"""`anydraft bench --baseline llama-server` (issue 45): the client against a stand-in server
(fake_llama_server.py), the bench's checks, and, where a llama-server binary is at hand, its
greedy output on the same prompt tokens against anydraft's plain decoding on llama.cpp."""

import json
import os
import sys
from pathlib import Path

import pytest

from anydraft.bench import llama_server
from anydraft.cli import main
from anydraft.errors import AnydraftError
from tests.conftest import require_llamacpp, require_model
from tests.helpers import save_tiny_pair

FAKE = Path(__file__).with_name("fake_llama_server.py")


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """ANYDRAFT_LLAMA_SERVER points to the stand-in; its log's entries, read back."""
    log = tmp_path / "fake.jsonl"
    monkeypatch.setenv("FAKE_LLAMA_SERVER_LOG", str(log))
    monkeypatch.setenv("ANYDRAFT_LLAMA_SERVER", str(FAKE))

    def entries():
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    return entries


def test_find_takes_the_environment_first_and_refuses_a_bad_path(monkeypatch, tmp_path):
    monkeypatch.setenv("ANYDRAFT_LLAMA_SERVER", str(FAKE))
    assert llama_server.find() == str(FAKE)
    monkeypatch.setenv("ANYDRAFT_LLAMA_SERVER", str(tmp_path / "missing"))
    with pytest.raises(AnydraftError, match="not an executable file"):
        llama_server.find()
    monkeypatch.delenv("ANYDRAFT_LLAMA_SERVER")
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on PATH: the cache's build, if any
    monkeypatch.setenv("ANYDRAFT_CACHE", str(tmp_path / "cache"))
    assert llama_server.find() is None


def test_client_sends_token_ids_greedy_without_prompt_cache(fake):
    server = llama_server.LlamaServer("model.gguf", threads=2, context=512, binary=str(FAKE))
    with server:
        done = server.complete([5, 6, 7], 4)
        process = server.process
    assert process.poll() is not None  # stopped on exit
    assert done.token_ids == [1, 2, 3, 4] and done.decode_ms == 6.0 and done.prompt_tokens == 3
    assert done.seconds > 0
    argv, body = fake()
    argv = argv["argv"]
    for flag, value in (("-m", "model.gguf"), ("-t", "2"), ("-tb", "2"), ("-c", "512"),
                        ("--parallel", "1"), ("--host", "127.0.0.1")):
        assert argv[argv.index(flag) + 1] == value, (flag, argv)
    assert "--no-cache-prompt" in argv  # every request reads its prompt, as anydraft's do
    assert body["prompt"] == [5, 6, 7] and body["n_predict"] == 4
    assert body["temperature"] == 0 and body["top_k"] == 1
    assert body["cache_prompt"] is False and body["return_tokens"] is True


def test_the_server_runs_as_its_users_run_it(fake, monkeypatch):
    """Without the huge pages `anydraft` asked for itself (hardware/hugepages.py)."""
    from anydraft.hardware import hugepages

    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.check=0")
    monkeypatch.setattr(os, "environ", hugepages.with_tunable(os.environ))
    with llama_server.LlamaServer("model.gguf", threads=2, context=512, binary=str(FAKE)):
        pass
    assert fake()[0]["glibc_tunables"] == "glibc.malloc.check=0"


def test_a_server_that_dies_at_start_is_a_clear_error(tmp_path):
    dead = tmp_path / "llama-server"
    dead.write_text(f"#!{sys.executable}\nimport sys; sys.exit(3)\n")
    dead.chmod(0o755)
    with pytest.raises(AnydraftError, match="exited with status 3 at start"):
        llama_server.LlamaServer("m.gguf", 1, 64, binary=str(dead)).__enter__()


def test_bench_refuses_sampling_and_targets_without_gguf(tmp_path, fake, capsys):
    save_tiny_pair(tmp_path)
    common = ["bench", "--target", str(tmp_path / "target"), "--baseline", "llama-server",
              "--n", "1", "--max-new-tokens", "2", "--no-warmup", "--no-plots", "--out", str(tmp_path / "o")]
    assert main([*common, "--temperature", "0.7"]) == 2
    assert "--baseline llama-server compares greedy decoding" in capsys.readouterr().err
    assert main([*common, "--target-backend", "torch", "--dtype", "float32"]) == 2
    assert "needs a GGUF target" in capsys.readouterr().err
    assert main([*common, "--baseline", "vllm"]) == 2
    assert "unknown --baseline 'vllm'" in capsys.readouterr().err


@pytest.mark.real
def test_bench_rows_carry_ratios_against_the_server(tmp_path, fake):
    """With the stand-in (its tokens are not the model's: a baseline's difference is reported,
    never the bench's correctness alarm), every row gets its ratios against it."""
    require_llamacpp()
    require_model("smollm2-135m")
    out = tmp_path / "out"
    rc = main(["bench", "--target", "smollm2-135m", "--target-backend", "llamacpp",
               "--methods", "ar,lookup", "--baseline", "llama-server", "--n", "1",
               "--categories", "code", "--max-new-tokens", "4", "--no-warmup", "--no-plots",
               "--out", str(out)])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    rows = {r["method"]: r for r in res["results"]}
    assert list(rows) == ["ar", "llama-server", "lookup"]
    server = rows["llama-server"]
    assert server["new_tokens"] == 4 and server["target_backend"] == "llamacpp"
    for r in rows.values():
        assert r["speedup_vs_llama_server"] == pytest.approx(r["tokens_per_s"] / server["tokens_per_s"])
    assert server["decode_speedup_vs_llama_server"] == pytest.approx(1.0)
    sent = [e for e in fake() if "prompt" in e]
    assert sent and all(e["prompt"] == sent[0]["prompt"] for e in sent)
    assert len(sent[0]["prompt"]) == rows["ar"]["prompt_tokens"]  # the same prompt tokens
    text = (out / "summary.md").read_text()
    assert "speedup vs llama-server" in text and "llama-server baseline:" in text
    assert res["meta"]["settings"]["fastest_plain"] in ("ar (llamacpp)", "llama-server")


@pytest.mark.real
def test_real_llama_server_decodes_as_anydraft_does(tmp_path, monkeypatch):
    """llama.cpp's own server and anydraft's plain llama.cpp decoding, on the same prompt
    tokens of the same GGUF file: the same greedy tokens (both score one token a step)."""
    require_llamacpp()
    require_model("smollm2-135m")
    if llama_server.find() is None:
        if os.environ.get("ANYDRAFT_REQUIRE_LLAMA_SERVER") == "1":
            pytest.fail("no llama-server: build it with `python -m anydraft.bench.llama_server`")
        pytest.skip("no llama-server binary (python -m anydraft.bench.llama_server builds one, ~10 min)")
    monkeypatch.setenv("ANYDRAFT_LLAMACPP_CONTEXT", "1024")
    out = tmp_path / "out"
    rc = main(["bench", "--target", "smollm2-135m", "--target-backend", "llamacpp",
               "--methods", "ar", "--baseline", "llama-server", "--n", "3", "--categories", "code",
               "--max-new-tokens", "24", "--no-plots", "--out", str(out)])
    assert rc == 0
    rows = json.loads((out / "results.json").read_text())["results"]
    server = [r for r in rows if r["method"] == "llama-server"]
    assert len(server) == 3
    assert all(r["identical_to_ar"] for r in server), [(r["prompt_id"], r["mismatch_at"]) for r in server]


@pytest.mark.real
def test_bench_serve_adds_llama_server_with_a_slot_per_client(fake, capsys):
    """`bench-serve --llama-server`: its configuration first (the ratios' baseline), on the
    target's GGUF with --parallel of the highest level."""
    import argparse

    from anydraft.bench import serve

    require_model("smollm2-135m")
    args = argparse.Namespace(target="smollm2-135m", concurrency="1,8,2", llama_server=True)
    cmd = serve.server_command(args, serve.ServeConfig(serve.LLAMA_SERVER, ()), 4321, 64)
    assert cmd[0] == str(FAKE) and cmd[cmd.index("--parallel") + 1] == "8"
    assert cmd[cmd.index("--port") + 1] == "4321" and cmd[cmd.index("-m") + 1].endswith(".gguf")
    assert main(["bench-serve", "--target", "smollm2-135m", "--llama-server",
                 "--configs", "llama-server=--method ar"]) == 2
    assert "give yours another label" in capsys.readouterr().err


def test_ik_llama_cpp_tree_is_prepared_to_configure(tmp_path):
    """The ik-llama-cpp-python sdist's tree lacks its build-info script and folders its examples
    name: `_prepare_ik` writes a script that fills build-info.cpp from its template without git,
    and keeps only the server, its multimodal library and llama-bench."""
    import shutil
    import subprocess

    if shutil.which("cmake") is None:
        pytest.skip("cmake not installed")
    (tmp_path / "common").mkdir()
    (tmp_path / "examples").mkdir()
    (tmp_path / "common" / "build-info.cpp.in").write_text(
        'int LLAMA_BUILD_NUMBER = @BUILD_NUMBER@;\nchar const *LLAMA_COMMIT = "@BUILD_COMMIT@";\n')
    (tmp_path / "examples" / "CMakeLists.txt").write_text("add_subdirectory(missing)\n")
    llama_server._prepare_ik(tmp_path)
    subprocess.run(["cmake", "-P", "common/cmake/build-info-gen-cpp.cmake"], cwd=tmp_path, check=True)
    assert (tmp_path / "common" / "build-info.cpp").read_text().startswith("int LLAMA_BUILD_NUMBER = 0;")
    examples = (tmp_path / "examples" / "CMakeLists.txt").read_text()
    assert "missing" not in examples and "add_subdirectory(server)" in examples
    assert llama_server.IK_SERVER.targets[-1] == "llama-server"  # copied last: the build is whole
