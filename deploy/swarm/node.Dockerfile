# A Docker engine in a container: one node of the Swarm test (deploy/swarm/test.sh), built
# offline from the kernel images' Debian base with apt-get. Run it without --privileged (see
# node-entrypoint.sh and docs/cluster.md, "Docker Swarm").
ARG BASE=kernelbox/base:bookworm
FROM ${BASE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      docker.io iptables fuse-overlayfs iproute2 ca-certificates procps \
 && rm -rf /var/lib/apt/lists/*
COPY node-entrypoint.sh /usr/local/bin/node-entrypoint.sh
VOLUME /var/lib/docker
ENTRYPOINT ["/usr/local/bin/node-entrypoint.sh"]
