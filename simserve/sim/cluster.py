"""SimPy resources of a serving cluster: GPU servers and the links between them and the host.

A `Channel` is one direction of one link (PCIe H2D, PCIe D2H, an NVLink): a FIFO server that
a transfer holds for latency + bytes / bandwidth, so concurrent swaps, Prefill-to-CPU copies
and activations contend. A `GpuServer` is a GPU that runs one batch (or stage) at a time; an
engine that owns a TP group holds all of its GPUs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import simpy

from simserve.sim.clock import at

if TYPE_CHECKING:  # type-only: the core is handed these specs, it imports nothing above it
    from simserve.hardware.profile import HardwareProfile


class Channel:
    def __init__(self, env: simpy.Environment, name: str, gbps: float, latency_us: float):
        if gbps <= 0:
            raise ValueError(f"{name}: bandwidth must be positive")
        self.env, self.name = env, name
        self.bytes_per_s = gbps * 1e9
        self.latency_s = latency_us * 1e-6
        self._res = simpy.Resource(env, capacity=1)
        self.num_transfers = 0
        self.bytes_moved = 0
        self.busy_s = 0.0
        self.trace = None   # a TraceEvents sink (--trace-events), else None

    def duration_s(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bytes_per_s

    def transfer(self, nbytes: float):
        """A process: wait for the channel, hold it for the transfer, release it."""
        with self._res.request() as req:
            yield req
            d = self.duration_s(nbytes)
            yield self.env.timeout(d)
            self.num_transfers += 1
            self.bytes_moved += int(nbytes)
            self.busy_s += d
            if self.trace is not None:
                self.trace.transfer(self.name, self.env.now - d, d, nbytes)

    def start(self, nbytes: float) -> simpy.Process:
        return self.env.process(self.transfer(nbytes))

    # -- for engines that work transfers out in closed form (event leaping) -------------------
    @property
    def idle(self) -> bool:
        """Nobody holds or waits for the channel."""
        return not self._res.users and not self._res.queue

    def book(self, nbytes: float, d: float, end_s: float | None = None) -> None:
        """Count a transfer of `d` seconds that an engine worked out in closed form (ending
        at `end_s`: where a trace draws it; None: now)."""
        self.num_transfers += 1
        self.bytes_moved += int(nbytes)
        self.busy_s += d
        if self.trace is not None:
            end = self.env.now if end_s is None else end_s
            self.trace.transfer(self.name, end - d, d, nbytes)

    def hold_until(self, end: float, nbytes: float, d: float):
        """A process: hold the channel until exactly `end` for a transfer that started
        earlier (its closed form was cut short), then count it."""
        with self._res.request() as req:
            yield req
            yield at(self.env, end)
            self.book(nbytes, d, end)

    @property
    def queue_len(self) -> int:
        return len(self._res.queue)


@dataclass
class GpuServer:
    index: int
    profile: HardwareProfile
    h2d: Channel
    d2h: Channel
    busy_s: float = 0.0


@dataclass
class Cluster:
    """GPUs with their PCIe channels, and an NVLink channel per GPU pair direction when present."""

    env: simpy.Environment
    gpus: list[GpuServer]
    pcie: HardwareProfile
    nvlink: HardwareProfile | None = None
    nvlink_channels: dict[tuple[int, int], Channel] = field(default_factory=dict)

    @property
    def channels(self) -> list[Channel]:
        return [c for g in self.gpus for c in (g.h2d, g.d2h)] + list(self.nvlink_channels.values())

    @classmethod
    def build(cls, env: simpy.Environment, gpu: HardwareProfile, num_gpus: int,
              pcie: HardwareProfile, nvlink: HardwareProfile | None) -> "Cluster":
        ln = pcie.link
        gpus = [GpuServer(i, gpu,
                          Channel(env, f"gpu{i}.pcie.h2d", ln["h2d_gbps"], ln["latency_us"]),
                          Channel(env, f"gpu{i}.pcie.d2h", ln["d2h_gbps"], ln["latency_us"]))
                for i in range(num_gpus)]
        c = cls(env, gpus, pcie, nvlink)
        if nvlink is not None and num_gpus > 1:
            nl = nvlink.link
            for a in range(num_gpus):
                for b in range(num_gpus):
                    if a != b:
                        c.nvlink_channels[(a, b)] = Channel(
                            env, f"nvlink.{a}->{b}", nl["p2p_gbps"], nl["latency_us"])
        return c

    def nvlink_channel(self, src: int, dst: int) -> Channel:
        try:
            return self.nvlink_channels[(src, dst)]
        except KeyError:
            raise ValueError(f"no NVLink between GPU {src} and GPU {dst}") from None
