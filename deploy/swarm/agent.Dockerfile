# The kernelbox agent image for the Swarm stack (deploy/swarm/stack.yaml): the server image's
# base with a host-built binary (build it from the repository root:
#   docker build -f deploy/swarm/agent.Dockerfile --build-arg BINARY=target/release/kernelbox \
#     -t kernelbox/agent:latest .
# ) and an entrypoint that advertises the task's own address on the stack's network.
ARG BASE=kernelbox/base:bookworm
FROM ${BASE}
ARG BINARY=target/release/kernelbox
COPY ${BINARY} /usr/local/bin/kernelbox
# Swarm gives each task an address on the stack's overlay network; the other nodes reach this
# one there (`--advertise`). The node's Docker socket is mounted for the agent only: the
# kernels it starts never see it.
RUN printf '%s\n' '#!/bin/sh' 'set -eu' \
      'addr=$(hostname -i | awk "{print \$1}")' \
      'exec /usr/local/bin/kernelbox serve --advertise "http://$addr:8080" "$@"' \
      > /usr/local/bin/agent-entrypoint && chmod +x /usr/local/bin/agent-entrypoint
ENV KERNELBOX_LISTEN=0.0.0.0:8080 KERNELBOX_LOG=info
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/agent-entrypoint"]
