"""Which ML framework a job's processes run (PyTorch, TensorFlow, JAX, ...), from /proc, with no user action.

Evidence comes from the shared libraries each process has mapped (`/proc/<pid>/maps`): a framework's
native libraries sit at stable places inside its install (`<site-packages>/torch/lib/libtorch_cuda.so`,
`<site-packages>/tensorflow/libtensorflow_framework.so.2`, `<site-packages>/jaxlib/xla_extension.so`, ...),
and importing the framework maps them.  The version comes from metadata DIRECTORY NAMES beside the
install (`torch-2.3.1.dist-info`, a conda `pkgs/pytorch-2.1.0-<build>/` component, a name in `conda-meta/`);
no file in a user-controlled place is ever opened.  The launcher (torchrun, deepspeed, ...) comes from the
command line of the process or of its nearest ancestors, reduced to one canonical word: the command line
itself may hold secrets (`--token=...`) and is never kept.

Runs as root on every compute node and reads what users control, hence:
- every /proc file is opened under its pid's directory fd with O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, must be
  a regular file, and is read in bounded chunks (maps 4 MiB, cmdline and status 16 KiB);
- install directories are looked up inside the process's own root (`/proc/<pid>/root`, so containers work),
  walked one component at a time with O_NOFOLLOW (a symlink swapped into the path is never followed), and
  only their entry NAMES are read: at most MAX_DIR_ENTRIES per directory, MAX_DIRS directories per call;
- at most `max_pids` pids, at most MAX_PROBLEMS problem lines, stdlib only, no subprocess;
- a pid that exits mid-read is skipped silently; `detect()` reports every other failure in `problems`.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass

MAPS_LIMIT = 4 << 20  # bytes of /proc/<pid>/maps read, at most (a big PyTorch process maps ~0.5 MiB)
CMDLINE_LIMIT = 16 << 10
STATUS_LIMIT = 16 << 10
CHUNK = 64 << 10
MAX_LINE = 4352  # PATH_MAX plus the address/perms/offset/dev/inode columns; longer lines are garbage
MAX_DIR_ENTRIES = 5000  # entry names read from one install directory, at most
MAX_DIRS = 32  # install directories listed in one detect() call, at most
MAX_PROBLEMS = 10
MAX_PROBLEM_LEN = 200
MAX_ANCESTORS = 3  # parents whose command line may name the launcher (NVML lists the workers, not torchrun)
MAX_ARGS = 64  # argv entries looked at
MAX_ARG = 512  # characters of one argv entry looked at
PID_MAX = 1 << 22  # the kernel's largest pid_max

_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

# The main framework is the one most pids show; a tie goes to the earlier one here.
FRAMEWORKS = ("pytorch", "tensorflow", "jax", "paddle", "mxnet", "onnxruntime")

# A package directory (the component right below site-packages) -> canonical name: any shared object under
# it is evidence.  Frameworks and further libraries alike.
_PACKAGE_DIRS: dict[str, str] = {
    "torch": "pytorch",
    "tensorflow": "tensorflow",
    "tensorflow_core": "tensorflow",  # TF 1.15 / 2.0
    "tensorflow-plugins": "tensorflow",  # pluggable devices
    "jax": "jax",
    "jaxlib": "jax",
    "jax_plugins": "jax",
    "paddle": "paddle",
    "mxnet": "mxnet",
    "onnxruntime": "onnxruntime",
    "vllm": "vllm",
    "deepspeed": "deepspeed",
    "flash_attn": "flash-attn",
    "flash_attn_3": "flash-attn",
    "triton": "triton",
    "bitsandbytes": "bitsandbytes",
    "xformers": "xformers",
    "transformer_engine": "transformer-engine",
    "torchvision": "torchvision",
    "torchaudio": "torchaudio",
    "torch_xla": "torch-xla",
    "torch_tensorrt": "torch-tensorrt",
    "intel_extension_for_pytorch": "ipex",
    "tokenizers": "tokenizers",
    "horovod": "horovod",
    "cupy": "cupy",
    "cupy_backends": "cupy",
    "tensorrt": "tensorrt",
    "tensorrt_libs": "tensorrt",
    "sgl_kernel": "sglang",
    "flashinfer": "flashinfer",
    "apex": "apex",
    "mamba_ssm": "mamba-ssm",
    "xgboost": "xgboost",
}
_JAX_PLUGIN_DIR = re.compile(r"jax_(?:cuda|rocm)\d{1,3}_(?:plugin|pjrt)")

# A shared object's file name -> canonical name, wherever it lies (conda-forge puts libtorch in <prefix>/lib).
_BASENAMES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(rx), name)
    for rx, name in (
        (
            r"lib(?:torch(?:_cpu|_cuda|_cuda_linalg|_hip|_python|_global_deps)?|c10(?:_cuda|_hip)?)\.so",
            "pytorch",
        ),
        (r"lib(?:tensorflow|tensorflow_framework|tensorflow_cc)\.so", "tensorflow"),
        (r"_pywrap_tensorflow_internal\.", "tensorflow"),
        (r"xla_extension\.", "jax"),
        (r"libpaddle(?:_inference)?\.so", "paddle"),
        (r"libmxnet\.so", "mxnet"),
        (r"libonnxruntime(?:_providers_[a-z0-9_]{1,32})?\.so", "onnxruntime"),
        (r"onnxruntime_pybind11_state\.", "onnxruntime"),
        (r"flash_attn", "flash-attn"),
        (r"libtriton\.so|__triton_launcher\.", "triton"),
        (r"libbitsandbytes", "bitsandbytes"),
        (r"libnvinfer(?:_plugin)?\.so", "tensorrt"),
        (r"libtransformer_engine\.so|transformer_engine_(?:torch|jax|paddle)\.", "transformer-engine"),
        (r"(?:amp_C|apex_C|fused_layer_norm_cuda)\.", "apex"),
        (r"libxgboost\.so", "xgboost"),
    )
)
# DeepSpeed builds its ops just in time into ~/.cache/torch_extensions/<py_cu>/<op>/<op>.so.
_DEEPSPEED_OPS = frozenset(
    [
        "cpu_adam",
        "cpu_adagrad",
        "cpu_lion",
        "fused_adam",
        "fused_lamb",
        "fused_lion",
        "transformer_inference",
        "inference_core_ops",
        "ragged_device_ops",
        "async_io",
        "evoformer_attn",
        "quantizer",
    ]
)
_SHARED_OBJECT = re.compile(r"\.so(?:\.[0-9]{1,6}){0,4}$")
_SITE_DIRS = frozenset({"site-packages", "dist-packages"})
_CONDA_PREFIX = re.compile(r"(.+)/lib/python\d{1,2}(?:\.\d{1,3})?t?/(?:site|dist)-packages")

# Metadata names per framework, most preferred first; matched against normalized names (PEP 503 style with
# "_": lower case, runs of "-", "_", "." as one "_").  Only an exact match counts (torchvision is not torch).
_DISTS: dict[str, tuple[str, ...]] = {
    "pytorch": ("torch",),
    "tensorflow": tuple(
        [
            "tensorflow",
            "tensorflow_cpu",
            "tensorflow_gpu",
            "tensorflow_intel",
            "tensorflow_rocm",
            "intel_tensorflow",
            "tf_nightly",
            "tf_nightly_cpu",
            "tf_nightly_gpu",
        ]
    ),
    "jax": ("jax", "jaxlib"),  # jax's own version first; jaxlib's only without it (said in problems)
    "paddle": ("paddlepaddle", "paddlepaddle_gpu"),
    "mxnet": ("mxnet", "mxnet_cu*"),  # "*": mxnet_cu112, mxnet_cu102mkl, ... (a prefix match)
    "onnxruntime": tuple(
        [
            "onnxruntime",
            "onnxruntime_gpu",
            "onnxruntime_training",
            "onnxruntime_rocm",
            "onnxruntime_openvino",
            "ort_nightly",
            "ort_nightly_gpu",
        ]
    ),
}
_CONDA_NAMES: dict[str, tuple[str, ...]] = {
    "pytorch": ("pytorch", "pytorch_gpu", "pytorch_cpu", "libtorch"),
    "tensorflow": ("tensorflow_base", "tensorflow", "tensorflow_gpu", "libtensorflow", "libtensorflow_cc"),
    "jax": ("jax", "jaxlib"),
    "paddle": ("paddlepaddle", "paddlepaddle_gpu"),
    "mxnet": ("mxnet", "libmxnet"),
    "onnxruntime": ("onnxruntime", "onnxruntime_gpu", "onnxruntime_cpp"),
}
_METADATA_DIR = re.compile(
    r"([A-Za-z0-9][A-Za-z0-9._]{0,99}?)-(\d[^-]{0,40}?)(?:-py\d[0-9.]{0,8})?\.(?:dist|egg)-info"
)
_NORMALIZE = re.compile(r"[-_.]+")
# PEP 440-ish and strict: release, pre, post, dev, local (2.3.0a0+40ec155e58.nv24.3, 2.5.0.dev20240801+cu121)
_VERSION = re.compile(
    r"\d{1,9}(?:\.\d{1,9}){0,5}(?:(?:a|b|rc)\d{1,9})?(?:\.post\d{1,9})?(?:\.dev\d{1,12})?"
    r"(?:\+[a-z0-9]{1,24}(?:\.[a-z0-9]{1,24}){0,6})?",
    re.ASCII | re.IGNORECASE,
)
_MAX_VERSION = 32

# Launchers: a script or program name (argv[0], or the script a python interpreter runs) ...
_LAUNCHER_PROGRAMS: dict[str, str] = {
    "torchrun": "torchrun",
    "deepspeed": "deepspeed",
    "accelerate": "accelerate",
    "vllm": "vllm",
    "jupyter": "jupyter",
    "jupyter-lab": "jupyter",
    "jupyter-notebook": "jupyter",
    "jupyter-server": "jupyter",
    "ipython": "ipython",
    "ipython3": "ipython",
    "horovodrun": "horovodrun",
    "mpirun": "mpirun",
    "mpiexec": "mpirun",
    "orterun": "mpirun",
    "orted": "mpirun",
    "prted": "mpirun",
    "hydra_pmi_proxy": "mpirun",
    "tritonserver": "tritonserver",
    "raylet": "ray",
}
# ... a `python -m` module (it or a parent package) ...
_LAUNCHER_MODULES: dict[str, str] = {
    "torch.distributed.run": "torchrun",
    "torch.distributed.launch": "torchrun",  # the deprecated wrapper around torchrun
    "deepspeed.launcher": "deepspeed",
    "accelerate.commands": "accelerate",
    "vllm.entrypoints": "vllm",
    "ipykernel_launcher": "jupyter",
    "ipykernel": "jupyter",
    "jupyter": "jupyter",
    "jupyterlab": "jupyter",
    "notebook": "jupyter",
    "IPython": "ipython",
    "sglang.launch_server": "sglang",
    "horovod.runner": "horovodrun",
}
# ... or a process title set with setproctitle (vLLM's engine and workers, Ray's workers).
_LAUNCHER_TITLES: tuple[tuple[str, str], ...] = (("VLLM::", "vllm"), ("ray::", "ray"))
_PYTHON = re.compile(r"(?:python|pypy)(?:\d{1,2}(?:\.\d{1,3})?)?[tmdw]?")
_LAUNCHER_ORDER = tuple(  # a tie between launchers goes to the earlier one; "python" only if nothing else
    [
        "torchrun",
        "deepspeed",
        "accelerate",
        "vllm",
        "sglang",
        "horovodrun",
        "mpirun",
        "ray",
        "tritonserver",
        "jupyter",
        "ipython",
        "python",
    ]
)


@dataclass(frozen=True, slots=True)
class Detection:
    """What a job's processes run, in canonical words only (nothing copied from a command line)."""

    framework: str | None  # the main one: "pytorch", "tensorflow", "jax", "paddle", "mxnet", "onnxruntime"
    framework_version: str | None  # validated, e.g. "2.3.1"
    others: tuple[str, ...]  # further libraries and frameworks seen, sorted: ("triton", "vllm")
    launcher: str | None  # "torchrun", "deepspeed", "accelerate", "vllm", "jupyter", "python", ...
    pids_seen: int  # processes whose maps and command line were read
    problems: tuple[str, ...]  # one line per thing that could not be read, at most MAX_PROBLEMS

    def as_meta(self) -> dict[str, str]:
        """The job metadata entries (source "detected"), only those with a value."""
        meta: dict[str, str] = {}
        if self.framework:
            meta["framework"] = self.framework
        if self.framework_version:
            meta["framework_version"] = self.framework_version
        if self.others:
            meta["libraries"] = ",".join(self.others)
        if self.launcher:
            meta["launcher"] = self.launcher
        return meta


class _Vanished(Exception):
    """The process exited while it was read: skipped without a problem line."""


class _Refused(Exception):
    """A /proc file that is not what /proc holds (symlink, FIFO, ...) or could not be read; one line."""


@dataclass(frozen=True, slots=True)
class _Hit:
    """One piece of evidence: a canonical name and where its install's metadata may be."""

    name: str
    site: str | None  # the directory holding the package directory (site-packages), if known
    conda_version: str | None  # from a `pkgs/<name>-<version>-<build>/` component naming the framework
    prefix: str | None  # a conda-style prefix whose conda-meta/ may name the framework


class _Problems:
    """At most MAX_PROBLEMS distinct one-line problems; the last line counts what was left out."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.dropped = 0

    def add(self, line: str) -> None:
        line = line.replace("\n", " ")[:MAX_PROBLEM_LEN]
        if line in self.lines:
            return
        if len(self.lines) < MAX_PROBLEMS - 1:
            self.lines.append(line)
        else:
            self.dropped += 1

    def result(self) -> tuple[str, ...]:
        if self.dropped:
            return (*self.lines, f"{self.dropped} more problem(s) not shown")
        return tuple(self.lines)


def _read(name: str, dir_fd: int, limit: int) -> tuple[bytes, bool]:
    """The first `limit` bytes of a regular file under `dir_fd` and whether it was longer.

    Raises _Vanished (the process is gone) or _Refused.
    """
    try:
        fd = os.open(name, _OPEN_FILE, dir_fd=dir_fd)
    except (FileNotFoundError, ProcessLookupError):
        raise _Vanished from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _Refused(f"{name} is a symlink: refused") from None
        raise _Refused(f"{name}: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _Refused(f"{name} is not a regular file: refused")
        chunks: list[bytes] = []
        total = 0
        while total < limit:
            data = os.read(fd, min(CHUNK, limit - total))
            if not data:
                return b"".join(chunks), False
            chunks.append(data)
            total += len(data)
        return b"".join(chunks), bool(os.read(fd, 1))
    except (ProcessLookupError, FileNotFoundError):
        raise _Vanished from None
    except OSError as exc:
        raise _Refused(f"{name}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def _normalize(name: str) -> str:
    return _NORMALIZE.sub("_", name).lower()


def _version(text: str) -> str | None:
    """`text` if it is a plausible version string, else None (names are user-controlled)."""
    if len(text) <= _MAX_VERSION and _VERSION.fullmatch(text):
        return text
    return None


def _conda_package(component: str) -> tuple[str, str] | None:
    """(normalized name, version) of a conda `<name>-<version>-<build>` directory or `.json` name."""
    name, sep, _build = component.rpartition("-")
    if not sep:
        return None
    name, sep, version = name.rpartition("-")
    checked = _version(version) if sep and name else None
    return (_normalize(name), checked) if checked else None


def _dist_matches(pattern: str, name: str) -> bool:
    if pattern.endswith("*"):
        return name.startswith(pattern[:-1]) and name != pattern[:-1]
    return name == pattern


def _classify(path: str) -> _Hit | None:
    """The evidence one mapped file's path gives, if any.  Pure string work."""
    base = path.rpartition("/")[2]
    if not _SHARED_OBJECT.search(base):
        return None  # mmapped data (weights, datasets) is no evidence
    dirs = path.split("/")[1:-1]
    if ".." in dirs or "." in dirs or "" in dirs:
        return None
    name: str | None = None
    site: str | None = None
    # The package directory right below site-/dist-packages wins; else the deepest known one (source builds).
    for i in range(len(dirs) - 1, -1, -1):
        known = _PACKAGE_DIRS.get(dirs[i]) or ("jax" if _JAX_PLUGIN_DIR.fullmatch(dirs[i]) else None)
        if known is None:
            continue
        if i > 0 and dirs[i - 1] in _SITE_DIRS:
            name, site = known, "/" + "/".join(dirs[:i])
            break
        if name is None:
            name, site = known, "/" + "/".join(dirs[:i])
    if name is None:
        for rx, canonical in _BASENAMES:
            if rx.match(base):
                name = canonical
                break
    if name is None:
        if "torch_extensions" in dirs and base.partition(".")[0] in _DEEPSPEED_OPS:
            return _Hit("deepspeed", None, None, None)
        return None
    if name not in _DISTS:
        return _Hit(name, None, None, None)
    conda_version = None
    for i in range(1, len(dirs)):
        if dirs[i - 1] == "pkgs":
            pkg = _conda_package(dirs[i])
            if pkg and pkg[0] in _CONDA_NAMES[name]:
                conda_version = pkg[1]
                break
    prefix = None
    if site is not None:
        m = _CONDA_PREFIX.fullmatch(site)
        prefix = m.group(1) if m else None
    elif len(dirs) >= 2 and dirs[-1] == "lib":
        prefix = "/" + "/".join(dirs[:-1])
    return _Hit(name, site, conda_version, prefix)


def _parse_python_args(args: list[str]) -> tuple[str | None, str | None]:
    """(module of `-m`, script path) from a python interpreter's arguments; (None, None) for `-c` or none."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--" or not arg.startswith("-") or arg == "-":
            if arg == "--":
                i += 1
            return None, (args[i] if i < len(args) and args[i] != "-" else None)
        if arg.startswith("--"):  # --check-hash-based-pycs default, --help, ...
            i += 2 if arg == "--check-hash-based-pycs" else 1
            continue
        for j, flag in enumerate(arg[1:], start=1):
            if flag in "mcWX":
                value = arg[j + 1 :] or (args[i + 1] if i + 1 < len(args) else "")
                i += 1 if arg[j + 1 :] else 2
                if flag == "m":
                    return value, None
                if flag == "c":
                    return None, None
                break
        else:
            i += 1
    return None, None


def _launcher(cmdline: bytes) -> str | None:
    """The canonical launcher word a NUL-separated argv shows, or None.  Nothing else is kept."""
    argv = [a.decode("utf-8", "replace")[:MAX_ARG] for a in cmdline.split(b"\0")[:MAX_ARGS]]
    while argv and not argv[-1]:
        argv.pop()
    if not argv:
        return None
    for prefix, word in _LAUNCHER_TITLES:
        if argv[0].startswith(prefix):
            return word
    program = argv[0].rpartition("/")[2]
    if program in _LAUNCHER_PROGRAMS:
        return _LAUNCHER_PROGRAMS[program]
    if not _PYTHON.fullmatch(program):
        return None
    module, script = _parse_python_args(argv[1:])
    if module:
        parts = module.split(".")
        for n in range(len(parts), 0, -1):
            found = _LAUNCHER_MODULES.get(".".join(parts[:n]))
            if found:
                return found
    if script:
        return _LAUNCHER_PROGRAMS.get(script.rpartition("/")[2], "python")
    return "python"


def _status_fields(data: bytes) -> tuple[int | None, int | None]:
    """(real uid, parent pid) from /proc/<pid>/status."""
    uid = ppid = None
    for line in data.split(b"\n"):
        key, _, value = line.partition(b":")
        fields = value.split()
        if key == b"Uid" and fields and fields[0].isdigit():
            uid = int(fields[0])
        elif key == b"PPid" and fields and fields[0].isdigit():
            ppid = int(fields[0])
    return uid, ppid


class _Scan:
    """State of one detect() call: caches, counters and problems."""

    def __init__(self, proc_root: str, uid: int | None) -> None:
        self.proc_root = proc_root
        self.uid = uid
        self.problems = _Problems()
        self.pids_seen = 0
        self.framework_pids: dict[str, int] = {}
        self.versions: dict[str, dict[str, int]] = {}  # framework -> version -> pids
        self.others: set[str] = set()
        self.launchers: dict[str, int] = {}
        self.dirs: dict[tuple[int, int, str], dict[str, set[str]] | None] = {}
        self.commands: dict[int, tuple[str | None, int | None]] = {}  # pid -> (launcher, parent)

    # -- one pid --------------------------------------------------------------------------------------
    def _open_pid(self, pid: int) -> int:
        """The pid's /proc directory, never through a symlink.  Raises _Vanished or _Refused."""
        try:
            return os.open(f"{self.proc_root}/{pid}", _OPEN_DIR)
        except (FileNotFoundError, ProcessLookupError):
            raise _Vanished from None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # O_DIRECTORY | O_NOFOLLOW on a symlink: ENOTDIR
                raise _Refused("its /proc entry is a symlink or not a directory: refused") from None
            raise _Refused(f"its /proc directory: {exc.strerror or exc}") from None

    def inspect(self, pid: int) -> None:
        """Read one pid's status, maps and cmdline and add what they show."""
        try:
            pid_fd = self._open_pid(pid)
        except _Vanished:
            return
        except _Refused as exc:
            self.problems.add(f"pid {pid}: {exc}")
            return
        try:
            self._inspect(pid, pid_fd)
        except _Vanished:
            return
        except _Refused as exc:
            self.problems.add(f"pid {pid}: {exc}")
        finally:
            os.close(pid_fd)

    def _inspect(self, pid: int, pid_fd: int) -> None:
        try:
            status, _ = _read("status", pid_fd, STATUS_LIMIT)
        except _Refused as exc:
            if self.uid is not None:
                raise  # the owner cannot be checked: skip the pid
            self.problems.add(f"pid {pid}: {exc}: its parent is not looked at")
            status = b""
        owner, ppid = _status_fields(status)
        if self.uid is not None and owner != self.uid:
            self.problems.add(f"pid {pid}: not owned by the job's user: skipped")
            return
        maps, longer = _read("maps", pid_fd, MAPS_LIMIT)
        cmdline, _ = _read("cmdline", pid_fd, CMDLINE_LIMIT)
        if not maps and not cmdline:
            return  # a zombie or kernel thread: nothing to see
        self.pids_seen += 1
        if longer:
            self.problems.add(f"pid {pid}: maps longer than {MAPS_LIMIT >> 20} MiB: read the first part only")
            maps = maps[: maps.rfind(b"\n") + 1]  # drop the cut line
        word = _launcher(cmdline)
        self.commands[pid] = (word, ppid)
        if word in (None, "python"):
            word = self._ancestor_launcher(ppid) or word
        if word:
            self.launchers[word] = self.launchers.get(word, 0) + 1
        hits = self._hits(maps)
        frameworks = {hit.name for hit in hits if hit.name in _DISTS}
        self.others.update(hit.name for hit in hits if hit.name not in _DISTS)
        for name in frameworks:
            self.framework_pids[name] = self.framework_pids.get(name, 0) + 1
        if frameworks:
            self._versions(pid, pid_fd, [hit for hit in hits if hit.name in _DISTS])

    @staticmethod
    def _hits(maps: bytes) -> set[_Hit]:
        paths: set[str] = set()
        for raw in maps.split(b"\n"):
            if len(raw) > MAX_LINE:
                continue
            fields = raw.decode("utf-8", "replace").split(None, 5)
            if len(fields) == 6 and fields[5].startswith("/"):
                path = fields[5]
                paths.add(path[: -len(" (deleted)")] if path.endswith(" (deleted)") else path)
        return {hit for hit in map(_classify, paths) if hit is not None}

    def _ancestor_launcher(self, ppid: int | None) -> str | None:
        """A specific launcher in the command line of the nearest ancestors (same user), if any."""
        for _ in range(MAX_ANCESTORS):
            if ppid is None or ppid <= 1:
                return None
            if ppid not in self.commands:
                self.commands[ppid] = self._ancestor(ppid)
            word, ppid = self.commands[ppid]
            if word not in (None, "python"):
                return word
        return None

    def _ancestor(self, pid: int) -> tuple[str | None, int | None]:
        """(launcher, parent) of an ancestor; (None, None) when it is gone, unreadable or someone else's."""
        try:
            pid_fd = self._open_pid(pid)
        except (_Vanished, _Refused):
            return None, None
        try:
            status, _ = _read("status", pid_fd, STATUS_LIMIT)
            owner, ppid = _status_fields(status)
            if self.uid is not None and owner != self.uid:
                return None, None  # slurmstepd and other root processes end the walk
            cmdline, _ = _read("cmdline", pid_fd, CMDLINE_LIMIT)
            return _launcher(cmdline), ppid
        except (_Vanished, _Refused):
            return None, None
        finally:
            os.close(pid_fd)

    # -- versions -------------------------------------------------------------------------------------
    def _versions(self, pid: int, pid_fd: int, hits: list[_Hit]) -> None:
        """Count the version(s) each framework this pid maps was installed with."""
        root_fd: int | None = None
        try:
            try:
                root_fd = os.open("root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=pid_fd)
                root_stat = os.fstat(root_fd)
            except (FileNotFoundError, ProcessLookupError):
                return
            except OSError as exc:
                self.problems.add(f"pid {pid}: its root: {exc.strerror or exc}: no versions")
                return
            root_key = (root_stat.st_dev, root_stat.st_ino)
            found: dict[str, set[str]] = {}
            for hit in hits:
                version = self._version_of(hit, root_fd, root_key)
                if version:
                    found.setdefault(hit.name, set()).add(version)
            for name, versions in found.items():
                counts = self.versions.setdefault(name, {})
                for version in versions:
                    counts[version] = counts.get(version, 0) + 1
        finally:
            if root_fd is not None:
                os.close(root_fd)

    def _version_of(self, hit: _Hit, root_fd: int, root_key: tuple[int, int]) -> str | None:
        """A conda pkgs component, then site-packages' dist-info names, then conda-meta's names."""
        if hit.conda_version:
            return hit.conda_version
        if hit.site:
            names = self._list(root_fd, root_key, hit.site, conda=False)
            version = self._pick(hit.name, names, _DISTS[hit.name], "dist-info")
            if version:
                return version
        if hit.prefix:
            names = self._list(root_fd, root_key, hit.prefix + "/conda-meta", conda=True)
            return self._pick(hit.name, names, _CONDA_NAMES[hit.name], "conda-meta")
        return None

    def _pick(
        self, framework: str, names: dict[str, set[str]] | None, wanted: tuple[str, ...], where: str
    ) -> str | None:
        """The version of the most preferred name present; None (and a problem) if it has several."""
        if not names:
            return None
        for pattern in wanted:
            versions: set[str] = set()
            for name, found in names.items():
                if _dist_matches(pattern, name):
                    versions |= found
            if len(versions) == 1:
                version = versions.pop()
                if framework == "jax" and pattern == "jaxlib":
                    self.problems.add(f"jax: no jax {where}, version {version} is jaxlib's")
                return version
            if versions:
                listed = ", ".join(sorted(versions))
                self.problems.add(
                    f"{framework}: several {pattern} {where} versions ({listed}) in one place: unknown"
                )
                return None
        return None

    def _list(
        self, root_fd: int, root_key: tuple[int, int], path: str, *, conda: bool
    ) -> dict[str, set[str]] | None:
        """Metadata names -> versions in one install directory, cached; only entry names are read."""
        key = (*root_key, path)
        if key in self.dirs:
            return self.dirs[key]
        if len(self.dirs) >= MAX_DIRS:
            self.problems.add(f"more than {MAX_DIRS} install directories: versions not looked up in the rest")
            return None
        self.dirs[key] = None
        fd = self._walk(root_fd, path)
        if fd is None:
            return None
        names: dict[str, set[str]] = {}
        try:
            with os.scandir(fd) as entries:
                for count, entry in enumerate(entries):
                    if count >= MAX_DIR_ENTRIES:
                        self.problems.add(
                            f"an install directory has over {MAX_DIR_ENTRIES} entries: read that many only"
                        )
                        break
                    parsed = self._metadata_name(entry.name, conda=conda)
                    if parsed:
                        names.setdefault(parsed[0], set()).add(parsed[1])
        except OSError:
            return None
        finally:
            os.close(fd)
        self.dirs[key] = names
        return names

    @staticmethod
    def _metadata_name(entry: str, *, conda: bool) -> tuple[str, str] | None:
        if conda:
            return _conda_package(entry[:-5]) if entry.endswith(".json") else None
        m = _METADATA_DIR.fullmatch(entry)
        if m is None:
            return None
        version = _version(m.group(2))
        return (_normalize(m.group(1)), version) if version else None

    @staticmethod
    def _walk(root_fd: int, path: str) -> int | None:
        """An fd of `path` inside the process's root, opened one component at a time, never via a symlink."""
        parts = [p for p in path.split("/") if p]
        if not parts or len(parts) > 64 or ".." in parts:
            return None
        fd = root_fd
        try:
            for part in parts:
                nxt = os.open(part, _OPEN_DIR, dir_fd=fd)
                if fd != root_fd:
                    os.close(fd)
                fd = nxt
        except OSError:
            if fd != root_fd:
                os.close(fd)
            return None
        return fd

    # -- result ---------------------------------------------------------------------------------------
    def result(self) -> Detection:
        framework = None
        if self.framework_pids:
            framework = min(self.framework_pids, key=lambda n: (-self.framework_pids[n], FRAMEWORKS.index(n)))
        version = None
        counts = self.versions.get(framework, {}) if framework else {}
        if counts:
            ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
            if len(ranked) == 1 or ranked[0][1] > ranked[1][1]:
                version = ranked[0][0]
            if len(ranked) > 1:
                listed = ", ".join(f"{v} ({n} pid{'s' * (n != 1)})" for v, n in ranked[:4])
                outcome = f"reporting {version}" if version else "a tie: unknown"
                self.problems.add(f"{framework}: processes run different versions: {listed}: {outcome}")
        others = self.others | {name for name in self.framework_pids if name != framework}
        launcher = None
        if self.launchers:
            launcher = min(
                self.launchers, key=lambda w: (w == "python", -self.launchers[w], _LAUNCHER_ORDER.index(w))
            )
        return Detection(
            framework=framework,
            framework_version=version,
            others=tuple(sorted(others)),
            launcher=launcher,
            pids_seen=self.pids_seen,
            problems=self.problems.result(),
        )


def detect(
    pids: Iterable[int], *, proc_root: str = "/proc", uid: int | None = None, max_pids: int = 64
) -> Detection:
    """What the processes `pids` run: framework, version, further libraries, launcher.

    `uid`: skip (with a problem line) processes whose real uid differs: a shared GPU's process list can
    hold another user's pid.  Looks at the first `max_pids` distinct pids only.  Never raises for what it
    reads; everything that could not be read is one line in `problems`.
    """
    scan = _Scan(proc_root.rstrip("/") or "/", uid)
    chosen: list[int] = []
    seen: set[int] = set()
    more = False
    for pid in pids:
        if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid <= PID_MAX:
            scan.problems.add("ignored an entry that is not a pid")
            continue
        if pid in seen:
            continue
        if len(chosen) >= max_pids:
            more = True
            break
        seen.add(pid)
        chosen.append(pid)
    if more:
        scan.problems.add(f"more than {max_pids} pids: looked at the first {max_pids} only")
    for pid in chosen:
        scan.inspect(pid)
    return scan.result()
