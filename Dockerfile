# One image for the controller, the router and the planning CronJob:
#   docker build -t lorafleet:0.1.0 .   then   docker run lorafleet:0.1.0 --help
# The base image is pinned to an exact release; pin its digest too in CI
# (docker buildx imagetools inspect python:3.11.9-slim-bookworm).
FROM python:3.11.9-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY placement ./placement
COPY models ./models
COPY policies ./policies
RUN python -m venv /opt/lorafleet && /opt/lorafleet/bin/pip install --no-compile .

FROM python:3.11.9-slim-bookworm
ENV PATH=/opt/lorafleet/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/lorafleet /opt/lorafleet
RUN groupadd --gid 10001 lorafleet && \
    useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin lorafleet
USER 10001:10001
WORKDIR /tmp
EXPOSE 8080
ENTRYPOINT ["lorafleet"]
CMD ["--help"]
