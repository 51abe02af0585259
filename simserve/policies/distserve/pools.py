"""Where `distserve`'s two pools live: one GPU kind split half/half over NVLink (the paper's
setting), or a decode pool of another kind on other nodes (`decode_gpu`), reached over an
inter-node link (`handoff_link`, one port per GPU)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from simserve.errors import ConfigError
from simserve.hardware.profile import load_profile
from simserve.hardware.setup import HardwareConfig, resolve_hardware
from simserve.sim.cluster import Channel


@dataclass
class Pools:
    prefill_gpus: list[int]
    decode_gpus: list[int]
    tp_p: int
    tp_d: int
    decode_ctx: object                 # the context decode instances are built on
    link: object | None = None         # the hand-off's link profile when it leaves the node


def _tp(name: str, tp: int, pool: int) -> None:
    if pool % tp:
        raise ConfigError(f"policy.{name}: {tp} does not divide the {pool} GPUs of its pool")


def split(ctx, cfg) -> Pools:
    G = ctx.hardware.num_gpus
    if cfg.decode_gpu is None:
        if G < 2 or G % 2:
            raise ConfigError(f"policy distserve: a 1:1 prefill/decode split needs an even "
                              f"number of GPUs, got hardware.num_gpus={G}")
        half = G // 2
        tp_p, tp_d = cfg.prefill_tp or half, cfg.decode_tp or half
        _tp("prefill_tp", tp_p, half)
        _tp("decode_tp", tp_d, half)
        return Pools(list(range(half)), list(range(half, G)), tp_p, tp_d, ctx)
    D = cfg.decode_num_gpus or G
    tp_p, tp_d = cfg.prefill_tp or G, cfg.decode_tp or D
    _tp("prefill_tp", tp_p, G)
    _tp("decode_tp", tp_d, D)
    gpu, link = _load(cfg.decode_gpu, "gpu", "decode_gpu"), _load(cfg.handoff_link, "link",
                                                                  "handoff_link")
    if "p2p_gbps" not in link.link:
        raise ConfigError(f"policy.handoff_link: link profile {link.name!r} has no p2p_gbps")
    hw = resolve_hardware(HardwareConfig(gpu=gpu.name, num_gpus=tp_d), "policy.decode_gpu")
    # the decode pool's own hardware: its GPUs' memory sizes its KV, its profile prices its steps
    dctx = replace(ctx, hardware=hw)
    return Pools(list(range(G)), list(range(G, G + D)), tp_p, tp_d, dctx, link)


def _load(name: str, kind: str, field: str):
    try:
        return load_profile(name, expect_kind=kind)
    except ConfigError as exc:
        raise ConfigError(f"policy.{field}: {exc}") from None


class NicLinks:
    """One network port per GPU, each way: a shard holds its prefill GPU's send port and its
    decode GPU's receive port for its transfer (several prefill GPUs sending to one decode
    GPU share that GPU's port); quacks like `Cluster.nvlink_channel` for the hand-off."""

    def __init__(self, env, link):
        self.env, self.link = env, link
        self.send: dict[int, Channel] = {}
        self.receive: dict[int, Channel] = {}
        # `stats["distserve_handoff"]`: hand-offs over this link and their bytes
        self.stats = dict(link=link.name, num_handoffs=0, bytes_moved=0)

    def _port(self, ports: dict, gpu: int, way: str) -> Channel:
        ch = ports.get(gpu)
        if ch is None:
            ln = self.link.link
            ch = ports[gpu] = Channel(self.env, f"{self.link.name}.gpu{gpu}.{way}",
                                      ln["p2p_gbps"], ln["latency_us"])
        return ch

    def nvlink_channel(self, src: int, dst: int) -> "_Ports":
        return _Ports(self.env, self._port(self.send, src, "out"),
                      self._port(self.receive, dst, "in"))


class _Ports:
    """A transfer that holds a send port and a receive port for its duration."""

    def __init__(self, env, tx: Channel, rx: Channel):
        self.env, self.tx, self.rx = env, tx, rx

    def start(self, nbytes: float):
        return self.env.all_of([self.tx.start(nbytes), self.rx.start(nbytes)])
