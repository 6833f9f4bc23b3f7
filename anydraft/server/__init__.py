"""`anydraft serve`: an OpenAI-compatible HTTP server over a `Decoder`.

Layout: `schemas` (request validation), `scheduler` (fair bounded queue feeding one worker
thread per decoder), `metrics` (Prometheus), `app` (FastAPI routes and error mapping),
`cli` (the `serve` subcommand). Nothing here is imported by `anydraft` itself, so the core
library never needs FastAPI.
"""
