# botfleet: a multi-stage build. The first stage compiles the release binary; the runtime
# image holds that binary, CA certificates and a non-root user, nothing else.
#
#   docker build -t botfleet .
#   docker run --rm -e BOTFLEET_DATABASE_URL=... -e BOTFLEET_REDIS_URL=... botfleet
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p botfleet \
 && strip target/release/botfleet

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /var/lib/botfleet --create-home botfleet
COPY --from=build /src/target/release/botfleet /usr/local/bin/botfleet
USER 10001
WORKDIR /var/lib/botfleet
# Listen beyond the container's loopback; logs as JSON lines for the collector.
# 8080: health, metrics, control API; 8081: platforms' webhooks (the only port to publish,
# behind the load balancer whose address is --public-url / BOTFLEET_PUBLIC_URL).
ENV BOTFLEET_HTTP_ADDR=0.0.0.0:8080 \
    BOTFLEET_HOOKS_ADDR=0.0.0.0:8081 \
    BOTFLEET_LOG_FORMAT=json
EXPOSE 8080 8081
# SIGTERM hands every bot over before exit: give it the time (see the README's Deploys note).
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/botfleet"]
CMD ["worker"]
