"""The server processes LPX runs, below the stages and the gateway that use them:

  child.py         every child process written once: its own session, dies with its parent, stopped as a
                   group, its log's tail; free and busy ports (tritonserver, the gateway, trtllm-build)
  tritonserver.py  the tritonserver process: ports, readiness, one restart after a known abort, clean stop
  binary.py        finding tritonserver; the nvidia-pytriton wheel's backends and environment
  ranks.py         the MPI command line for an engine built for several GPUs
  selection.py     which engine this machine may serve (GPU arch, TensorRT-LLM version)
  repository.py    which repository to serve from a packaged folder (`lpx serve --repo`, the pods)
Composing them with the stages ("build, choose, start Triton and the gateway, stop") is pipeline/served.py.
"""
