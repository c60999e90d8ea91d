"""The spool's records, defined once: the events and energy rows a node keeps until the database has them.

Two kinds of record travel from a node to the database. An *event* is one JSON object per file in the
spool (`events/`): the hooks write `start`/`end` (and `ctld-start`/`ctld-end`), the hooks and the
collector's metadata source write `meta`; the shipper stores each under its `uid`. An *energy row* is
one job's energy on one device from one source: the epilog carries its exact ones inside its `end`
event (as `energy` entries), the collector keeps its running ones in `collector.db`, and the shipper
upserts both into `node_energy`. The hook, the spool, the sources and the shipper all build and read
them here, so the two sides cannot drift apart.

This module is on the hook's path (a prolog has tens of milliseconds), so it imports nothing, not even
`typing`: events are plain dicts and `EnergyRow` is a tuple with named fields. The key order of an
event is part of the format (a file written before a change and after it reads the same, byte for
byte), and so is the order of an energy row's fields (the columns of `collector.db`'s `energy` table).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

VERSION = 1
EVENT_KINDS = ("start", "end", "ctld-start", "ctld-end", "meta")
# When one GPU has several measured sources, the better one wins: the exact counter, then the collector's
# integral of the sampled power, then the epilog's trapezoid of its two edge readings.
GPU_SOURCE_RANK = {"nvml": 0, "nvml-power-integral": 1, "nvml-power-edges": 2}
_HOOK_EVENTS = {"prolog": "start", "epilog": "end", "prologslurmctld": "ctld-start"}

# what every event needs to be shipped, and its type
REQUIRED = {"uid": str, "event": str, "job_id": str, "ts": (int, float), "node": str, "cluster": str}


def hook_event_kind(hook_kind: str) -> str:
    """The event a hook of this kind records (`epilogslurmctld`, or anything else: `ctld-end`)."""
    return _HOOK_EVENTS.get(hook_kind, "ctld-end")


def event_uid(cluster: str, node: str, job_id: str, event: str, ts_ns: int) -> str:
    """An event's unique key in the database: a replayed file is stored once."""
    return f"{cluster}/{node}/{job_id}/{event}/{ts_ns}"


def hook_event(event: str, cluster: str, node: str, job_id: str, ts_ns: int, job: Any) -> dict[str, Any]:
    """A hook's event, before the parts of its kind (`gpus`, `rapl_uj`, `job_start`, `energy`) and the
    `errors` and `hook` it ends with."""
    return {
        "v": VERSION,
        "uid": event_uid(cluster, node, job_id, event, ts_ns),
        "event": event,
        "cluster": cluster,
        "node": node,
        "job_id": job_id,
        "ts": ts_ns / 1e9,
        "ts_ns": ts_ns,
        "job": job,
    }


def meta_event(meta: dict[str, Any], ts_ns: int, job_id: str | None = None) -> dict[str, Any]:
    """What a job declared (`api`, `api_ts`) or what was detected in it (`detected`), to be `stamp`ed.

    The collector knows the job when it makes the record, the epilog when it stamps it: the job id sits
    where each has always put it."""
    rec: dict[str, Any] = {"event": "meta"}
    if job_id is not None:
        rec["job_id"] = job_id
    rec["ts"] = ts_ns / 1e9
    rec["ts_ns"] = ts_ns
    rec["meta"] = meta
    return rec


def stamp(record: dict[str, Any], cluster: str, node: str, job_id: str) -> dict[str, Any]:
    """Give a record made off the hook's main path (`meta`) the version, place and `uid` of an event."""
    record.update(v=VERSION, cluster=cluster, node=node, job_id=job_id)
    record["uid"] = event_uid(cluster, node, job_id, record["event"], record["ts_ns"])
    return record


def validate_event(record: Any) -> str | None:
    """Why a spooled record cannot be shipped, or None."""
    if not isinstance(record, dict):
        return "not a JSON object"
    for key, typ in REQUIRED.items():
        if not isinstance(record.get(key), typ):  # type: ignore[arg-type]
            return f"missing or bad {key!r}"
    if record["event"] not in EVENT_KINDS:
        return f"unknown event {record['event']!r}"
    if not record["job_id"].isdigit():
        return f"bad job id {record['job_id']!r}"
    return None


class EnergyRow(tuple[str, float, str, str, str, str, float, float, float, int]):
    """One job's energy on one device from one source, from `t0` to `t1` (seconds since the epoch).

    `component` is gpu, cpu or dram; `device` a GPU's UUID ("" for RAPL); `source` what measured it
    (nvml, nvml-power-integral, nvml-power-edges, rapl); `method` "measured"; `final` true (1) once the
    job has ended and the value will not grow. The fields are `collector.db`'s `energy` columns in order.
    """

    __slots__ = ()

    def __new__(
        cls,
        job_id: str,
        job_start: float,
        component: str,
        device: str,
        source: str,
        method: str,
        energy_j: float,
        t0: float,
        t1: float,
        final: int,
    ) -> EnergyRow:
        return tuple.__new__(
            cls, (job_id, job_start, component, device, source, method, energy_j, t0, t1, final)
        )

    @property
    def job_id(self) -> str:
        return self[0]

    @property
    def job_start(self) -> float:
        return self[1]

    @property
    def component(self) -> str:
        return self[2]

    @property
    def device(self) -> str:
        return self[3]

    @property
    def source(self) -> str:
        return self[4]

    @property
    def method(self) -> str:
        return self[5]

    @property
    def energy_j(self) -> float:
        return self[6]

    @property
    def t0(self) -> float:
        return self[7]

    @property
    def t1(self) -> float:
        return self[8]

    @property
    def final(self) -> int:
        return self[9]

    def __repr__(self) -> str:
        return f"EnergyRow{tuple.__repr__(self)}"

    def key(self) -> tuple[str, float, str, str, str]:
        """What identifies the row (a later `t1` replaces it): job, its start, component, device, source."""
        return (self[0], self[1], self[2], self[3], self[4])

    def entry(self) -> dict[str, Any]:
        """The row as an `energy` entry of the epilog's event (the event carries the job id)."""
        return {
            "component": self[2],
            "device": self[3],
            "source": self[4],
            "method": self[5],
            "energy_j": self[6],
            "t0": self[7],
            "t1": self[8],
            "job_start": self[1],
            "final": bool(self[9]),
        }

    @classmethod
    def from_entry(cls, job_id: Any, e: Any) -> EnergyRow:
        """An `energy` entry of a spooled event, as a row bounded to the database's column widths.

        Raises KeyError, TypeError or ValueError for an entry that is not one (a record is JSON: anything
        may be there)."""
        return cls(
            str(job_id),
            float(e["job_start"]),
            str(e["component"])[:16],
            str(e["device"])[:128],
            str(e["source"])[:64],
            str(e.get("method", "measured"))[:16],
            float(e["energy_j"]),
            float(e["t0"]),
            float(e["t1"]),
            1 if e.get("final") else 0,
        )
