"""Long transcript records for the report pages' size and speed checks (tests/html_report_test.py,
benchmarks/report_pages.py): many dialogues of many long turns, made from one real record."""

from typing import Any


def stretched(base: dict[str, Any], n: int = 100, turns: int = 10, chars: int = 1500) -> list[dict[str, Any]]:
    """n copies of the transcript record `base`, each with `turns` turns whose reply and thinking
    are `chars` characters long and an emotion that rises by one a turn from 40."""
    out = []
    for i in range(n):
        ts = [dict(base["turns"][0], turn=k + 1, reply=f"reply {i}.{k} " + "x" * chars,
                   thinking="t" * chars, user=f"user {i}.{k}") for k in range(turns)]
        out.append(dict(base, profile_id=f"p{i:03d}", turns=ts, emotions=[40 + k for k in range(turns + 1)],
                        final_emotion=40 + turns))
    return out
