"""Free local ports for the processes a local stack starts (demo replicas, the resume relay, mock servers)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

# Linux's default net.ipv4.ip_local_port_range starts here; where it cannot be read, this is assumed.
EPHEMERAL_PORTS_FROM = 32768


def _ephemeral_ports_from() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return EPHEMERAL_PORTS_FROM


def free_ports(count: int, attempts: int = 50) -> int:
    """The first of ``count`` consecutive ports on 127.0.0.1 that bind now (start_replicas numbers its
    replicas so), below the kernel's ephemeral range: a replica binds its port only once its model has
    loaded, seconds later, and a port from the ephemeral range could meanwhile become the local end of
    any outgoing connection on the machine (seen: "address already in use" under load)."""
    top = min(_ephemeral_ports_from(), 65536) - count
    if top <= 10000:
        raise RuntimeError(f"no room for {count} ports between 10000 and the ephemeral range")
    for _ in range(attempts):
        first = random.randrange(10000, top)
        held: list[socket.socket] = []
        try:
            for port in range(first, first + count):
                sock = socket.socket()
                held.append(sock)
                sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
        return first
    raise RuntimeError(f"no {count} consecutive free ports on 127.0.0.1 in {attempts} tries")
