"""Framework detection from /proc on fake /proc and install trees: evidence, versions, launchers, safety caps."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from cocaq.collector import detect as detect_mod
from cocaq.collector.detect import MAPS_LIMIT, MAX_PROBLEMS, Detection, detect

UID = 1000


def maps_line(path: str, n: int = 0) -> str:
    """One /proc/<pid>/maps line as the kernel prints it (the path column padded)."""
    return f"7f2a{n:08x}-7f2a{n + 1:08x} r-xp 00000000 fd:01 1234567                    {path}\n"


class FakeProc:
    """A /proc tree: proc/<pid>/{maps,cmdline,status} and proc/<pid>/root -> / (or a container's root)."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path / "proc"
        self.root.mkdir()

    def add(
        self,
        pid: int,
        libs: Sequence[str | Path] = (),
        cmdline: Sequence[str] = ("/usr/bin/python3", "train.py"),
        *,
        uid: int = UID,
        ppid: int = 1,
        maps: bytes | None = None,
        root: str | Path = "/",
    ) -> Path:
        d = self.root / str(pid)
        d.mkdir()
        base = ["/usr/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"]
        lines = [maps_line(str(p), i) for i, p in enumerate([*base, *libs])]
        lines.insert(0, "55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0                          [heap]\n")
        (d / "maps").write_bytes(maps if maps is not None else "".join(lines).encode())
        (d / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in cmdline))
        (d / "status").write_text(
            f"Name:\tpython3\nState:\tS (sleeping)\nPid:\t{pid}\nPPid:\t{ppid}\n"
            f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t100\t100\t100\t100\n"
        )
        (d / "root").symlink_to(root)
        return d

    def detect(self, pids: Sequence[int], *, uid: int | None = None, max_pids: int = 64) -> Detection:
        return detect(pids, proc_root=str(self.root), uid=uid, max_pids=max_pids)


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    return FakeProc(tmp_path)


@pytest.fixture
def base(tmp_path: Path) -> Path:
    """A resolved scratch dir: maps paths are canonical, so the fake installs must not sit below a symlink."""
    d = tmp_path.resolve() / "fs"
    d.mkdir()
    return d


def venv(base: Path, name: str = "venv", *dist_infos: str, py: str = "python3.11") -> Path:
    """A pip virtualenv's site-packages with the given metadata directories."""
    sp = base / name / "lib" / py / "site-packages"
    sp.mkdir(parents=True)
    for entry in dist_infos:
        (sp / entry).mkdir()
    (sp / "numpy-1.26.4.dist-info").mkdir()
    return sp


def torch_libs(sp: Path) -> list[Path]:
    lib = sp / "torch" / "lib"
    lib.mkdir(parents=True, exist_ok=True)
    return [
        lib / "libc10.so",
        lib / "libtorch_cpu.so",
        lib / "libtorch_cuda.so",
        lib / "libtorch_python.so",
        sp / "torch" / "_C.cpython-311-x86_64-linux-gnu.so",
        sp / "nvidia" / "cudnn" / "lib" / "libcudnn.so.9",
    ]


# -- frameworks and versions ----------------------------------------------------------------------------


def test_pytorch_pip_with_version(proc: FakeProc, base: Path) -> None:
    sp = venv(
        base,
        "venv",
        "torch-2.3.1.dist-info",
        "torchvision-0.18.1.dist-info",
        "torch_tb_profiler-0.4.3.dist-info",
    )
    proc.add(4242, torch_libs(sp))
    det = proc.detect([4242])
    assert det == Detection("pytorch", "2.3.1", (), "python", 1, ())
    assert det.as_meta() == {"framework": "pytorch", "framework_version": "2.3.1", "launcher": "python"}


def test_pytorch_without_metadata_has_no_version(proc: FakeProc, base: Path) -> None:
    sp = venv(base)
    proc.add(10, torch_libs(sp))
    det = proc.detect([10])
    assert (det.framework, det.framework_version, det.problems) == ("pytorch", None, ())
    assert det.as_meta() == {"framework": "pytorch", "launcher": "python"}


def test_container_paths_are_looked_up_in_the_process_root(proc: FakeProc, base: Path) -> None:
    # NGC image under enroot/pyxis: maps shows the container's paths, its files are at /proc/<pid>/root/...
    container = base / "container"
    sp = container / "usr/local/lib/python3.10/dist-packages"
    sp.mkdir(parents=True)
    (sp / "torch-2.3.0a0+40ec155e58.nv24.3.dist-info").mkdir()
    lib = "/usr/local/lib/python3.10/dist-packages/torch/lib/libtorch_cuda.so"
    proc.add(11, [lib], root=container)
    det = proc.detect([11])
    assert (det.framework, det.framework_version) == ("pytorch", "2.3.0a0+40ec155e58.nv24.3")
    # the same path outside the container has no metadata: the host's tree is not the one read
    proc.add(12, [lib])
    assert proc.detect([12]).framework_version is None


def test_conda_pkgs_layout(proc: FakeProc, base: Path) -> None:
    pkg = base / "miniconda3/pkgs/pytorch-2.1.0-py3.10_cuda12.1_cudnn8.9.2_0/lib/python3.10/site-packages"
    proc.add(20, [pkg / "torch/lib/libtorch_cuda.so", pkg / "torch/lib/libc10.so"])
    det = proc.detect([20])
    assert (det.framework, det.framework_version) == ("pytorch", "2.1.0")


def test_conda_forge_libtorch_in_prefix_lib(proc: FakeProc, base: Path) -> None:
    env = base / "miniforge3/envs/train"
    (env / "conda-meta").mkdir(parents=True)
    for name in (
        "libtorch-2.4.1-cuda120_h1b9b48e_300.json",
        "python-3.11.9-hb806964_0_cpython.json",
        "history",
    ):
        (env / "conda-meta" / name).touch()
    proc.add(21, [env / "lib/libtorch_cuda.so", env / "lib/libc10.so"])
    det = proc.detect([21])
    assert (det.framework, det.framework_version) == ("pytorch", "2.4.1")


def test_tensorflow(proc: FakeProc, base: Path) -> None:
    sp = venv(
        base,
        "tf",
        "tensorflow_cpu-2.15.1.dist-info",
        "tensorflow_io-0.36.0.dist-info",
        "keras-3.3.3.dist-info",
    )
    libs = [
        sp / "tensorflow/libtensorflow_framework.so.2",
        sp / "tensorflow/python/_pywrap_tensorflow_internal.so",
    ]
    proc.add(30, libs)
    det = proc.detect([30])
    assert (det.framework, det.framework_version, det.others) == ("tensorflow", "2.15.1", ())


def test_jax_prefers_jax_metadata_over_jaxlib(proc: FakeProc, base: Path) -> None:
    sp = venv(
        base, "jax", "jax-0.4.30.dist-info", "jaxlib-0.4.29.dist-info", "jax_cuda12_plugin-0.4.29.dist-info"
    )
    libs = [sp / "jaxlib/xla_extension.so", sp / "jax_plugins/xla_cuda12/xla_cuda_plugin.so"]
    proc.add(40, libs)
    det = proc.detect([40])
    assert (det.framework, det.framework_version, det.problems) == ("jax", "0.4.30", ())


def test_jax_with_jaxlib_metadata_only_says_so(proc: FakeProc, base: Path) -> None:
    sp = venv(base, "jax", "jaxlib-0.4.30.dist-info")
    proc.add(41, [sp / "jaxlib/xla_extension.so"])
    det = proc.detect([41])
    assert (det.framework, det.framework_version) == ("jax", "0.4.30")
    assert det.problems == ("jax: no jax dist-info, version 0.4.30 is jaxlib's",)


@pytest.mark.parametrize(
    ("lib", "dist", "framework", "version"),
    [
        ("paddle/base/libpaddle.so", "paddlepaddle_gpu-2.6.1.dist-info", "paddle", "2.6.1"),
        ("mxnet/libmxnet.so", "mxnet_cu112-1.9.1.dist-info", "mxnet", "1.9.1"),
        (
            "onnxruntime/capi/onnxruntime_pybind11_state.so",
            "onnxruntime_gpu-1.18.0.dist-info",
            "onnxruntime",
            "1.18.0",
        ),
        (
            "tensorflow/libtensorflow_framework.so.2",
            "tf_nightly-2.18.0.dev20240801.dist-info",
            "tensorflow",
            "2.18.0.dev20240801",
        ),
        ("torch/lib/libtorch_cuda.so", "torch-2.0.1-py3.11.egg-info", "pytorch", "2.0.1"),
    ],
)
def test_each_framework(
    proc: FakeProc, base: Path, lib: str, dist: str, framework: str, version: str
) -> None:
    sp = venv(base, "v", dist)
    proc.add(50, [sp / lib])
    det = proc.detect([50])
    assert (det.framework, det.framework_version, det.problems) == (framework, version, ())


def test_vllm_on_pytorch(proc: FakeProc, base: Path) -> None:
    sp = venv(base, "serve", "torch-2.4.0.dist-info", "vllm-0.6.3.dist-info")
    libs = [
        *torch_libs(sp),
        sp / "vllm/_C.abi3.so",
        sp / "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
        sp / "triton/_C/libtriton.so",
        sp / "xformers/_C.so",
        sp / "flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so",
        sp / "tokenizers/tokenizers.abi3.so",
        base / "home/.triton/cache/0c4f/__triton_launcher.so",
        sp / "vllm/model_weights.bin",  # not a shared object: no evidence
    ]
    proc.add(
        60, libs, ["/venv/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--api-key", "SECRET"]
    )
    det = proc.detect([60])
    assert det.framework == "pytorch" and det.framework_version == "2.4.0" and det.launcher == "vllm"
    assert det.others == ("flash-attn", "tokenizers", "triton", "vllm", "xformers")
    assert det.as_meta()["libraries"] == "flash-attn,tokenizers,triton,vllm,xformers"


def test_deepspeed_ops_and_jit_built_extensions(proc: FakeProc, base: Path) -> None:
    sp = venv(base, "ds", "torch-2.3.1.dist-info")
    ext = base / "home/.cache/torch_extensions/py311_cu121/fused_adam/fused_adam.so"
    proc.add(61, [*torch_libs(sp), ext])
    assert proc.detect([61]).others == ("deepspeed",)
    proc.add(62, [*torch_libs(sp), sp / "deepspeed/ops/adam/cpu_adam_op.so"])
    assert proc.detect([62]).others == ("deepspeed",)


def test_main_framework_by_pid_count_then_priority(proc: FakeProc, base: Path) -> None:
    sp = venv(base, "both", "torch-2.3.1.dist-info", "tensorflow-2.16.1.dist-info")
    tf = sp / "tensorflow/libtensorflow_framework.so.2"
    proc.add(70, [*torch_libs(sp), tf])
    proc.add(71, [tf])
    det = proc.detect([70, 71])
    assert (det.framework, det.framework_version, det.others) == ("tensorflow", "2.16.1", ("pytorch",))
    det = proc.detect([70])  # a tie: pytorch comes first
    assert (det.framework, det.framework_version, det.others) == ("pytorch", "2.3.1", ("tensorflow",))


def test_two_metadata_dirs_of_different_versions_give_none(proc: FakeProc, base: Path) -> None:
    # a stale dist-info left by a broken upgrade: which one is live cannot be told from names alone
    sp = venv(base, "v", "torch-2.1.0.dist-info", "torch-2.3.1.dist-info")
    proc.add(80, torch_libs(sp))
    det = proc.detect([80])
    assert (det.framework, det.framework_version) == ("pytorch", None)
    assert det.problems == ("pytorch: several torch dist-info versions (2.1.0, 2.3.1) in one place: unknown",)


def test_same_version_twice_and_near_names_are_fine(proc: FakeProc, base: Path) -> None:
    sp = venv(
        base,
        "v",
        "torch-2.3.1.dist-info",
        "torch-2.3.1-py3.11.egg-info",
        "torchaudio-2.3.1.dist-info",
        "Torch_XLA-2.3.0.dist-info",
    )
    proc.add(81, torch_libs(sp))
    assert proc.detect([81]).framework_version == "2.3.1"


def test_processes_with_different_versions(proc: FakeProc, base: Path) -> None:
    a = venv(base, "a", "torch-2.1.0.dist-info")
    b = venv(base, "b", "torch-2.3.1.dist-info")
    proc.add(90, torch_libs(a))
    proc.add(91, torch_libs(b))
    proc.add(92, torch_libs(b))
    det = proc.detect([90, 91, 92])
    assert det.framework_version == "2.3.1"
    assert det.problems == (
        "pytorch: processes run different versions: 2.3.1 (2 pids), 2.1.0 (1 pid): reporting 2.3.1",
    )
    det = proc.detect([90, 91])
    assert det.framework_version is None and "a tie: unknown" in det.problems[0]


@pytest.mark.parametrize(
    "name",
    [
        "torch-2.3.1;reboot.dist-info",
        "torch-2.3.1 --evil.dist-info",
        "torch-" + "1" * 40 + ".dist-info",
        "torch-v2.dist-info",
        "torch.dist-info",
        "torch-2.3.1\n.dist-info",
    ],
)
def test_implausible_versions_are_not_reported(proc: FakeProc, base: Path, name: str) -> None:
    sp = venv(base, "v")
    (sp / name).mkdir()
    proc.add(93, torch_libs(sp))
    assert proc.detect([93]).framework_version is None


# -- launchers -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "launcher"),
    [
        (["torchrun", "--nproc-per-node=4", "train.py"], "torchrun"),
        (
            ["/usr/bin/python3.11", "-u", "-m", "torch.distributed.run", "--nproc_per_node", "8", "train.py"],
            "torchrun",
        ),
        (["python", "-mtorch.distributed.run", "train.py"], "torchrun"),
        (["python", "-um", "torch.distributed.launch", "train.py"], "torchrun"),
        (["python", "-W", "ignore", "-X", "faulthandler", "-m", "torch.distributed.run"], "torchrun"),
        (["/venv/bin/python3", "/venv/bin/torchrun", "--standalone", "train.py"], "torchrun"),
        (["/venv/bin/python", "/venv/bin/deepspeed", "--num_gpus=8", "train.py"], "deepspeed"),
        (["python", "-u", "-m", "deepspeed.launcher.launch", "--world_info=e30="], "deepspeed"),
        (["/venv/bin/python", "/venv/bin/accelerate", "launch", "x.py"], "accelerate"),
        (["/venv/bin/python3", "/venv/bin/vllm", "serve", "meta-llama/Llama-3-8B"], "vllm"),
        (["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"], "vllm"),
        (["VLLM::EngineCore"], "vllm"),
        (["ray::RayWorkerWrapper.execute_method"], "ray"),
        (["python", "-m", "ipykernel_launcher", "-f", "/run/user/1000/kernel-1.json"], "jupyter"),
        (["/opt/conda/bin/python3.11", "train.py", "--lr", "3e-4"], "python"),
        (["python3", "-c", "import torch; torch.cuda.init()"], "python"),
        (["python", "-m", "my_pkg.train"], "python"),
        (["python3.13t", "--", "train.py"], "python"),
        (["/usr/bin/bash", "run.sh"], None),
        (["./my_cuda_app"], None),
        ([], None),
    ],
)
def test_launcher(proc: FakeProc, argv: list[str], launcher: str | None) -> None:
    proc.add(100, [], argv)
    assert proc.detect([100]).launcher == launcher


def test_launcher_of_a_worker_comes_from_its_parent(proc: FakeProc, base: Path) -> None:
    # NVML lists the workers (`python -u train.py`), not torchrun; the nearest ancestors name the launcher
    sp = venv(base, "v", "torch-2.3.1.dist-info")
    proc.add(1, [], ["/usr/lib/systemd/systemd"], uid=0, ppid=0)
    proc.add(500, [], ["slurmstepd: [77.0]"], uid=0, ppid=1)
    proc.add(501, [], ["/venv/bin/python", "/venv/bin/torchrun", "--nproc-per-node=2", "train.py"], ppid=500)
    for pid in (502, 503):
        proc.add(pid, torch_libs(sp), ["/venv/bin/python", "-u", "train.py", "--local-rank=0"], ppid=501)
    det = proc.detect([502, 503], uid=UID)
    assert (det.launcher, det.pids_seen, det.problems) == ("torchrun", 2, ())


def test_launcher_walk_stops_at_another_users_process(proc: FakeProc) -> None:
    proc.add(600, [], ["torchrun", "train.py"], uid=0)  # not the job's user: not believed
    proc.add(601, [], ["python", "train.py"], ppid=600)
    assert proc.detect([601], uid=UID).launcher == "python"
    assert proc.detect([601]).launcher == "torchrun"  # no uid given: ancestors are read


def test_command_line_secrets_never_appear(proc: FakeProc, base: Path) -> None:
    sp = venv(base, "v", "torch-2.3.1.dist-info")
    secret = [
        "/venv/bin/python",
        "-m",
        "SECRETmodule",
        "--token=SECRET",
        "--hf-token",
        "hf_SECRET",
        "SECRET-torch-9.9.9.dist-info",
    ]
    proc.add(700, torch_libs(sp), secret)
    proc.add(701, [], ["SECRETprogram", "--password=SECRET"])
    proc.add(702, [], ["VLLM::SECRET"])
    det = proc.detect([700, 701, 702])
    assert det.framework == "pytorch" and det.pids_seen == 3
    assert "SECRET" not in repr(det) and "SECRET" not in repr(det.as_meta())


# -- whose processes, and how much is read ----------------------------------------------------------------


def test_uid_filter_skips_other_users_processes(proc: FakeProc, base: Path) -> None:
    sp = venv(base, "v", "torch-2.3.1.dist-info", "tensorflow-2.16.1.dist-info")
    proc.add(800, torch_libs(sp), uid=UID)
    proc.add(801, [sp / "tensorflow/libtensorflow_framework.so.2"], uid=1001)  # shares the GPU
    det = proc.detect([800, 801], uid=UID)
    assert (det.framework, det.others, det.pids_seen) == ("pytorch", (), 1)
    assert det.problems == ("pid 801: not owned by the job's user: skipped",)
    assert "1001" not in repr(det)
    assert proc.detect([800, 801]).others == ("tensorflow",)  # without a uid both are read


def test_unreadable_status_with_a_uid_filter_skips_the_pid(proc: FakeProc, base: Path) -> None:
    sp = venv(base, "v")
    d = proc.add(810, torch_libs(sp))
    (d / "status").unlink()
    (d / "status").mkdir()
    det = proc.detect([810], uid=UID)
    assert det.pids_seen == 0 and det.framework is None
    assert det.problems == ("pid 810: status is not a regular file: refused",)
    det = proc.detect([810])  # nobody's uid to check: the pid is read
    assert det.framework == "pytorch"
    assert det.problems == ("pid 810: status is not a regular file: refused: its parent is not looked at",)


def test_symlinked_maps_is_refused(proc: FakeProc, base: Path) -> None:
    sp = venv(base, "v")
    real = base / "fake-maps"
    real.write_text("".join(maps_line(str(p)) for p in torch_libs(sp)))
    d = proc.add(900, [])
    (d / "maps").unlink()
    (d / "maps").symlink_to(real)
    det = proc.detect([900])
    assert (det.framework, det.pids_seen, det.problems) == (None, 0, ("pid 900: maps is a symlink: refused",))


def test_symlinked_pid_dir_and_fifo_are_refused(proc: FakeProc, base: Path) -> None:
    d = proc.add(901, [])
    os.symlink(d, proc.root / "902")
    (d / "maps").unlink()
    os.mkfifo(d / "maps")  # would block a reader opening it without O_NONBLOCK
    det = proc.detect([901, 902])
    assert det.pids_seen == 0
    assert det.problems == (
        "pid 901: maps is not a regular file: refused",
        "pid 902: its /proc entry is a symlink or not a directory: refused",
    )


def test_huge_maps_is_read_up_to_the_cap(proc: FakeProc, base: Path) -> None:
    sp = venv(base, "v", "torch-2.3.1.dist-info", "tensorflow-2.16.1.dist-info")
    head = "".join(maps_line(str(p), i) for i, p in enumerate(torch_libs(sp)))
    filler = maps_line("/usr/lib/x86_64-linux-gnu/libfiller.so.1")
    body = filler * (10_000_000 // len(filler))
    tail = maps_line(str(sp / "tensorflow/libtensorflow_framework.so.2"))  # beyond 4 MiB: never seen
    data = (head + body + tail).encode()
    assert len(data) > 2 * MAPS_LIMIT
    proc.add(1000, maps=data)
    det = proc.detect([1000])
    assert (det.framework, det.framework_version, det.others) == ("pytorch", "2.3.1", ())
    assert det.problems == ("pid 1000: maps longer than 4 MiB: read the first part only",)


def test_vanished_pid_is_skipped_silently(proc: FakeProc, base: Path) -> None:
    sp = venv(base, "v", "torch-2.3.1.dist-info")
    proc.add(1100, torch_libs(sp))
    d = proc.add(1101, [])
    (d / "maps").unlink()  # the process exited between listing and reading
    det = proc.detect([1100, 1101, 1102])  # 1102 never existed
    assert (det.framework, det.pids_seen, det.problems) == ("pytorch", 1, ())


def test_kernel_threads_and_zombies_are_not_counted(proc: FakeProc) -> None:
    proc.add(1110, maps=b"", cmdline=())
    assert proc.detect([1110]).pids_seen == 0


def test_garbage_in_maps(proc: FakeProc, base: Path) -> None:
    sp = venv(base, "v", "torch-2.3.1.dist-info")
    garbage = (
        bytes(range(256)) * 20 + b"\n\xff\xfe /\x00\x00 a b c d /x\xff\xff.so\n" + b"x" * 100_000 + b"\n"
    )
    weird = maps_line(str(sp / "torch/lib/libtorch_cuda.so")).encode()
    odd = b"7f00-7f01 r-xp 0 0 0 /" + "é€\u2028".encode() + b"/../torch/lib/libc10.so (deleted)\n"
    proc.add(1200, maps=garbage + odd + weird + b"\x00" * 5000)
    det = proc.detect([1200])
    assert (det.framework, det.framework_version, det.pids_seen) == ("pytorch", "2.3.1", 1)


def test_deleted_libraries_still_count(proc: FakeProc, base: Path) -> None:
    sp = venv(base, "v", "torch-2.3.1.dist-info")  # pip upgraded under a running job
    proc.add(1210, maps=maps_line(f"{sp}/torch/lib/libtorch_cuda.so (deleted)").encode())
    assert proc.detect([1210]).framework_version == "2.3.1"


def test_max_pids(proc: FakeProc, base: Path) -> None:
    sp = venv(base, "v")
    for pid in range(1300, 1305):
        proc.add(pid, torch_libs(sp))
    det = proc.detect([1300, 1300, 1301, 1302, 1303, 1304], max_pids=2)
    assert det.pids_seen == 2 and det.problems == ("more than 2 pids: looked at the first 2 only",)
    det = detect(itertools.count(1300), proc_root=str(proc.root), max_pids=3)  # an endless iterable
    assert det.pids_seen == 3


def test_bad_pids_are_problems_not_exceptions(proc: FakeProc) -> None:
    det = proc.detect([0, -5, 1 << 40, True, "12"])  # type: ignore[list-item]
    assert det == Detection(None, None, (), None, 0, ("ignored an entry that is not a pid",))


def test_hostile_site_packages_is_capped(proc: FakeProc, base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(detect_mod, "MAX_DIR_ENTRIES", 100)
    sp = venv(base, "v", "torch-2.3.1.dist-info")
    for i in range(3000):
        (sp / f"junk{i}").touch()
    consumed: list[int] = []
    real_scandir = os.scandir

    def counting_scandir(path: int) -> Iterator[os.DirEntry[str]]:
        # count what the detector pulls from the directory; the entries themselves are real
        class Counted:
            def __init__(self) -> None:
                self.it = real_scandir(path)

            def __enter__(self) -> Counted:
                return self

            def __exit__(self, *exc: object) -> None:
                self.it.close()

            def __iter__(self) -> Iterator[os.DirEntry[str]]:
                for entry in self.it:
                    consumed.append(1)
                    yield entry

        return Counted()  # type: ignore[return-value]

    monkeypatch.setattr(detect_mod.os, "scandir", counting_scandir)
    proc.add(1400, torch_libs(sp))
    det = proc.detect([1400])
    assert det.framework == "pytorch" and det.framework_version in (None, "2.3.1")
    assert "an install directory has over 100 entries: read that many only" in det.problems
    assert len(consumed) <= 101


def test_install_dirs_listed_once_per_call(
    proc: FakeProc, base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sp = venv(base, "v", "torch-2.3.1.dist-info")
    listed: list[object] = []
    real_scandir = os.scandir

    def recording_scandir(path: int) -> object:
        listed.append(path)
        return real_scandir(path)

    monkeypatch.setattr(detect_mod.os, "scandir", recording_scandir)
    for pid in range(1500, 1508):
        proc.add(pid, torch_libs(sp))
    det = proc.detect(list(range(1500, 1508)))
    assert (det.framework_version, det.pids_seen, len(listed)) == ("2.3.1", 8, 1)


def test_symlink_in_an_install_path_is_not_followed(proc: FakeProc, base: Path) -> None:
    # maps paths are canonical; a symlink in one now means the path was swapped after the library was mapped
    real = venv(base, "real", "torch-2.3.1.dist-info")
    os.symlink(base / "real", base / "swapped")
    sp = base / "swapped" / real.relative_to(base / "real")
    proc.add(1600, torch_libs(sp))
    det = proc.detect([1600])
    assert (det.framework, det.framework_version) == ("pytorch", None)


def test_too_many_install_dirs(proc: FakeProc, base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(detect_mod, "MAX_DIRS", 2)
    libs = [venv(base, f"v{i}", "torch-2.3.1.dist-info") / "torch/lib/libtorch_cuda.so" for i in range(4)]
    proc.add(1700, libs)
    det = proc.detect([1700])
    assert det.framework_version == "2.3.1"
    assert det.problems == ("more than 2 install directories: versions not looked up in the rest",)


def test_problems_are_bounded(proc: FakeProc) -> None:
    for pid in range(1800, 1830):
        d = proc.add(pid, [])
        (d / "maps").unlink()
        (d / "maps").symlink_to("/etc/passwd")
    det = proc.detect(list(range(1800, 1830)))
    assert len(det.problems) == MAX_PROBLEMS and det.problems[-1] == "21 more problem(s) not shown"


def test_nothing_found(proc: FakeProc) -> None:
    proc.add(1900, ["/usr/lib/x86_64-linux-gnu/libssl.so.3"], ["/usr/bin/gromacs", "mdrun"])
    det = proc.detect([1900])
    assert det == Detection(None, None, (), None, 1, ()) and det.as_meta() == {}
    assert detect([], proc_root=str(proc.root)) == Detection(None, None, (), None, 0, ())
