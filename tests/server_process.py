"""A real `anydraft serve` process (uvicorn on 127.0.0.1), for any test folder that needs one."""

from __future__ import annotations

import sys
from pathlib import Path

from anydraft.bench.serve import ServerProcess, free_port

MODEL_ID = "tiny"  # the name the server serves its target under (--served-model-name)


class Server(ServerProcess):
    def __init__(self, model_dir: Path | str, log_path: Path, *extra: str, api_key: str | None = None,
                 dtype: str = "float32"):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        # ``dtype`` on torch; a llama.cpp target runs the GGUF as it is (a dtype there is an error)
        llamacpp = any(a == "llamacpp" and b == "--target-backend" for b, a in zip(extra, extra[1:], strict=False))
        dtype_args = [] if llamacpp else ["--dtype", dtype]
        cmd = [sys.executable, "-m", "anydraft", "serve", "--target", str(model_dir),
               "--served-model-name", MODEL_ID, "--port", str(self.port), *dtype_args,
               "--log-level", "warning", *extra]
        if api_key:
            cmd += ["--api-key", api_key]
        super().__init__(cmd, log_path, OMP_NUM_THREADS="1")

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def wait_ready(self, timeout: float = 180) -> dict:
        return super().wait_ready(self.base, timeout, "test")

    def alive(self) -> bool:
        return self.proc.poll() is None
