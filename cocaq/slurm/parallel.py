"""Parse a sacct text dump in a second process, so parsing and the import's own work use two cores.

The import is CPU-bound under the GIL: the parser alone is about as long as everything else the importer
does.  A forked child runs `iter_parsable` and hands back batches of plain tuples (cheaper to pickle than
objects); the parent rebuilds the JobRecords and adds the child's counts to its own ParseStats.
"""

from __future__ import annotations

import multiprocessing as mp
import operator
from collections.abc import Iterator
from datetime import tzinfo
from typing import IO, Any

from cocaq.slurm.plausible import Checked, Tally, checked
from cocaq.slurm.record import JobRecord
from cocaq.slurm.sacct import ParseStats, SacctFormatError, iter_parsable

_SLOTS: tuple[str, ...] = JobRecord.__slots__
_as_tuple = operator.attrgetter(*_SLOTS)
_BATCH = 5000


def _child(fh: IO[bytes], out: Any, kwargs: dict[str, Any], max_node_power_w: float) -> None:
    st = ParseStats()
    tally = Tally()
    batch: list[tuple[Any, ...]] = []
    try:
        parsed = iter_parsable(fh, stats=st, **kwargs)
        for rec in checked(parsed, tally, max_node_power_w=max_node_power_w):  # here, beside the parsing
            batch.append(_as_tuple(rec))
            if len(batch) >= _BATCH:
                out.send(("jobs", batch))
                batch = []
        if batch:
            out.send(("jobs", batch))
        out.send(("done", (st, tally)))
    except SacctFormatError as exc:
        out.send(("format-error", str(exc)))
    except BaseException as exc:  # anything else: let the parent raise it, with its type and text
        out.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        out.close()


def iter_parsable_forked(
    fh: IO[bytes], *, tz: tzinfo, stats: ParseStats, max_node_power_w: float = 0.0, **kwargs: Any
) -> Checked:
    """`iter_parsable` and the plausibility rules (cocaq.slurm.plausible) run in a forked child; the same
    records and counts as in-process (`stats`, and the returned Checked's tally once it is read)."""
    tally = Tally()
    return Checked(_forked(fh, tz, stats, tally, max_node_power_w, kwargs), tally)


def _forked(
    fh: IO[bytes],
    tz: tzinfo,
    stats: ParseStats,
    tally: Tally,
    max_node_power_w: float,
    kwargs: dict[str, Any],
) -> Iterator[JobRecord]:
    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(fh, send, {"tz": tz, **kwargs}, max_node_power_w), daemon=True)
    proc.start()
    send.close()
    try:
        while True:
            try:
                kind, payload = recv.recv()
            except EOFError:
                raise RuntimeError("the sacct parser process ended without a result") from None
            if kind == "jobs":
                for t in payload:
                    yield JobRecord(*t)
            elif kind == "done":
                child: ParseStats = payload[0]
                tally.merge(payload[1])
                stats.lines += child.lines
                stats.jobs += child.jobs
                stats.steps += child.steps
                stats.skipped.update(child.skipped)
                stats.replaced_bytes_lines += child.replaced_bytes_lines
                for k, v in child.examples.items():
                    stats.examples.setdefault(k, v)
                return
            elif kind == "format-error":
                raise SacctFormatError(payload)
            else:
                raise RuntimeError(f"the sacct parser process failed: {payload}")
    finally:
        recv.close()
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
