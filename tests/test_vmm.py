"""hmgstore.cuda.vmm: the descriptor server that hands a GPU allocation's file descriptor to peer processes.

The CUDA part (cuMemCreate, cuMemMap in the peer) runs in test_distributed.py's multi-GPU tests; the server
is plain Unix sockets and runs here with an ordinary file's descriptor.
"""
import os
import socket
import subprocess
import sys

import pytest

from hmgstore.cuda import vmm

CLIENT = """
import os, socket, sys
with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
    c.connect("\\0" + sys.argv[1])
    _, fds, _, _ = socket.recv_fds(c, 1, 1)
print(os.pread(fds[0], 16, 0).decode())
"""


def test_another_process_of_this_user_gets_the_descriptor_until_the_server_stops(tmp_path):
    path = tmp_path / "rows"
    path.write_bytes(b"the owner's rows")
    server = vmm._Server(os.open(path, os.O_RDONLY))
    for _ in range(2):  # every peer that connects, not only the first
        out = subprocess.run([sys.executable, "-c", CLIENT, server.name], capture_output=True, text=True, timeout=60)
        assert out.stdout.strip() == "the owner's rows", out.stderr
    fd = server.fd
    server.stop()
    with pytest.raises(OSError):  # the owner's copy of the descriptor is closed
        os.fstat(fd)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c, pytest.raises(ConnectionRefusedError):
        c.connect("\0" + server.name)  # and nobody can ask for it any more


def test_servers_have_names_of_their_own(tmp_path):
    a, b = (vmm._Server(os.open(tmp_path, os.O_RDONLY)) for _ in range(2))
    try:
        assert a.name != b.name and str(os.getpid()) in a.name
    finally:
        a.stop()
        b.stop()
