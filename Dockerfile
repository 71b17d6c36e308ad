# The gateway in front of the echo agent, with Node.js for npm-distributed agents.
#   docker build -t acp-gateway .
#   docker build -t acp-gateway --build-arg AGENT_NPM_PACKAGES="@agentclientprotocol/claude-agent-acp" .
# Details (build args, volumes, adding an agent at run time): docs/deploy.md.
#
# CI has no Docker daemon: scripts/image.sh runs this file's build steps (cargo-chef prepare, cook,
# then the build command marked below) outside Docker on the same inputs, reading the cargo-chef
# version and the build command from this file; tests/image.rs checks that the build command
# produces every binary the runtime stage copies.

FROM rust:1-bookworm AS chef
# cargo-chef, pinned (scripts/image.sh installs the version named on this line).
ARG CARGO_CHEF_VERSION=0.1.78
RUN cargo install cargo-chef --locked --version ${CARGO_CHEF_VERSION}
WORKDIR /src

# The recipe: every manifest and target (bins, examples, benches, tests) with the lock file. It
# changes only when those do, so the dependency layer below is reused across source edits.
FROM chef AS planner
COPY . .
RUN cargo chef prepare --recipe-path recipe.json

FROM chef AS build
COPY --from=planner /src/recipe.json recipe.json
# Dependencies only, against cargo-chef's generated skeleton of every target. `--examples`
# because the examples' dependencies (dev-dependencies) are needed by the build below.
RUN cargo chef cook --release --locked --examples --recipe-path recipe.json
COPY . .
# The one command that builds what the image ships (the gateway and the echo agent; the bench
# agent comes with `--examples`). scripts/image.sh runs the line below verbatim.
# image-build-command:
RUN cargo build --release --locked --bin acp-gateway --examples

# Debian bookworm-slim with Node.js 24 and npm (the official node image): Debian's own nodejs is
# 18, and @agentclientprotocol/claude-agent-acp requires Node >= 22.
FROM node:24-bookworm-slim
# npm packages installed globally at build time, space-separated, e.g.
#   --build-arg AGENT_NPM_PACKAGES="@agentclientprotocol/claude-agent-acp @agentclientprotocol/codex-acp"
# each package's command is then on PATH: ACP_GATEWAY_AGENT=claude-agent-acp.
ARG AGENT_NPM_PACKAGES=""
# tini is PID 1 so that processes the agents leave behind are reaped; git makes worktree
# workspaces, diffs and checkpoints.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates tini git \
    && rm -rf /var/lib/apt/lists/* \
    && if [ -n "$AGENT_NPM_PACKAGES" ]; then \
         npm install --global --no-audit --no-fund $AGENT_NPM_PACKAGES && npm cache clean --force; \
       fi
# The non-root user, its home (the agents' HOME: their logins and session files) with the echo
# agent's state directory, and the data directory of the SQLite file. Created and owned here so
# that named volumes mounted on these paths start out owned by uid 10001.
RUN groupadd --gid 10001 gateway \
    && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/gateway --shell /bin/sh gateway \
    && mkdir -p /home/gateway/echo-agent /var/lib/acp-gateway \
    && chown -R 10001:10001 /home/gateway /var/lib/acp-gateway
COPY --from=build /src/target/release/acp-gateway /usr/local/bin/acp-gateway
COPY --from=build /src/target/release/examples/echo_agent /usr/local/bin/echo_agent
USER 10001:10001
WORKDIR /home/gateway
ENV HOME=/home/gateway \
    ACP_GATEWAY_LISTEN=0.0.0.0:8080 \
    ACP_GATEWAY_DATABASE_URL=sqlite:/var/lib/acp-gateway/acp-gateway.db \
    ACP_GATEWAY_AGENT=/usr/local/bin/echo_agent \
    ECHO_AGENT_DIR=/home/gateway/echo-agent
EXPOSE 8080
# /healthz answers 200 while the process serves (no curl in the image: Node's http client).
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["node", "-e", "require('http').get('http://127.0.0.1:8080/healthz',r=>process.exit(r.statusCode===200?0:1)).on('error',()=>process.exit(1))"]
ENTRYPOINT ["/usr/bin/tini", "--", "acp-gateway"]
