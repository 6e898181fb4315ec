# The kernelbox server image, built offline on the same base as the kernel image, from a
# kernelbox binary built on the host (`cargo build --release`; BINARY selects another build).
ARG BASE=kernelbox/base:bookworm
FROM ${BASE}
ARG BINARY=target/release/kernelbox
COPY ${BINARY} /usr/local/bin/kernelbox
# The server talks to the engine through the socket compose mounts; it runs as root inside
# its own container for that reason only. Kernels it starts never see the socket.
ENV KERNELBOX_LISTEN=0.0.0.0:8080 KERNELBOX_LOG=info
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/kernelbox"]
CMD ["serve"]
