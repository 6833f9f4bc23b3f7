"""`anydraft serve`: an OpenAI-compatible HTTP server over a `Decoder`.

Layout: `cli` (the `serve` subcommand) and `options` (its options) build a `config`
(`ServerConfig`) and the `workers` (decoders); `app` (`create_app`) builds the `state` every
handler shares and registers the `routes`: `completions` (chat and text, their jobs in
`generation`, bodies read by `body`, `logprobs` written as OpenAI does), /v1/models, /health,
/metrics and the playground. `gate` checks Host names, the API key and the connections' cap
(`connections`); `errors` is what a client sees when something fails; `scheduler` is the fair,
bounded queue feeding one worker thread per decoder; `metrics` (Prometheus); `schemas` (request
validation); `shutdown` (draining on SIGTERM); `deploy` (Ray Serve). Nothing here is imported
by `anydraft` itself, so the core library never needs FastAPI.
"""
