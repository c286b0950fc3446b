# The leakprobe daemon image: `docker build -t leakprobe .` (CPU), or for embedding on NVIDIA GPUs:
#   docker build --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu126 -t leakprobe:cuda .
# The install steps are the ones `make setup` runs in the test suite: torch pinned first from the chosen
# index (so nothing can pull another build), then the dependencies, then the package. Dependencies and
# code are separate layers, so a code change rebuilds in seconds. The embedding models and the canary
# packs are inside the image; the last build step loads the models with every model hub switched off.
# Without a registry (podman, Debian's archive, a local torch wheel): `make image`, see tests/support/containers.py.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# The project's dependencies alone, read from pyproject.toml: the layers below are reused until that list
# itself changes (not on code changes, nor on edits elsewhere in pyproject.toml).
FROM ${PYTHON_IMAGE} AS requirements
COPY pyproject.toml /tmp/
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('/tmp/pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /requirements.txt

FROM ${PYTHON_IMAGE} AS deps
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/leakprobe
ENV PATH=/opt/leakprobe/bin:$PATH
RUN pip install --index-url "${TORCH_INDEX}" "torch==${TORCH_VERSION}"
COPY --from=requirements /requirements.txt /tmp/
RUN pip install --requirement /tmp/requirements.txt && rm /tmp/requirements.txt

FROM deps AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY prober ./prober
COPY canaries ./canaries
RUN pip wheel --no-deps --wheel-dir /wheels .

# The image is the dependencies' stage plus the package: no copy of the 1.7 GB environment to commit again.
FROM deps
LABEL org.opencontainers.image.title="leakprobe" \
      org.opencontainers.image.description="Cross-tenant leakage prober for multi-tenant LLM inference endpoints" \
      org.opencontainers.image.source="https://github.com/leakprobe/leakprobe" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 leakprobe \
    && useradd --system --uid 10001 --gid leakprobe --home-dir /var/lib/leakprobe --shell /usr/sbin/nologin leakprobe \
    && mkdir -p /var/lib/leakprobe /etc/leakprobe \
    && chown leakprobe:leakprobe /var/lib/leakprobe
# A COPY, not a RUN --mount from the stage: buildah's layer cache does not see a mounted stage change.
COPY --from=wheel /wheels /tmp/wheels
RUN pip install --no-deps --no-index /tmp/wheels/*.whl && rm -rf /tmp/wheels && pip check
# Offline by construction: no model hub, no bytecode writes on a read-only root, caches under /tmp.
ENV PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    HF_HOME=/tmp/huggingface
USER 10001:10001
WORKDIR /var/lib/leakprobe
RUN python -c "from prober.embeddings import MINILM, make_embedder; make_embedder().load(); make_embedder(MINILM, 'cpu').load()"
EXPOSE 10461
ENTRYPOINT ["leakprobe"]
CMD ["daemon", "--config", "/etc/leakprobe/config/leakprobe.yaml", "--listen", "0.0.0.0:10461"]
