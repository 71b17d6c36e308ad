# The gateway and the echo agent in one image. Build: docker build -t acp-gateway .
FROM rust:1-bookworm AS build
WORKDIR /src
# Dependencies first, in their own layer: built against stub sources, so this layer is reused
# until Cargo.toml or Cargo.lock changes.
COPY Cargo.toml Cargo.lock build.rs ./
RUN mkdir -p src examples benches migrations \
    && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && echo 'fn main() {}' > examples/echo_agent.rs \
    && echo 'fn main() {}' > benches/events.rs && echo 'fn main() {}' > benches/sessions.rs \
    && cargo build --release --locked --bin acp-gateway --example echo_agent \
    && rm -rf src examples benches
# Then the project itself (touched, so cargo rebuilds it over the stubs' artifacts).
COPY . .
RUN touch build.rs src/lib.rs src/main.rs examples/echo_agent.rs \
    && cargo build --release --locked --bin acp-gateway --example echo_agent

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 gateway
COPY --from=build /src/target/release/acp-gateway /usr/local/bin/acp-gateway
COPY --from=build /src/target/release/examples/echo_agent /usr/local/bin/echo_agent
USER gateway
WORKDIR /home/gateway
ENV ACP_GATEWAY_LISTEN=0.0.0.0:8080 \
    ACP_GATEWAY_AGENT=/usr/local/bin/echo_agent \
    ECHO_AGENT_DIR=/home/gateway/echo-agent
EXPOSE 8080
ENTRYPOINT ["acp-gateway"]
