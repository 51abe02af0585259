"""The fast CSV writer of request records writes what pandas writes, byte for byte."""
from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from simserve.runner.csv_chunks import FLOAT_FORMAT, csv_text

floats = st.floats(allow_nan=True, allow_infinity=True)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(floats, st.integers(-2**62, 2**62), st.booleans(),
                          st.text(min_size=1, max_size=6), floats), min_size=0, max_size=30),
       st.booleans())
def test_matches_pandas_to_csv(rows, header):
    df = pd.DataFrame(rows, columns=["a_s", "n", "ok", "policy", "b"]).astype(
        {"a_s": np.float64, "n": np.int64, "ok": bool, "b": np.float64})
    assert csv_text(df, header) == df.to_csv(index=False, header=header,
                                             float_format=FLOAT_FORMAT)


def test_other_dtypes_fall_back_to_pandas():
    df = pd.DataFrame({"x": [1.5, None], "mixed": [1, "a"]})
    assert csv_text(df) == df.to_csv(index=False, float_format=FLOAT_FORMAT)
