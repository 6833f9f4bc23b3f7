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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import AnydraftError
from ..hardware.hugepages import as_users_run, state
from ..models.engines import IK_BUILD
from .processes import free_port, stop_process

# the flags `make install` compiles llama-cpp-python with (Makefile: LLAMA_BUILD), so the two
# builds run the same kernels: llama.cpp's AMX kernels crash on virtual machines (llama.cpp#20824)
CMAKE_FLAGS = ["-DCMAKE_C_FLAGS=-mno-amx-int8", "-DCMAKE_CXX_FLAGS=-mno-amx-int8"]
# a model load takes seconds (mmap); a server not answering /health by then has failed
START_TIMEOUT = 120.0


@dataclass(frozen=True)
class Flavor:
    """A plain server a CPU user would run on a GGUF file, and the sources it is built from:
    the sdist of the Python package that runs the same engine inside anydraft."""

    name: str  # the binary's name in the cache, and the baseline's name in reports
    label: str  # for people
    package: str  # the Python package whose sdist vendors the engine's tree
    tree: str  # the engine's folder inside the sdist
    env: str  # the environment variable that names another binary
    options: tuple[str, ...] = ()  # cmake options beyond the common ones
    prepare: Callable[[Path], None] | None = None  # fixes the tree needs before cmake
    # the server's own flags beyond model, threads, context, slots and address: as users run it
    flags: tuple[str, ...] = ()
    # and those it needs to serve several slots
    parallel_flags: tuple[str, ...] = ()
    # what is built (cmake targets) and kept (they and, built shared, every library of build/bin
    # are copied into the cache)
    targets: tuple[str, ...] = ("llama-server",)


def _prepare_ik(source: Path) -> None:
    """ik_llama.cpp's tree as its sdist ships it does not configure: no git, so its build-info
    script (common/cmake/build-info-gen-cpp.cmake, not shipped) must write build-info.cpp from
    its template; and examples/ names folders the sdist leaves out, so only the server (with
    the multimodal library it links) and llama-bench are built."""
    (source / "common" / "cmake").mkdir(exist_ok=True)
    (source / "common" / "cmake" / "build-info-gen-cpp.cmake").write_text(
        'set(BUILD_NUMBER 0)\nset(BUILD_COMMIT "sdist")\n'
        'set(BUILD_COMPILER "${CMAKE_C_COMPILER_ID} ${CMAKE_C_COMPILER_VERSION}")\n'
        'set(BUILD_TARGET "")\nconfigure_file(common/build-info.cpp.in common/build-info.cpp)\n')
    (source / "examples" / "CMakeLists.txt").write_text(
        "find_package(Threads REQUIRED)\ninclude_directories(${CMAKE_CURRENT_SOURCE_DIR})\n"
        "add_subdirectory(mtmd)\nadd_subdirectory(llama-bench)\nadd_subdirectory(server)\n")
    (source / "pocs" / "CMakeLists.txt").parent.mkdir(exist_ok=True)
    (source / "pocs" / "CMakeLists.txt").write_text("")


# --no-cache-prompt: anydraft reads every request's prompt, so llama-server must too; with its
# prompt cache on, bench-serve's measured level found the warm-up's prompts still in the slots
# (TTFT 0.7 s against anydraft's 12 s at 8 clients on the Zen 5)
LLAMA_SERVER = Flavor("llama-server", "llama-server", "llama-cpp-python", "vendor/llama.cpp",
                      "ANYDRAFT_LLAMA_SERVER", ("-DLLAMA_BUILD_EXAMPLES=OFF", "-DBUILD_SHARED_LIBS=OFF"),
                      flags=("--no-cache-prompt", "--no-webui"))
# ik_llama.cpp's own server (models/engines.py): built for this CPU (its AVX-512 kernels where it
# has them), as its users build it, with the flash-attention kernels of the common KV types only;
# with llama-bench, and its libraries shared (found beside the binaries: $ORIGIN), so that the
# ik backend can load this CPU's build instead of the wheel's AVX2 one (models/engines.py)
IK_SERVER = Flavor(IK_BUILD, "ik_llama.cpp's llama-server", "ik-llama-cpp-python",
                   "vendor/ik_llama.cpp", "ANYDRAFT_IK_LLAMA_SERVER",
                   ("-DLLAMA_BUILD_EXAMPLES=ON", "-DLLAMA_BUILD_SERVER=ON", "-DGGML_IQK_FA_ALL_QUANTS=OFF",
                    "-DBUILD_SHARED_LIBS=ON", "-DCMAKE_BUILD_RPATH=$ORIGIN"),
                   _prepare_ik,
                   # run-time repack (as anydraft's ik backend loads): one token as fast as llama.cpp's;
                   # it has no flag for the prompt cache, which each request turns off
                   flags=("-rtr",), targets=("llama-bench", "llama-server"),
                   # its flash attention aborts on a batch of several sequences (GGML_ASSERT(S > 0)
                   # in iqk_fa_templates.h, seen with --parallel 8), as in anydraft's ik batches
                   parallel_flags=("-fa", "off"))
FLAVORS = {flavor.name: flavor for flavor in (LLAMA_SERVER, IK_SERVER)}
SERVERS = tuple(FLAVORS)  # the plain servers' names: bench's baselines, bench-serve's configurations


def _version(flavor: Flavor = LLAMA_SERVER) -> str:
    try:
        from importlib.metadata import version

        return version(flavor.package)
    except Exception as exc:  # noqa: BLE001 - any failure means: not installed
        raise AnydraftError(f"the {flavor.label} baseline is built from the sources of {flavor.package}, "
                            f"which is not installed: pip install it (anydraft's extras install it), "
                            f"or set {flavor.env}=/path/to/llama-server") from exc


def built_path(flavor: Flavor = LLAMA_SERVER) -> Path:
    """Where `build` puts the binary: one per version of the package it is built from."""
    from ..atomic import cache_dir

    return cache_dir() / flavor.name / _version(flavor) / "llama-server"


def find(flavor: Flavor = LLAMA_SERVER) -> str | None:
    """The server binary to use, or None when there is none yet (see the module docstring)."""
    given = os.environ.get(flavor.env)
    if given:
        if not (os.path.isfile(given) and os.access(given, os.X_OK)):
            raise AnydraftError(f"{flavor.env}={given!r} is not an executable file: "
                                "point it at a llama-server binary, or unset it")
        return given
    on_path = shutil.which("llama-server") if flavor is LLAMA_SERVER else None
    if on_path:
        return on_path
    try:
        path = built_path(flavor)
    except AnydraftError:
        return None
    return str(path) if path.is_file() else None


def build(progress=print, flavor: Flavor = LLAMA_SERVER) -> str:
    """Compile the server once into the cache from the sources of the installed package (its
    sdist, fetched from the package registry); the binary's path. llama-bench is built beside
    ik_llama.cpp's server (``doctor``'s curves are checked against it, docs/hardware.md)."""
    out = built_path(flavor)
    if out.is_file():
        return str(out)
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise AnydraftError(f"building {flavor.label} needs {tool} (apt-get install cmake g++), "
                                f"or set {flavor.env}=/path/to/llama-server")
    version = _version(flavor)
    jobs = str(os.cpu_count() or 1)
    progress(f"building {flavor.label} from {flavor.package} {version}'s sources (once, 10-20 "
             f"minutes on 2 cores) into {out.parent}")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"anydraft-{flavor.name}-") as tmp:
        _run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
              f"{flavor.package}=={version}", "-d", tmp],
             f"could not download the {flavor.package} {version} sources", flavor)
        archive = next(Path(tmp).glob("*.tar.gz"), None)
        if archive is None:
            raise AnydraftError(f"pip left no {flavor.package} {version} source archive in {tmp}")
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        source = next(Path(tmp).glob(f"*/{flavor.tree}"))
        if flavor.prepare:
            flavor.prepare(source)
        build_dir = source / "build"
        _run(["cmake", "-S", str(source), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
              f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={build_dir / 'bin'}", "-DLLAMA_CURL=OFF",
              "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", *flavor.options, *CMAKE_FLAGS],
             f"cmake could not configure {flavor.label}", flavor)
        _run(["cmake", "--build", str(build_dir), "--target", *flavor.targets, "-j", jobs],
             f"{flavor.label} did not compile", flavor)
        out.parent.mkdir(parents=True, exist_ok=True)
        # the libraries first, the server last: its presence says the build is whole
        for product in [*sorted((build_dir / "bin").glob("lib*.so")), *(build_dir / "bin" / t for t in flavor.targets)]:
            partial = out.with_name(f".{product.name}.{os.getpid()}.partial")
            shutil.copy2(product, partial)
            os.replace(partial, out.with_name(product.name))
    progress(f"built {out} in {time.perf_counter() - start:.0f} s")
    return str(out)


def _run(cmd: list[str], failure: str, flavor: Flavor) -> None:
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        tail = "\n".join(done.stdout.splitlines()[-20:])
        raise AnydraftError(f"{failure} ({' '.join(cmd[:3])} ... exit {done.returncode}); set "
                            f"{flavor.env}=/path/to/llama-server to use another build:\n{tail}")


def find_or_build(progress=print, flavor: Flavor = LLAMA_SERVER) -> str:
    return find(flavor) or build(progress, flavor)


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
                 port: int | None = None, flavor: Flavor = LLAMA_SERVER):
        self.flavor = flavor
        self.binary = binary or find_or_build(flavor=flavor)
        self.gguf, self.threads, self.context, self.parallel = gguf, threads, context, parallel
        self.port = port or free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        self.process: subprocess.Popen | None = None

    @property
    def command(self) -> list[str]:
        return [self.binary, "-m", self.gguf, "-t", str(self.threads), "-tb", str(self.threads),
                "-c", str(self.context * self.parallel), "--parallel", str(self.parallel),
                "--host", "127.0.0.1", "--port", str(self.port), *self.flavor.flags,
                *(self.flavor.parallel_flags if self.parallel > 1 else ())]

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
        tokens = answer.get("tokens")
        if tokens is None:  # ik_llama.cpp's server answers text only: its own tokenizer's ids
            tokens = self._tokenize(answer["content"])
        return Completion(token_ids=[int(t) for t in tokens], seconds=seconds,
                          prompt_tokens=int(timings.get("prompt_n", len(prompt_ids))),
                          prompt_ms=float(timings.get("prompt_ms", 0.0)),
                          decode_ms=float(timings.get("predicted_ms", 0.0)),
                          stop_type=str(answer.get("stop_type", "")))


    def _tokenize(self, text: str) -> list[int]:
        """``text`` in the server's own token ids (its /tokenize endpoint). Greedy text
        re-tokenized can differ from the ids generated where a tokenizer merges across them."""
        request = urllib.request.Request(f"{self.base}/tokenize", headers={"Content-Type": "application/json"},
                                         data=json.dumps({"content": text, "add_special": False}).encode())
        with urllib.request.urlopen(request, timeout=60) as r:
            return list(json.loads(r.read())["tokens"])


class ServerBaseline:
    """``anydraft bench --baseline llama-server``: the target's GGUF file on llama-server with
    the threads and context window of anydraft's llama.cpp sessions, started by `start` and
    stopped by `close`; `generate` has the signature of the bench's other baseline (hf)."""

    def __init__(self, spec: str, context: int, progress=print, log=None, flavor: Flavor = LLAMA_SERVER):
        from ..models.llamacpp import _threads
        from ..models.loading import resolve

        source = resolve(spec)
        if source.gguf_file is None:
            raise AnydraftError(f"--baseline {flavor.name} needs a GGUF target ({spec!r} is not one): "
                                "llama-server runs GGUF files only")
        self.gguf, self.flavor = os.path.join(source.path, source.gguf_file), flavor
        self.server = LlamaServer(self.gguf, _threads(), context, binary=find_or_build(progress, flavor),
                                  log=log, flavor=flavor)
        self.progress = progress

    def start(self) -> ServerBaseline:
        self.server.__enter__()
        self.progress(f"{self.flavor.name}: {' '.join(self.server.command)}")
        return self

    def close(self) -> None:
        self.server.__exit__(None, None, None)

    def describe(self) -> str:
        s = self.server
        return (f"{self.flavor.name} baseline: {s.binary} on {os.path.basename(self.gguf)}, {s.threads} "
                f"threads, context {s.context}, /completion with the same prompt token ids, greedy "
                "(temperature 0, top-k 1), no prompt cache; its prefill seconds are the request's "
                "wall time minus the server's own decode time; huge pages "
                f"{'on' if state(as_users_run())[0] else 'off'} for it, as the bench was started "
                "(hardware/hugepages.py)")

    def generate(self, ids: list[int], max_new_tokens: int, params, eos_ids) -> tuple[list[int], float, float]:
        """The new tokens (llama-server stops at the model's end-of-generation tokens, as
        anydraft does at ``eos_ids``), the request's wall seconds, and the part of them before
        its decoding (the prompt read and the HTTP round trip)."""
        assert params.greedy, "llama-server baseline: greedy only (checked by the bench's settings)"
        done = self.server.complete(ids, max_new_tokens)
        return done.token_ids, done.seconds, max(0.0, done.seconds - done.decode_ms / 1000)


if __name__ == "__main__":  # python -m anydraft.bench.llama_server [ik-llama-server]: find or build it
    try:
        print(find_or_build(lambda msg: print(msg, file=sys.stderr), FLAVORS[(sys.argv[1:] or ["llama-server"])[0]]))
    except AnydraftError as exc:
        print(f"anydraft: error: {exc}", file=sys.stderr)
        sys.exit(2)
