# The leakprobe daemon image: `docker build -t leakprobe .` (CPU), or for embedding on NVIDIA GPUs:
#   docker build --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu126 -t leakprobe:cuda .
# The install steps are the ones `make setup` runs in the test suite: torch pinned first from the chosen
# index (so nothing can pull another build), then the package. The embedding models and the canary packs
# are inside the image; the last build step loads the model with the network switched off.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/leakprobe
ENV PATH=/opt/leakprobe/bin:$PATH
RUN pip install --index-url "${TORCH_INDEX}" "torch==${TORCH_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY prober ./prober
COPY canaries ./canaries
RUN pip install . && pip check

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="leakprobe" \
      org.opencontainers.image.description="Cross-tenant leakage prober for multi-tenant LLM inference endpoints" \
      org.opencontainers.image.source="https://github.com/leakprobe/leakprobe" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 leakprobe \
    && useradd --system --uid 10001 --gid leakprobe --home-dir /var/lib/leakprobe --shell /usr/sbin/nologin leakprobe \
    && mkdir -p /var/lib/leakprobe /etc/leakprobe \
    && chown leakprobe:leakprobe /var/lib/leakprobe
COPY --from=build /opt/leakprobe /opt/leakprobe
# Offline by construction: no model hub, no bytecode writes on a read-only root, caches under /tmp.
ENV PATH=/opt/leakprobe/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    HF_HOME=/tmp/huggingface
USER 10001:10001
WORKDIR /var/lib/leakprobe
RUN --network=none python -c "from prober.embeddings import MINILM, make_embedder; make_embedder().load(); make_embedder(MINILM, 'cpu').load()"
EXPOSE 10461
ENTRYPOINT ["leakprobe"]
CMD ["daemon", "--config", "/etc/leakprobe/config/leakprobe.yaml", "--listen", "0.0.0.0:10461"]
