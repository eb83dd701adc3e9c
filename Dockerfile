# LPX inside NVIDIA's Triton + TensorRT-LLM container.
#
# NOT BUILT IN LPX's CI: those machines have no GPU, no container daemon and no access to nvcr.io;
# tests/test_deploy.py lints it (hadolint, checkov). Kept deliberately simple. LPX is installed on top of the container's own torch, TensorRT-LLM, ModelOpt
# and /opt/tritonserver: plain `pip install .` with the ranges in pyproject.toml, no constraints
# file and no [triton] extra, and the build fails if pip replaced any of them.
#
# The default base ships TensorRT-LLM 1.2.1 (Triton's Release Compatibility Matrix), the line the engine
# target builds for by default (build.trtllm_version 1.2; pipeline/facts/images.py and
# tests/contracts/base_images.json hold the figures, tests/test_base_images.py this ARG). For another line
# build on its container and tell `lpx deploy` (deploy.image_base), which refuses a mismatch:
#   docker build --build-arg BASE_IMAGE=nvcr.io/nvidia/tritonserver:24.12-trtllm-python-py3 .   (0.16)
# Run:  docker run --gpus all --rm -p 8001:8001 -v $PWD/models:/models:ro -v lpx-home:/home/lpx/.lpx lpx \
#         serve -c /models/lpx.yaml --host 0.0.0.0   (LPX binds 127.0.0.1 unless told otherwise)
ARG BASE_IMAGE=nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3
FROM ${BASE_IMAGE}
# checkov:skip=CKV_DOCKER_7: the tag is in ARG BASE_IMAGE above (versioned); checkov does not resolve ARGs
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

COPY pyproject.toml README.md /opt/lpx/
COPY pipeline /opt/lpx/pipeline
COPY model_repo /opt/lpx/model_repo
RUN python3 -m pip freeze | grep -iE '^(torch|tensorrt.llm|nvidia-modelopt|transformers)==' | sort > /tmp/before.txt \
 && python3 -m pip install --no-cache-dir /opt/lpx \
 && python3 -m pip freeze | grep -iE '^(torch|tensorrt.llm|nvidia-modelopt|transformers)==' | sort > /tmp/after.txt \
 && diff /tmp/before.txt /tmp/after.txt \
 && lpx --version

# sshd: in a LeaderWorkerSet group (an engine spanning nodes) mpirun starts the worker pods' ranks over
# SSH on port 2222 (pipeline/deploy/k8s.py); unused otherwise.
# DL3008 (apt version pins) ignored: the base image's Ubuntu archive fixes the version; a pin breaks on every base bump
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends openssh-server \
 && rm -rf /var/lib/apt/lists/*
# uid 1000: Triton's build.py creates triton-server (uid and gid 1000) in its images and asserts it, so a
# `useradd --uid 1000` fails there ("UID 1000 is not unique"). LPX runs as uid 1000 whatever its name (the
# manifests' runAsUser), with HOME and LPX_HOME owned by it; a base without the user gets one, lpx.
RUN getent passwd 1000 > /dev/null || useradd --uid 1000 --user-group --no-create-home --home-dir /home/lpx lpx \
 && install -d -o 1000 -g 1000 -m 0755 /home/lpx /home/lpx/.lpx
USER 1000
ENV HOME=/home/lpx LPX_HOME=/home/lpx/.lpx
WORKDIR /home/lpx
# The model folder is mounted read-only at /models; all LPX state goes to LPX_HOME.
VOLUME ["/models", "/home/lpx/.lpx"]
EXPOSE 8000 8001 8002 2222
# Kubernetes probes Triton's /v2/health/{live,ready} (pipeline/deploy/k8s.py); this is for plain docker run.
HEALTHCHECK --interval=30s --timeout=5s --start-period=900s \
  CMD ["python3", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/v2/health/live', timeout=4)"]
ENTRYPOINT ["lpx"]
CMD ["--help"]
