# LPX inside NVIDIA's Triton + TensorRT-LLM container.
#
# NOT BUILT OR TESTED IN LPX's CI: those machines have no GPU and no access to nvcr.io. Kept
# deliberately simple. LPX is installed on top of the container's own torch, TensorRT-LLM, ModelOpt
# and /opt/tritonserver: plain `pip install .` with the ranges in pyproject.toml, no constraints
# file and no [triton] extra, and the build fails if pip replaced any of them.
#
# 25.12 ships TensorRT-LLM 1.1.0 (NVIDIA's compatibility matrix); for the 1.2.x line pass the tag that
# ships it: docker build --build-arg BASE_IMAGE=nvcr.io/nvidia/tritonserver:<tag>-trtllm-python-py3 .
# Run:  docker run --gpus all --rm -p 8001:8001 -v $PWD/models:/models:ro -v lpx-home:/home/lpx/.lpx lpx \
#         serve -c /models/lpx.yaml --host 0.0.0.0   (LPX binds 127.0.0.1 unless told otherwise)
ARG BASE_IMAGE=nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3
FROM ${BASE_IMAGE}

COPY pyproject.toml README.md /opt/lpx/
COPY pipeline /opt/lpx/pipeline
COPY model_repo /opt/lpx/model_repo
RUN python3 -m pip freeze | grep -iE '^(torch|tensorrt.llm|nvidia-modelopt|transformers)==' | sort > /tmp/before.txt \
 && python3 -m pip install --no-cache-dir /opt/lpx \
 && python3 -m pip freeze | grep -iE '^(torch|tensorrt.llm|nvidia-modelopt|transformers)==' | sort > /tmp/after.txt \
 && diff /tmp/before.txt /tmp/after.txt \
 && lpx --version

RUN useradd --create-home --uid 1000 lpx
USER lpx
ENV LPX_HOME=/home/lpx/.lpx
WORKDIR /home/lpx
# The model folder is mounted read-only at /models; all LPX state goes to LPX_HOME.
VOLUME ["/models", "/home/lpx/.lpx"]
EXPOSE 8000 8001 8002
ENTRYPOINT ["lpx"]
CMD ["--help"]
