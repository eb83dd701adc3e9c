"""The OpenAI-compatible gateway `lpx serve` starts beside tritonserver (docs/gateway.md).

A FastAPI + uvicorn process that tokenizes, streams token ids to and from the `tensorrt_llm` model over
gRPC (no preprocessing / postprocessing / ensemble hop), detokenizes and applies stop sequences itself.

  settings.py    what one gateway process runs with (from lpx.yaml's serving.openai)
  process.py     `python -m pipeline.gateway`, uvicorn, and GatewayProcess (start / drain / stop)
  app.py         the generation routes (outside FastAPI's stack), streaming, disconnects
  routes.py      the other routes: health, /version, models, metrics, vLLM's /tokenize and /detokenize
  responses_api.py  /v1/responses (OpenAI's Responses API for text) on the same path
  middleware.py  request id, body limit, API keys, access log and metrics per request
  body.py        the body before its model: media type, UTF-8, strict JSON
  schemas.py     the request bodies and what is refused
  plan.py        a request as one plan per choice: lengths, sampling, guides, tools; every 400 decided
  generation.py  one plan run: the engine's token stream as text, stop sequences, counts
  choices.py     the choices of one request (prompts x n) run together, merged, usage summed
  text.py        tokenizer, chat template, incremental detokenizer, stop sequences
  triton.py      the gRPC side: the model's interface, one streaming call per request, cancellation
  responses.py   OpenAI's response objects and server-sent events
  api_keys.py    hashed API keys (`lpx keys`); ratelimit.py per-key limits; metrics.py metrics + access log
  errors.py      every error in OpenAI's shape
"""
