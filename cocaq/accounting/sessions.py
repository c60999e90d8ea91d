"""What an interactive session is (a notebook, a shell, an editor, `srun --pty`, `salloc`), defined once.

A job is an interactive session when any of these holds:

* its name is one of `[advice] interactive_names` (jupyter, bash, vscode...), case and spaces aside;
* its partition is one of `[advice] interactive_partitions`, or its name holds "interactive";
* its QOS is one of `[advice] interactive_qos`;
* its accounting has step lines and no batch step (`jobs.batch_step` false): sbatch runs the script in a
  `JOBID.batch` step, while a job that `srun` (`srun --pty bash`) or `salloc` started has only its numbered
  steps, `extern`, and with `LaunchParameters=use_interactive_step` (Slurm 20.11+) an `interactive` step.
  Where the import saw no step line (`sacct -X`, a job that never ran a step) nothing is known
  (`batch_step` NULL) and this rule says nothing.

Why it matters: a session that ends at its time limit ended normally (its user left it open), so the ledger
counts none of its energy as "possibly lost" (cocaq.accounting.ledger), and the advice never tells it to
checkpoint or to size `--time`. The rule is here as Python (`Sessions.holds`) and as the SQL the queries
embed (`Sessions.sql`); tests hold the two to the same answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from cocaq.config import Advice
from cocaq.db import dialect as sql

# The characters a configured name may keep as they are inside an SQL literal; any other (a quote, `%`,
# which psycopg reads as a parameter, `:`, which SQLAlchemy's text() reads as one) is written as chr(n).
_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _-./+@#=,")


def _literal(value: str, dialect: str) -> str:
    """`value` as an SQL string expression that holds no quote, `%` or `:` whatever the value."""
    parts: list[str] = []
    run = ""
    for ch in value:
        if ch in _PLAIN:
            run += ch
            continue
        if run:
            parts.append(f"'{run}'")
            run = ""
        parts.append(sql.char(dialect, ord(ch)))
    if run or not parts:
        parts.append(f"'{run}'")
    return " || ".join(parts) if len(parts) > 1 else parts[0]


@dataclass(frozen=True, slots=True)
class Sessions:
    """The site's definition of an interactive session (lower-case names, as the config loader keeps them)."""

    names: tuple[str, ...] = ()
    partitions: tuple[str, ...] = ()
    qos: tuple[str, ...] = ()

    @classmethod
    def of(cls, advice: Advice) -> Sessions:
        return cls(
            tuple(n.strip().lower() for n in advice.interactive_names),
            tuple(p.strip().lower() for p in advice.interactive_partitions),
            tuple(q.strip().lower() for q in advice.interactive_qos),
        )

    def holds(
        self, name: str | None, partition: str | None, qos: str | None, batch_step: bool | None
    ) -> bool:
        """Whether a job of this name, partition, QOS and batch step (None: not known) is a session."""
        return _holds(self, name, partition, qos, batch_step)

    def _test(
        self, name: str | None, partition: str | None, qos: str | None, batch_step: bool | None
    ) -> bool:
        nm = (name or "").strip().lower()
        if nm and nm in self.names:
            return True
        part = (partition or "").strip().lower()
        if "interactive" in part or (part and part in self.partitions):
            return True
        q = (qos or "").strip().lower()
        if q and q in self.qos:
            return True
        return batch_step is False

    def job(self, j: Any) -> bool:
        """`holds` for anything with a job's name, partition, qos and batch_step (JobFacts, a row)."""
        b = getattr(j, "batch_step", None)
        return self.holds(j.name, j.partition, getattr(j, "qos", None), None if b is None else bool(b))

    def sql(self, name: str, partition: str, qos: str, batch_step: str, dialect: str) -> str:
        """`holds` as an SQL boolean expression over these column expressions (for the rollups, the
        footprint's and the reports' queries)."""

        def among(col: str, values: tuple[str, ...]) -> str | None:
            vals = [v for v in dict.fromkeys(values) if v]
            if not vals:
                return None
            return f"{col} IN ({', '.join(_literal(v, dialect) for v in vals)})"

        nm = f"lower(trim(coalesce({name}, '')))"
        part = f"lower(trim(coalesce({partition}, '')))"
        q = f"lower(trim(coalesce({qos}, '')))"
        interactive = sql.strpos(dialect, part, "'interactive'")
        terms = [
            among(nm, tuple(n for n in self.names if n)),
            f"{interactive} > 0",
            among(part, self.partitions),
            among(q, self.qos),
            f"({batch_step} IS NOT NULL AND NOT {batch_step})",
        ]
        return "(" + " OR ".join(t for t in terms if t) + ")"


@lru_cache(maxsize=4096)
def _holds(
    s: Sessions, name: str | None, partition: str | None, qos: str | None, batch_step: bool | None
) -> bool:
    """`Sessions.holds`, cached: the advice asks it of each of a heavy user's 10,000 jobs, several times,
    and they have a few kinds of name, partition and QOS."""
    return s._test(name, partition, qos, batch_step)
