"""Free loopback ports for the servers the tests and benchmarks start (e2e, bench, deploy).

    sys.path.insert(0, <the tests folder>)
    from loopback_ports import free_port
    port = free_port()

A port is drawn at random below the kernel's ephemeral range: a port from that range (bind to
port 0) can be taken by any outgoing connection's source port before the server binds it
("cannot listen on ...: Address already in use" under a busy ctest -j).

Any port picked here may still be taken by another test before its owner binds it. Where the
owner can bind port 0 itself, let it: offload_server does, and names the ports it bound in its
server_started line (tests/e2e/harness.py reads them).
"""
import random
import socket


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port():
    """A TCP port free on 127.0.0.1 now, below the ephemeral range when one is free there."""
    high = _ephemeral_low() - 1
    for _ in range(200):
        port = random.randint(10000, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
