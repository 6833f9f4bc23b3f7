"""llama.cpp's own C++ server (``llama-server``): the plain decoding most CPU users run on a GGUF
model, directly or inside Ollama / LM Studio, and so the baseline of ``--baseline llama-server``.

The binary: ``$ANYDRAFT_LLAMA_SERVER``, else ``llama-server`` on PATH, else the one `build`
wrote into the cache, compiled once from the llama.cpp sources that the installed
llama-cpp-python vendors (the same code, the same compiler flags as anydraft's own llama.cpp
backend; about 10 minutes on 2 cores). `LlamaServer` runs it on loopback for one GGUF file with
the threads and context size anydraft's sessions use; `complete` sends token ids to its
``/completion`` endpoint, so that both sides read the same prompt tokens whatever chat template
either would apply.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ..errors import AnydraftError
from ..models.hugepages import as_users_run, state
from .processes import free_port, stop_process

# the flags `make install` compiles llama-cpp-python with (Makefile: LLAMA_BUILD), so the two
# builds run the same kernels: llama.cpp's AMX kernels crash on virtual machines (llama.cpp#20824)
CMAKE_FLAGS = ["-DCMAKE_C_FLAGS=-mno-amx-int8", "-DCMAKE_CXX_FLAGS=-mno-amx-int8"]
# a model load takes seconds (mmap); a server not answering /health by then has failed
START_TIMEOUT = 120.0


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("llama-cpp-python")
    except Exception as exc:  # noqa: BLE001 - any failure means: not installed
        raise AnydraftError("the llama-server baseline is built from the llama.cpp sources of "
                            "llama-cpp-python, which is not installed: pip install "
                            "'anydraft[llamacpp]', or set ANYDRAFT_LLAMA_SERVER=/path/to/llama-server"
                            ) from exc


def built_path() -> Path:
    """Where `build` puts the binary: one per llama-cpp-python version."""
    from ..models.catalog import cache_dir

    return cache_dir() / "llama-server" / _version() / "llama-server"


def find() -> str | None:
    """The llama-server binary to use, or None when there is none yet (see the module docstring)."""
    given = os.environ.get("ANYDRAFT_LLAMA_SERVER")
    if given:
        if not (os.path.isfile(given) and os.access(given, os.X_OK)):
            raise AnydraftError(f"ANYDRAFT_LLAMA_SERVER={given!r} is not an executable file: "
                                "point it at a llama-server binary, or unset it")
        return given
    on_path = shutil.which("llama-server")
    if on_path:
        return on_path
    try:
        path = built_path()
    except AnydraftError:
        return None
    return str(path) if path.is_file() else None


def build(progress=print) -> str:
    """Compile llama-server once into the cache from the sources of the installed
    llama-cpp-python (its sdist, fetched from the package registry); the binary's path."""
    out = built_path()
    if out.is_file():
        return str(out)
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise AnydraftError(f"building llama-server needs {tool} (apt-get install cmake g++), "
                                "or set ANYDRAFT_LLAMA_SERVER=/path/to/llama-server")
    version = _version()
    jobs = str(os.cpu_count() or 1)
    progress(f"building llama-server from llama-cpp-python {version}'s llama.cpp sources (once, "
             f"about 10 minutes on 2 cores) into {out.parent}")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="anydraft-llama-server-") as tmp:
        _run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
              f"llama-cpp-python=={version}", "-d", tmp],
             f"could not download the llama-cpp-python {version} sources")
        archive = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"), None)
        if archive is None:
            raise AnydraftError(f"pip left no llama-cpp-python {version} source archive in {tmp}")
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        source = next(Path(tmp).glob("llama_cpp_python-*/vendor/llama.cpp"))
        build_dir = source / "build"
        _run(["cmake", "-S", str(source), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
              "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
              "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", *CMAKE_FLAGS],
             "cmake could not configure llama.cpp")
        _run(["cmake", "--build", str(build_dir), "--target", "llama-server", "-j", jobs],
             "llama-server did not compile")
        binary = build_dir / "bin" / "llama-server"
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(f".llama-server.{os.getpid()}.partial")
        shutil.copy2(binary, partial)
        os.replace(partial, out)
    progress(f"built {out} in {time.perf_counter() - start:.0f} s")
    return str(out)


def _run(cmd: list[str], failure: str) -> None:
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        tail = "\n".join(done.stdout.splitlines()[-20:])
        raise AnydraftError(f"{failure} ({' '.join(cmd[:3])} ... exit {done.returncode}); set "
                            f"ANYDRAFT_LLAMA_SERVER=/path/to/llama-server to use another build:\n{tail}")


def find_or_build(progress=print) -> str:
    return find() or build(progress)


@dataclass
class Completion:
    """One `/completion` answer: the new token ids, and the server's own timings."""

    token_ids: list[int]
    seconds: float  # wall time of the request, as the client sees it (prompt read included)
    prompt_tokens: int
    prompt_ms: float
    decode_ms: float  # llama-server's predicted_ms: every new token after the first
    stop_type: str


class LlamaServer:
    """llama-server on loopback for one GGUF file (a context manager); ``parallel`` slots share
    one context of ``parallel x context`` cells, with continuous batching, as users run it."""

    def __init__(self, gguf: str, threads: int, context: int, parallel: int = 1,
                 binary: str | None = None, log: str | os.PathLike | None = None,
                 port: int | None = None):
        self.binary = binary or find_or_build()
        self.gguf, self.threads, self.context, self.parallel = gguf, threads, context, parallel
        self.port = port or free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        self.process: subprocess.Popen | None = None

    @property
    def command(self) -> list[str]:
        # --no-cache-prompt: anydraft reads every request's prompt, so llama-server must too; with
        # its prompt cache on, bench-serve's measured level found the warm-up's prompts still in
        # the slots (TTFT 0.7 s against anydraft's 12 s at 8 clients on the Zen 5)
        return [self.binary, "-m", self.gguf, "-t", str(self.threads), "-tb", str(self.threads),
                "-c", str(self.context * self.parallel), "--parallel", str(self.parallel),
                "--no-cache-prompt", "--host", "127.0.0.1", "--port", str(self.port), "--no-webui"]

    def __enter__(self) -> LlamaServer:
        log = open(self.log_path, "w") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            # as its users run it: without the huge pages anydraft's command asked for itself
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                            env=as_users_run())
        finally:
            if log is not subprocess.DEVNULL:
                log.close()
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AnydraftError(f"llama-server exited with status {self.process.returncode} "
                                    f"at start ({' '.join(self.command)})"
                                    + (f": see {self.log_path}" if self.log_path else ""))
            try:
                with urllib.request.urlopen(f"{self.base}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        self.__exit__(None, None, None)
        raise AnydraftError(f"llama-server did not answer /health within {START_TIMEOUT:.0f} s")

    def __exit__(self, *exc) -> None:
        if self.process is not None:
            stop_process(self.process, 10)
        self.process = None

    def complete(self, prompt_ids: list[int], max_new_tokens: int, timeout: float = 600) -> Completion:
        """Greedy decoding of ``max_new_tokens`` after ``prompt_ids`` (stopping at the model's
        end-of-generation tokens, as anydraft does), with no prompt cache from earlier requests:
        every request reads its whole prompt, as anydraft's runs do."""
        body = {"prompt": list(prompt_ids), "n_predict": max_new_tokens, "temperature": 0.0,
                "top_k": 1, "cache_prompt": False, "return_tokens": True, "stream": False}
        request = urllib.request.Request(f"{self.base}/completion", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        start = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=timeout) as r:
                answer = json.loads(r.read())
        except urllib.error.HTTPError as exc:
            raise AnydraftError(f"llama-server answered {exc.code}: {exc.read()[:300]!r}") from exc
        seconds = time.perf_counter() - start
        timings = answer.get("timings", {})
        return Completion(token_ids=[int(t) for t in answer["tokens"]], seconds=seconds,
                          prompt_tokens=int(timings.get("prompt_n", len(prompt_ids))),
                          prompt_ms=float(timings.get("prompt_ms", 0.0)),
                          decode_ms=float(timings.get("predicted_ms", 0.0)),
                          stop_type=str(answer.get("stop_type", "")))


class ServerBaseline:
    """``anydraft bench --baseline llama-server``: the target's GGUF file on llama-server with
    the threads and context window of anydraft's llama.cpp sessions, started by `start` and
    stopped by `close`; `generate` has the signature of the bench's other baseline (hf)."""

    def __init__(self, spec: str, context: int, progress=print, log=None):
        from ..models.llamacpp import _threads
        from ..models.loading import resolve

        source = resolve(spec)
        if source.gguf_file is None:
            raise AnydraftError(f"--baseline llama-server needs a GGUF target ({spec!r} is not one): "
                                "llama-server runs GGUF files only")
        self.gguf = os.path.join(source.path, source.gguf_file)
        self.server = LlamaServer(self.gguf, _threads(), context, binary=find_or_build(progress),
                                  log=log)
        self.progress = progress

    def start(self) -> ServerBaseline:
        self.server.__enter__()
        self.progress(f"llama-server: {' '.join(self.server.command)}")
        return self

    def close(self) -> None:
        self.server.__exit__(None, None, None)

    def describe(self) -> str:
        s = self.server
        return (f"llama-server baseline: {s.binary} on {os.path.basename(self.gguf)}, {s.threads} "
                f"threads, context {s.context}, /completion with the same prompt token ids, greedy "
                "(temperature 0, top-k 1), no prompt cache; its prefill seconds are the request's "
                "wall time minus the server's own decode time; huge pages "
                f"{'on' if state(as_users_run())[0] else 'off'} for it, as the bench was started "
                "(models/hugepages.py)")

    def generate(self, ids: list[int], max_new_tokens: int, params, eos_ids) -> tuple[list[int], float, float]:
        """The new tokens (llama-server stops at the model's end-of-generation tokens, as
        anydraft does at ``eos_ids``), the request's wall seconds, and the part of them before
        its decoding (the prompt read and the HTTP round trip)."""
        assert params.greedy, "llama-server baseline: greedy only (checked by the bench's settings)"
        done = self.server.complete(ids, max_new_tokens)
        return done.token_ids, done.seconds, max(0.0, done.seconds - done.decode_ms / 1000)


if __name__ == "__main__":  # python -m anydraft.bench.llama_server: find or build it, print its path
    try:
        print(find_or_build(lambda msg: print(msg, file=sys.stderr)))
    except AnydraftError as exc:
        print(f"anydraft: error: {exc}", file=sys.stderr)
        sys.exit(2)
