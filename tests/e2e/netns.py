"""A host of the test's own: a Linux network namespace joined to this one by a veth
pair, whose link the test partitions by dropping packets.

A process started with ``Host.command`` runs in the namespace and reaches the
servers at ``Host.server_address`` (the veth's end on this side, where the test's
private servers listen too). ``Host.partition()`` drops every packet between the
namespace and that address, both ways, with iptables inside the namespace: no
socket is closed, no reset is sent, the peers see silence, as on a real network
that fails. ``Host.lose()`` drops only some of them, at random. ``Host.heal()``
lets packets through again; the connections that survived go on. Everything is
removed on ``close``; nothing outside the namespace and its veth pair is touched."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence

#: The private subnet of the veth pairs: 10.213.<n>.0/24 (see ``_subnet_octet``).
SUBNET_PREFIX = "10.213"
#: Third octets each pytest-xdist worker draws from, so two never share a subnet.
OCTETS_PER_WORKER = 50


class NetnsUnavailable(RuntimeError):
    """This machine cannot make a network namespace here (not root, no iproute2 or
    iptables, or a sandbox that forbids it); the message says which."""


def _subnet_octet() -> int:
    """This process's third octet: a band of its own per pytest-xdist worker (``gw0``
    takes 1-50, ``gw1`` 51-100, ...), the PID choosing within it; two test
    processes at once on one machine then never share a subnet."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    band = int(worker) % (250 // OCTETS_PER_WORKER) if worker.isdigit() else 0
    return band * OCTETS_PER_WORKER + os.getpid() % OCTETS_PER_WORKER + 1


def _run(*argv: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {result.stderr.strip()}")


class Host:
    """One network namespace with a veth link to this one (see the module docstring)."""

    def __init__(self, tag: str) -> None:
        if os.geteuid() != 0:
            raise NetnsUnavailable("network namespaces need root")
        for binary in ("ip", "iptables"):
            if shutil.which(binary) is None:
                raise NetnsUnavailable(
                    f"{binary} is not installed (apt-get install iproute2 iptables)"
                )
        octet = _subnet_octet()
        self.name = f"habeat-{tag}-{os.getpid()}"
        self._outside = f"hb{os.getpid() % 100000}o"  # interface names: 15 bytes at most
        self._inside = f"hb{os.getpid() % 100000}i"
        self.server_address = f"{SUBNET_PREFIX}.{octet}.1"
        self.address = f"{SUBNET_PREFIX}.{octet}.2"
        self._created = False

    def open(self) -> Host:
        try:
            _run("ip", "netns", "add", self.name)
        except RuntimeError as exc:
            raise NetnsUnavailable(str(exc)) from exc
        self._created = True
        _run("ip", "link", "add", self._outside, "type", "veth", "peer", "name", self._inside)
        _run("ip", "link", "set", self._inside, "netns", self.name)
        _run("ip", "addr", "add", f"{self.server_address}/24", "dev", self._outside)
        _run("ip", "link", "set", self._outside, "up")
        self._inside_run("ip", "addr", "add", f"{self.address}/24", "dev", self._inside)
        self._inside_run("ip", "link", "set", self._inside, "up")
        self._inside_run("ip", "link", "set", "lo", "up")
        try:
            self._inside_run("iptables", "-L", "-n")
        except RuntimeError as exc:
            self.close()
            raise NetnsUnavailable(f"iptables does not work here: {exc}") from exc
        return self

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the namespace (``ip netns exec`` execs it: same PID)."""
        return ["ip", "netns", "exec", self.name, *argv]

    def partition(self, direction: str = "both", *, port: int | None = None) -> None:
        """Drop packets between the namespace and the servers' side from now on:
        ``both`` ways, only those ``to-servers``, or only those ``from-servers`` (what
        this side sends still arrives, and is acted on, but is never answered); to
        and from one server's ``port`` only, or all of them."""
        to_port = ["-p", "tcp", "--dport", str(port)] if port else []
        from_port = ["-p", "tcp", "--sport", str(port)] if port else []
        if direction in ("both", "to-servers"):
            self._drop("OUTPUT", "-d", self.server_address, *to_port)
        if direction in ("both", "from-servers"):
            self._drop("INPUT", "-s", self.server_address, *from_port)

    def _drop(self, chain: str, *match: str) -> None:
        self._inside_run("iptables", "-A", chain, *match, "-j", "DROP")

    def lose(self, probability: float) -> None:
        """Drop each packet between the namespace and the servers' side with this
        probability, both ways (iptables' ``statistic`` match): a lossy link, whose
        connections stall for TCP's retransmissions, some past the clients'
        timeouts, with what they sent done or not. (``tc netem`` would delay too;
        kernels without its module, as in some VMs, refuse it.)"""
        chance = ["-m", "statistic", "--mode", "random", "--probability", str(probability)]
        self._drop("OUTPUT", "-d", self.server_address, *chance)
        self._drop("INPUT", "-s", self.server_address, *chance)

    def heal(self) -> None:
        """Let every packet through again, at once."""
        self._inside_run("iptables", "-F")

    def close(self) -> None:
        if not self._created:
            return
        # Deleting the namespace deletes its end of the veth pair, and with it ours.
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", self._outside], capture_output=True, check=False)
        self._created = False

    def __enter__(self) -> Host:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _inside_run(self, *argv: str) -> None:
        _run(*self.command(argv))
