# HAProxy 2.6 for the Swarm stack's front (deploy/swarm/stack.yaml), built offline from the
# kernel images' Debian base; its configuration comes as a Swarm config (haproxy.cfg).
ARG BASE=kernelbox/base:bookworm
FROM ${BASE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends haproxy \
 && rm -rf /var/lib/apt/lists/*
EXPOSE 8080
ENTRYPOINT ["haproxy", "-W", "-db", "-f", "/usr/local/etc/haproxy/haproxy.cfg"]
