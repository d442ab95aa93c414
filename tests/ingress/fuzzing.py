"""What the fuzz tests of the ingress parsers share: hypothesis settings and byte mutations."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

FUZZ = settings(
    max_examples=300,
    deadline=None,
    database=None,  # no .hypothesis/ in the working tree
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def mutated(data: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    """Valid encodings with bytes flipped, inserted, dropped or cut off."""

    @st.composite
    def mutate(draw: st.DrawFn) -> bytes:
        buf = bytearray(draw(data))
        for _ in range(draw(st.integers(1, 4))):
            op = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
            at = draw(st.integers(0, len(buf)))
            if op == "flip" and at < len(buf):
                buf[at] = draw(st.integers(0, 255))
            elif op == "insert":
                buf[at:at] = draw(st.binary(min_size=1, max_size=4))
            elif op == "delete":
                del buf[at : at + draw(st.integers(1, 4))]
            else:
                del buf[at:]
        return bytes(buf)

    return mutate()
