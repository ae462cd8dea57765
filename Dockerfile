# syntax=docker/dockerfile:1
# vigia's container image. Named Dockerfile rather than Containerfile: `docker build .`
# reads only a Dockerfile by default, and podman/buildah look for Containerfile and then
# Dockerfile, so both build it without -f (and both read .dockerignore).
#
#   docker build -t vigia .
#   docker run -d --name vigia -p 8080:8080 -v vigia-data:/var/lib/vigia vigia
#
# The shipped config.toml and rules/ are in /etc/vigia; mount your own rules over
# /etc/vigia/rules (read-only is fine), set tokens with -e VIGIA_ADMIN_TOKEN=… and
# -e VIGIA_CHECK_TOKEN=…, and a shared Redis with -e VIGIA_STORE=redis -e VIGIA_REDIS_URL=….

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-bookworm AS builder
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /build

# Dependencies alone, on stub sources (and a stub per [[bench]], which the manifest
# names): this layer is rebuilt only when Cargo.toml or Cargo.lock change.
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src benches \
 && echo 'fn main() {}' > src/main.rs \
 && touch src/lib.rs \
 && awk '/^\[\[bench\]\]/ { b = 1; next } /^\[/ { b = 0 } b && $1 == "name" { gsub(/"/, "", $3); print $3 }' Cargo.toml \
    | while read -r bench; do echo 'fn main() {}' > "benches/${bench}.rs"; done \
 && cargo build --release --locked \
 && rm -rf src benches

COPY src ./src
COPY lua ./lua
COPY benches ./benches
# COPY keeps the files' own times, which may be older than the stubs': touch the crate
# roots so cargo rebuilds the library and the binary from the real sources.
RUN touch src/lib.rs src/main.rs \
 && cargo build --release --locked \
 && install -m 0755 target/release/vigia /usr/local/bin/vigia

FROM debian:bookworm-slim
# bash, head and grep (all in the base image) are the health check's whole toolkit.
RUN groupadd --system --gid 10001 vigia \
 && useradd --system --uid 10001 --gid vigia --home-dir /var/lib/vigia --no-create-home \
      --shell /usr/sbin/nologin vigia \
 && mkdir -p /var/lib/vigia \
 && chown vigia:vigia /var/lib/vigia
COPY --from=builder /usr/local/bin/vigia /usr/local/bin/vigia
COPY config.toml /etc/vigia/config.toml
COPY rules /etc/vigia/rules
WORKDIR /var/lib/vigia
# Every address, so a published port reaches it: set VIGIA_CHECK_TOKEN (or keep the port on
# a private network), else /v1/check answers anyone and the service warns at start.
ENV VIGIA_LISTEN=0.0.0.0:8080 \
    VIGIA_RULES_DIR=/etc/vigia/rules \
    VIGIA_DATA_DIR=/var/lib/vigia
# sled: the embedded windows, the event journal, trust, behaviour snapshots.
VOLUME ["/var/lib/vigia"]
EXPOSE 8080
# Numeric, so runAsNonRoot-style checks can verify it without the image's /etc/passwd.
USER 10001:10001
# Ready, not just alive: 200 from /readyz (rules loaded, store answering). An HTTP/1.0
# request over bash's /dev/tcp, on the port VIGIA_LISTEN names; no curl in the image.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/${VIGIA_LISTEN##*:} && printf 'GET /readyz HTTP/1.0\\r\\n\\r\\n' >&3 && head -n 1 <&3 | grep -q ' 200 '"]
ENTRYPOINT ["vigia"]
CMD ["serve", "--config", "/etc/vigia/config.toml"]
