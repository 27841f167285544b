# The llmplane image: operator, gateway and the model-loader init container
# (`llmplane operator`, `llmplane gateway --kubernetes`, `llmplane epp --kubernetes`,
# `llmplane load-model`).
#   docker build -t ghcr.io/llmplane/llmplane:0.1.0 .
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY llmplane ./llmplane
# Wheels for the project and its kubernetes/hubs/objectstores/epp extras (the loader reads every
# model source); no compilers in the final image.
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[kubernetes,hubs,objectstores,epp]"

FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    LLMPLANE_HOME=/tmp/llmplane
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels "llmplane[kubernetes,hubs,objectstores,epp]" \
    && rm -rf /wheels \
    && useradd --uid 10001 --create-home --shell /usr/sbin/nologin llmplane
USER 10001
WORKDIR /home/llmplane
ENTRYPOINT ["llmplane"]
CMD ["--help"]
