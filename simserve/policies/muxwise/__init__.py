"""Policy `muxwise`: prefill/decode spatial multiplexing (MuxWise, ASPLOS'26; SGLang
`--enable-pdmux`), as ConfluxServe §8.1 ran it. `engine.py` holds the two concurrent
streams; their SM-share cost model is `simserve/cost/smshare.py`."""
from simserve.policies.muxwise.config import MuxWiseConfig  # noqa: F401
from simserve.policies.muxwise.engine import build  # noqa: F401
