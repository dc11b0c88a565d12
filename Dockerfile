# Builds the cachewright binary and runs `cachewright serve`.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
# Without the `dev` feature: the image carries no tool that rewrites data.
RUN cargo build --release --locked --bin cachewright

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/cachewright /usr/local/bin/cachewright
USER nobody
EXPOSE 3002
# Reachable from outside the container only where it is published; keep the
# port private (see docs/DEPLOYMENT.md, "Exposing the HTTP endpoint").
ENV CACHEWRIGHT_HTTP_ADDR=0.0.0.0:3002
# mimalloc commits its arena as it goes instead of up front: a few MiB
# less resident for the long-running watcher, no CPU cost measured
# (docs/DEPLOYMENT.md, "Process memory").
ENV MIMALLOC_ARENA_EAGER_COMMIT=0
HEALTHCHECK --interval=30s --timeout=5s CMD curl -fsS http://127.0.0.1:3002/health/live || exit 1
ENTRYPOINT ["cachewright"]
CMD ["serve"]
