"""The demo's site: its cluster (partitions, metered nodes, the config a site would write) and its users
with their habits, and the rule that a demo writes only into an embedded SQLite database.

Every other module of cocaq.demo builds on these; the one-month demo (cocaq.demo.month) uses the ten
users, the e-mail study's site (cocaq.demo.study) their copies (`population`).
"""

from __future__ import annotations

import random

from sqlalchemy.engine import make_url

from cocaq.errors import UsageError

DEMO_CLUSTER = "demo"

# partition -> (node prefix, nodes, GPUs per node, cores per node)
PARTITIONS = {
    "gpu_a100": ("a100-", 4, 8, 128),
    "gpu_v100": ("v100-", 6, 4, 40),
    "cpu": ("cpu-", 12, 0, 192),
    "interactive": ("a100-", 4, 8, 128),  # not in the config: shows the default-profile warning
}

# The V100 nodes with IPMI energy accounting and the collector (the newer half): their jobs are measured,
# and the GPU energy of the jobs on the other V100 nodes is estimated from what these drew
# (cocaq.accounting.calibrate) rather than from the V100's rated power.
METERED_V100 = {"v100-01", "v100-02", "v100-03"}


def metered_v100(nodes: list[str]) -> bool:
    return bool(nodes) and all(n in METERED_V100 for n in nodes)


DEMO_CONFIG = """\
# The demo cluster's description; a real site writes one like it to /etc/cocaq/cocaq.toml.
[cluster]
name = "demo"
carbon_zone = "ES"       # Spain: its hourly intensity (real 2023 hours, replayed onto the demo's weeks)
pue = 1.35
timezone = "UTC"

[estimate]
gpu_utilisation = 0.8    # share of GPU TDP assumed when nothing measured the GPUs

[partitions.gpu_a100]     # nodes with IPMI energy accounting: Slurm measures their energy
cpu_model = "AMD EPYC 7763 (64 cores, 280 W)"
cpu_tdp_w_per_core = 4.4
gpu_model = "NVIDIA A100-SXM4-80GB"
gpu_tdp_w = 400
gpu_mem_gb = 80
mem_gb = 1024

[partitions.gpu_v100]
cpu_model = "Intel Xeon Gold 6248 (20 cores, 150 W)"
cpu_tdp_w_per_core = 7.5
gpu_model = "NVIDIA V100-SXM2-32GB"
gpu_tdp_w = 300
gpu_mem_gb = 32
mem_gb = 384

[partitions.cpu]
cpu_model = "AMD EPYC 9654 (96 cores, 360 W)"
cpu_tdp_w_per_core = 3.75
gpu_tdp_w = 0
mem_gb = 768

[advice]                 # slurm.conf's MaxTime per partition: no --time the advice proposes goes above it
partition_max_time = { gpu_a100 = "2-00:00:00", gpu_v100 = "1-00:00:00", cpu = "1-00:00:00" }

[collector]
interval_s = 300         # the demo's GPU samples (A100 nodes) are 5 minutes apart; a real collector: 10 s

[embodied]               # manufacturing (scope 3), reported apart from operational CO2
g_per_gpu_hour = 25
g_per_node_hour = 10

[mail]
transport = "outbox"
address_template = "{user}@example.org"
from_address = "Demo cluster reports <hpc-reports@demo-cluster.example.org>"
reply_to = "Demo cluster HPC support <hpc-support@example.org>"   # where replies and "unsubscribe" go

[reports]
site_name = "Demo cluster"
contact = "hpc-support@example.org"
admins = ["hpc-admins@example.org"]
lab_heads = { lab_nlp = ["nlp-head@example.org"], lab_vision = ["vision-head@example.org"] }
"""


# user -> (lab, uid, habits: kind -> jobs per day)
USERS: dict[str, tuple[str, int, dict[str, float]]] = {
    "alice": ("lab_vision", 2001, {"train": 1.2, "debug": 2.0}),
    "bob": ("lab_vision", 2002, {"train": 0.4, "debug": 1.0, "preprocess": 0.2}),
    "carol": ("lab_vision", 2003, {"debug": 3.0, "train": 0.1}),
    "dave": ("lab_nlp", 2004, {"llm": 0.35, "train": 0.8, "debug": 1.5}),
    "erin": ("lab_nlp", 2005, {"notebook": 1.0, "debug": 0.5}),
    "frank": ("lab_nlp", 2006, {"train": 0.5, "debug": 0.8}),
    "grace": ("lab_genomics", 2007, {"preprocess": 1.2, "cpu_sim": 0.4}),
    "heidi": ("lab_genomics", 2008, {"preprocess": 0.3, "cpu_sim": 0.1}),
    "ivan": ("lab_climate", 2009, {"cpu_sim": 0.8, "train": 0.2}),
    "judy": ("lab_climate", 2010, {"notebook": 0.3, "debug": 0.4}),
}


def population(copies: int, seed: int) -> dict[str, tuple[str, int, dict[str, float]]]:
    """USERS, and `copies - 1` more of each GPU user (alice2, alice3, ...) with their own habits (the
    rates times a factor around 1): a site large enough for the e-mail study's arms (cocaq.demo.study).
    The CPU-only users are not copied: the study's outcomes are about GPUs."""
    rng = random.Random(seed + 11)
    out = dict(USERS)
    gpu_kinds = {"llm", "train", "debug", "notebook"}
    for k in range(2, copies + 1):
        for user, (lab, uid, habits) in USERS.items():
            if not gpu_kinds & set(habits):
                continue
            mine = {kind: r * rng.lognormvariate(0.0, 0.35) for kind, r in habits.items()}
            out[f"{user}{k}"] = (lab, uid + 100 * k, mine)
    return out


def require_sqlite(url: str) -> None:
    """Either demo writes made-up jobs: never into a site's real database."""
    from cocaq.db.engine import mask_url

    if make_url(url).get_backend_name() != "sqlite":
        raise UsageError(
            "cocaq demo writes made-up jobs, so it only uses an embedded SQLite database, "
            f"not {mask_url(url)}: "
            "unset COCAQ_DATABASE_URL (or point it at a sqlite:/// file) to run it"
        )
