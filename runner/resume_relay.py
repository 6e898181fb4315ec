# kernelbox resume relay, run by the engine's exec in a kernel restored from its checkpoint
# (docs/runtimes.md, "Hibernation"), as `python3 -I -S -c <this file>`. The host writes the
# hibernation's token and a newline first on this process's stdin; the relay connects to the
# abstract socket its first 16 characters name, presents the rest (the secret: socket names
# are visible to the kernel's own processes) and its pid (the runner ends it before the next
# hibernation) to the runner waiting there, and hands over its stdin, stdout and stderr, which
# become the runner's channel. Then it stays, as small as it
# can (sleep), for the exec's streams last as long as this process does. Standard library
# only.
import array
import os
import _socket

token = b""
while not token.endswith(b"\n") and len(token) <= 65:
    byte = os.read(0, 1)
    if not byte:
        os._exit(1)
    token += byte
token = token.strip()
sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
sock.connect(b"\0kernelbox-resume-" + token[:16])
sock.sendmsg(
    [token[16:] + b" %d" % os.getpid()], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, array.array("i", [0, 1, 2]).tobytes())]
)
sock.close()
for sleep in ("/bin/sleep", "/usr/bin/sleep"):
    try:
        os.execv(sleep, ["sleep", "infinity"])
    except OSError:
        pass
import select  # no sleep in the image: wait forever here

while True:
    select.select([], [], [])
