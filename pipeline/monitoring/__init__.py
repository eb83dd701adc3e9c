"""Monitoring a served LPX model: one metric vocabulary on every target, rules, a dashboard and `lpx top`.

  promql.py     the vocabulary: which metric families and labels every target publishes (Triton's
                nv_inference_* / nv_gpu_*, the TensorRT-LLM backend's nv_trt_llm_* and nv_llm_*, the
                gateway's lpx_gateway_*), and the recorded series LPX's rules derive from them
  rules.py      Prometheus recording and alerting rules, with their thresholds, as data
  dashboard.py  the Grafana dashboard, built with grafana-foundation-sdk
  write.py      `lpx monitoring --out DIR`: dashboard JSON, a ConfigMap for Grafana's sidecar, the rules
  scrape.py     reading a /metrics endpoint (prometheus_client's parser) and rates between two reads
  top.py        `lpx top`: the figures of a running server, rendered with rich

docs/monitoring.md has what each target publishes and the rules' thresholds.
"""
