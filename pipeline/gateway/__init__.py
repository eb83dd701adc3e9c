"""The OpenAI-compatible gateway `lpx serve` starts beside tritonserver (docs/gateway.md).

A FastAPI + uvicorn process that tokenizes, streams token ids to and from the `tensorrt_llm` model over
gRPC (no preprocessing / postprocessing / ensemble hop), detokenizes and applies stop sequences itself.

  settings.py    what one gateway process runs with (from lpx.yaml's serving.openai)
  process.py     `python -m pipeline.gateway`, uvicorn, and GatewayProcess (start / drain / stop)
  app.py         the routes (the generation ones outside FastAPI's stack), streaming, disconnects
  middleware.py  request id, body limit, API keys, access log and metrics per request
  schemas.py     the request bodies and what is refused
  generation.py  one request on the fast path: lengths, sampling inputs, the token stream as text
  text.py        tokenizer, chat template, incremental detokenizer, stop sequences
  triton.py      the gRPC side: the model's interface, one streaming call per request, cancellation
  responses.py   OpenAI's response objects and server-sent events
  api_keys.py    hashed API keys (`lpx keys`); ratelimit.py per-key limits; metrics.py metrics + access log
  errors.py      every error in OpenAI's shape
"""
