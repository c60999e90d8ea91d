"""The read API's answers on a demo database, one file per request, for scripts/demo-snapshot.sh.

In process (FastAPI's TestClient) with the MUNGE decoding replaced: the credential is the request's own
path and uid 0 (root) is an admin, so every route answers as it would to an admin over MUNGE. Usage:
python scripts/api_snapshot.py CONFIG OUTDIR (the demo's cocaq-demo.toml; COCAQ_DATABASE_URL names its
database). Windows are absolute, so the answers do not move with the clock.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from urllib.parse import quote

from fastapi.testclient import TestClient
from sqlalchemy import text

from cocaq.api.client import payload_for
from cocaq.api.server import create_app
from cocaq.config_load import load_config
from cocaq.db.engine import make_engine


def main(cfg_path: str, out: str) -> None:
    cfg = load_config(Path(cfg_path), dict(__import__("os").environ))
    cfg = replace(cfg, api=replace(cfg.api, admin_users=("root",)))
    client = TestClient(create_app(cfg, decode=lambda cred: (0, payload_for("GET", cred))))
    engine = make_engine(cfg.database_url)
    with engine.connect() as conn:
        users = list(conn.execute(text("SELECT DISTINCT user_name FROM jobs ORDER BY 1")).scalars())
        labs = list(conn.execute(text("SELECT DISTINCT account FROM jobs ORDER BY 1")).scalars())
        # every 40th job, and every job with the most energy of its user
        ids = list(conn.execute(text("SELECT job_id FROM jobs ORDER BY id")).scalars())
        top = conn.execute(
            text(
                "SELECT user_name, job_id FROM jobs j WHERE energy_j = (SELECT max(energy_j) FROM jobs k"
                " WHERE k.user_name = j.user_name) ORDER BY 1, 2"
            )
        ).all()
    engine.dispose()
    jobs = sorted({*ids[::40], *(j for _, j in top)}, key=str)
    win = {"since": "2026-10-01T00:00:00+00:00", "until": "2026-11-20T10:30:00+00:00"}
    month = {"since": "2026-11-01T00:00:00+00:00", "until": "2026-11-20T10:30:00+00:00"}
    asks: list[tuple[str, dict[str, str]]] = [("/v1/whoami", {})]
    for u in users:
        asks += [(f"/v1/users/{quote(u, safe='')}", win), (f"/v1/users/{quote(u, safe='')}", month)]
    for a in labs:
        asks.append((f"/v1/labs/{quote(a, safe='')}", win))
    asks += [(f"/v1/jobs/{quote(str(j), safe='')}", {}) for j in jobs]
    asks += [("/v1/live", {}), ("/v1/models", win), ("/v1/top", win), ("/v1/top", {**win, "by": "account"})]
    for table in ("jobs", "job_energy", "daily_rollups"):
        asks.append((f"/v1/export/{table}", {**win, "limit": "500"}))
    dest = Path(out)
    dest.mkdir(parents=True, exist_ok=True)
    for i, (path, params) in enumerate(asks):
        r = client.get(path, params=params, headers={"Authorization": f"MUNGE {path}"})
        body = r.text
        if r.headers.get("content-type", "").startswith("application/json"):
            body = json.dumps(r.json(), indent=1, sort_keys=True)
        name = f"{i:03d}" + path.replace("/", "_") + ("_" + "_".join(params.values()) if params else "")
        name = name.replace(":", "").replace("+", "")[:120]
        (dest / f"{name}.txt").write_text(f"{r.status_code}\n{body}\n")
    print(f"api-snapshot: {len(asks)} answers in {dest}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
