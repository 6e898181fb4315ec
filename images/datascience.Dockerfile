# The data-science kernel image (`kernelbox image build --preset datascience`): the plain kernel
# image plus numpy, pandas, matplotlib, pillow and scipy from Debian's own packages, fetched from
# the mirror in the base's apt sources (no container registry, no PyPI). docs/images.md "Images".
ARG BASE=kernelbox/kernel:latest
FROM ${BASE}
USER 0:0
# Recommends are left out: they would add Tk, X11 and optional pandas back ends that no
# headless cell needs. Debian's scipy also depends on python3-pythran, a compiler for building
# scipy (it pulls in g++, boost and the BLAS headers, about 470 MB) that scipy never imports at
# run time and that a kernel with no network could not use: a local empty package provides it.
# libopenblas0-serial is the BLAS numpy and scipy use (the reference BLAS otherwise); serial, so
# importing numpy starts no thread per host core in the kernel.
RUN mkdir -p /tmp/no-pythran/DEBIAN \
 && printf '%s\n' 'Package: kernelbox-no-pythran' 'Version: 1' 'Architecture: all' \
      'Maintainer: kernelbox' 'Provides: python3-pythran' \
      'Description: stands in for pythran, a build-time compiler scipy does not import' \
      > /tmp/no-pythran/DEBIAN/control \
 && dpkg-deb --build /tmp/no-pythran /tmp/no-pythran.deb >/dev/null \
 && dpkg -i /tmp/no-pythran.deb \
 && rm -rf /tmp/no-pythran /tmp/no-pythran.deb \
 && apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      python3-numpy python3-pandas python3-matplotlib python3-pil python3-scipy \
      libopenblas0-serial \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /var/log/apt /var/log/dpkg.log
# matplotlib draws with Agg (no display in a kernel) and keeps its config and cache under
# MPLCONFIGDIR, which must be writable: the root filesystem is read-only, /tmp is the kernel's
# tmpfs (HOME=/tmp).
ENV MPLBACKEND=Agg MPLCONFIGDIR=/tmp/matplotlib
# The font list matplotlib would otherwise rebuild by scanning the fonts in every new kernel
# is built once here; datascience/kernelbox_mplcache.py copies it into MPLCONFIGDIR on a
# kernel's first `import matplotlib` (nothing happens in kernels that never import it).
# Debian's matplotlib ships a namespace-package .pth for mpl_toolkits (a regular package with
# an __init__.py here) that imports importlib.util, collections and functools into every
# Python process at start, about 0.6 MiB in each idle kernel: it is diverted away, as dpkg
# does for local changes, so an idle kernel loads nothing of matplotlib.
RUN for f in /usr/lib/python3/dist-packages/matplotlib-*-nspkg.pth; do \
      dpkg-divert --local --rename --divert "$f.disabled" --add "$f"; \
    done
COPY datascience/kernelbox_mplcache.py datascience/kernelbox-mplcache.pth /usr/lib/python3/dist-packages/
RUN MPLCONFIGDIR=/usr/share/kernelbox/matplotlib python3 -c "import matplotlib.font_manager" \
 && rm -f /usr/share/kernelbox/matplotlib/*.lock \
 && python3 -m py_compile /usr/lib/python3/dist-packages/kernelbox_mplcache.py \
 && chmod -R a+rX /usr/share/kernelbox
USER 10000:10000
