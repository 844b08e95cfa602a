"""Rendezvous stores that listen only on the address they advertise (loopback for one host).

``torch.distributed.TCPStore`` servers listen on every interface (``::``) whatever host name
they are given: rank 0's store of an ``env://`` process group, torchrun's rendezvous store and
the store its agent creates for the workers. A training run on one machine then accepts
connections from the whole network. :func:`bind_to_advertised_address` replaces the class, in
the modules that create servers, by a subclass that binds the listening socket itself, to the
host name the server was asked to advertise (``127.0.0.1`` for local runs; a host's own address
when a multi-host run names it, e.g. ``--rdzv-endpoint`` or ``--local-addr``), and hands it over
(``master_listen_fd``). A name that is not an address of this machine raises ``RuntimeError``,
which torchrun's c10d rendezvous takes as "not the host" and connects as a client instead.

Every process that may start a store server calls it first: our torchrun entry
(:mod:`system.runtime.torchrun`), the runtime's worker and the baselines' workers.
"""

from __future__ import annotations

import importlib
import logging
import socket

import torch.distributed as dist

log = logging.getLogger(__name__)

__all__ = ["bind_to_advertised_address", "listen_socket"]

_ORIGINAL = dist.TCPStore


def listen_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host:port`` (IPv4 or IPv6 name); RuntimeError if impossible."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as e:
        raise RuntimeError(f"store: cannot resolve {host!r}: {e}") from None
    infos.sort(key=lambda i: i[0] != socket.AF_INET)  # IPv4 first
    err: OSError | None = None
    for family, kind, proto, _, addr in infos:
        s = socket.socket(family, kind, proto)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(addr)
            s.listen(1024)
            return s
        except OSError as e:
            s.close()
            err = e
    raise RuntimeError(f"store: cannot listen on {host}:{port}: {err}")


class _AdvertisedAddressStore(_ORIGINAL):  # type: ignore[misc, valid-type]
    """TCPStore whose server listens on its ``host_name`` only.

    The store takes ownership of ``master_listen_fd``: it closes that descriptor when it is
    destroyed, and also when its constructor fails (checked for both the libuv and the classic
    backend). So the Python socket gives up the descriptor (``detach``) instead of closing it
    again later: a second ``close`` of the same number could close whatever socket the process
    had opened under that number in the meantime, such as a gloo connection, which then aborts.
    """

    def __init__(self, host_name: str, port: int, *args, **kwargs) -> None:
        # TCPStore(host_name, port, world_size, is_master, timeout, wait_for_workers,
        #          multi_tenant, master_listen_fd, use_libuv): args[5] is master_listen_fd
        is_master = kwargs.get("is_master", args[1] if len(args) > 1 else False)
        has_fd = kwargs.get("master_listen_fd") is not None or len(args) > 5
        sock = None
        if is_master and not has_fd:
            sock = listen_socket(host_name, port)
            port = sock.getsockname()[1]
            kwargs["master_listen_fd"] = sock.fileno()
        try:
            super().__init__(host_name, port, *args, **kwargs)
        except TypeError:  # arguments refused by the binding: no store ever held the socket
            if sock is not None:
                sock.close()
            raise
        except BaseException:
            # the store closed the descriptor, so no dead listener is left for a client that
            # falls back to connecting; only forget it here
            if sock is not None:
                sock.detach()
            raise
        if sock is not None:
            sock.detach()  # the store's now
            log.debug("store server listens on %s:%d only", host_name, port)


def bind_to_advertised_address() -> None:
    """Make every TCPStore server created from now on in this process listen on its host name."""
    # the modules themselves: ``torch.distributed.rendezvous`` as an attribute is a function
    names = (
        "torch.distributed.rendezvous",
        "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend",
    )
    for module in (dist, *(importlib.import_module(n) for n in names)):
        module.TCPStore = _AdvertisedAddressStore
