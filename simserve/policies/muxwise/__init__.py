"""Policy `muxwise`: prefill/decode spatial multiplexing (MuxWise, ASPLOS'26; SGLang
`--enable-pdmux`), as ConfluxServe §8.1 ran it. `smshare.py` holds the SM-share cost model,
`engine.py` the two concurrent streams."""
from simserve.policies.muxwise.config import MuxWiseConfig  # noqa: F401
from simserve.policies.muxwise.engine import build  # noqa: F401
