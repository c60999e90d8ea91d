"""Slurm host lists (`gpu[01-03,07],cpu5`) expanded without calling `scontrol`."""

from __future__ import annotations

import re

MAX_HOSTS = 100_000  # a guard against `n[0-999999999]` in bad input

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top(text: str) -> list[str]:
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p for p in (s.strip() for s in parts) if p]


def _expand_one(item: str) -> list[str]:
    m = re.search(r"\[([^\[\]]*)\]", item)
    if not m:
        return [item]
    head, tail = item[: m.start()], item[m.end() :]
    out: list[str] = []
    for rng in m.group(1).split(","):
        r = _RANGE.match(rng.strip())
        if not r:
            raise ValueError(f"bad host list range {rng!r} in {item!r}")
        lo_s, hi_s = r.group(1), r.group(2) or r.group(1)
        lo, hi = int(lo_s), int(hi_s)
        if hi < lo or hi - lo >= MAX_HOSTS:
            raise ValueError(f"bad host list range {rng!r} in {item!r}")
        width = len(lo_s)
        for i in range(lo, hi + 1):
            for rest in _expand_one(f"{head}{i:0{width}d}{tail}"):
                out.append(rest)
                if len(out) > MAX_HOSTS:
                    raise ValueError(f"host list {item!r} names more than {MAX_HOSTS} hosts")
    return out


def expand_hostlist(text: str) -> list[str]:
    """`gpu[01-02],cpu1` -> ['gpu01', 'gpu02', 'cpu1']; `None assigned` and empty -> []."""
    t = (text or "").strip()
    if not t or t.lower() in ("none assigned", "none", "(null)"):
        return []
    hosts: list[str] = []
    for item in _split_top(t):
        hosts.extend(_expand_one(item))
    return hosts
