"""Several nodes as a cluster starts them, simulated on one machine (CPU, gloo, the tiny model).

torchrun: one agent per "node", the agents meeting at a c10d rendezvous on loopback, each
starting one process; SLURM: the processes started by hand with the variables srun gives each
task. Either way the processes take their rank and the world's size from the environment, as
Lightning reads it, and must train as one process does (the same rows, the same losses) into
one run folder.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from benchmarks.meta_init_memory import free_port
from benchmarks.row_log import rows_by_step
from benchmarks.tiny_run import TINY_MODEL
from benchmarks.torchft_groups import Lighthouse, fault_run, final_weights, log_of, start_group
from callbacks.infrastructure.shared_folder import MARK
from common.errors import ConfigError
from common.external_launch import external_launch
from launch.from_config import read_settings
from launch.run_folder import shared_run_folder
from tests.layout_runs import STEPS, assert_one_process_s_steps, logged, one_process_runs, row_log
from tests.run_helpers import REPO, TINY, compose_config, run_train

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
#: Two nodes of one process each, FSDP2 over gloo.
TWO_NODES = [*TINY, *STEPS, "strategy=fsdp2", "trainer.accelerator=cpu", "trainer.devices=1", "trainer.num_nodes=2"]
TIMEOUT = 240


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    return one_process_runs(tmp_path_factory, TINY)


def agent_command(
    endpoint: str, node: int, run_id: str | None, root: Path, cache: Path, arguments: list[str], conf: str = ""
) -> list:
    """One node's torchrun agent starting one train.py process; node 0 hosts the rendezvous
    store, as the node a cluster's endpoint names does (``conf``: more ``--rdzv-conf`` keys)."""
    agent = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1", "--max-restarts=0"]
    agent += ["--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-conf=is_host={int(node == 0)}{conf}"]
    agent += [f"--rdzv-id={run_id}"] if run_id else []
    return [*agent, str(REPO / "train.py"), f"paths.root_dir={root}", f"paths.cache_dir={cache}", *arguments]


def torchrun_agents(
    arguments: list[str], root: Path, cache: Path, run_id: str | None = "run1", per_node: tuple = ([], [])
) -> list[tuple]:
    """Two torchrun agents, one per node, each starting one train.py process (``per_node``: each
    node's own extra arguments); their exit codes and output. The run folder is
    ``root/outputs/runs/default/torchrun-RUN_ID``."""
    endpoint = f"127.0.0.1:{free_port()}"
    agents = [
        subprocess.Popen(
            agent_command(endpoint, node, run_id, root, cache, [*arguments, *extra]),
            cwd=REPO,
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node, extra in enumerate(per_node)
    ]
    return [(agent.wait(timeout=TIMEOUT), agent.communicate()[0]) for agent in agents]


def srun_tasks(arguments: list[str], run_dir: Path, cache: Path) -> list[tuple]:
    """Two tasks of one SLURM job on two "nodes", started with the variables srun gives them."""
    port = free_port()
    tasks = []
    for rank in range(2):
        slurm = {
            "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NAME": "train",
            "SLURM_NTASKS": "2",
            "SLURM_NTASKS_PER_NODE": "1",
            "SLURM_TASKS_PER_NODE": "1(x2)",
            "SLURM_NNODES": "2",
            "SLURM_NODELIST": "localhost",
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        command = [sys.executable, str(REPO / "train.py"), f"hydra.run.dir={run_dir}", f"paths.cache_dir={cache}"]
        tasks.append(
            subprocess.Popen(
                [*command, *arguments],
                cwd=REPO,
                env={**ENV, **slurm},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    return [(task.wait(timeout=TIMEOUT), task.communicate()[0]) for task in tasks]


def assert_all_ended(ended: list[tuple]) -> None:
    for code, output in ended:
        assert code == 0, output[-4000:]


@pytest.mark.parametrize(
    ("layout", "model_parallel"),
    [([], 1), (["strategy.tensor_parallel_size=2", "layout.sequence_parallel=false"], 2)],
    ids=["D2", "T2"],
)
def test_two_torchrun_nodes_train_as_one_process(one_process, layout, model_parallel, tmp_path, tmp_path_factory):
    """FSDP2 over two nodes (and tensor parallelism of 2 split across them): one process's rows
    and losses, in one run folder named for the rendezvous id, written by rank 0."""
    cache = tmp_path_factory.getbasetemp() / "cache"
    reference = one_process(())
    folder = tmp_path / "outputs" / "runs" / "default" / "torchrun-run1"
    ended = torchrun_agents([*TWO_NODES, *layout, *row_log(folder)], tmp_path, cache)
    assert_all_ended(ended)
    assert [path.name for path in (tmp_path / "outputs" / "runs" / "default").iterdir()] == ["torchrun-run1"]
    assert_one_process_s_steps(folder, reference, model_parallel=model_parallel, processes=2)
    assert len(list((folder / "checkpoints").glob("*.ckpt"))) >= 1
    assert not (folder / MARK).exists()  # the shared-folder check cleans up after itself


def test_a_checkpoint_moves_between_two_nodes_and_one_process(one_process, tmp_path, tmp_path_factory):
    """Elastic across nodes: a two-node run's sharded checkpoint at step 4 resumed on one
    process, and that run's checkpoint at step 8 resumed on two nodes again: every step on
    one process's rows, with its losses (reduction-order noise, 1e-5)."""
    cache = tmp_path_factory.getbasetemp() / "cache"
    every_2 = "callbacks.model_checkpoint.every_n_train_steps=2"
    runs = tmp_path / "outputs" / "runs" / "default"
    first = runs / "torchrun-first"
    assert_all_ended(torchrun_agents([*TWO_NODES, every_2, *row_log(first)], tmp_path, cache, "first"))
    middle = tmp_path / "one_process"
    resume = [f"ckpt_path={first / 'checkpoints' / 'step000004.ckpt'}", *row_log(middle)]
    one = [*TINY, *STEPS, "strategy=fsdp2", "trainer.accelerator=cpu", every_2, *resume]
    assert run_train(one, middle, cache).returncode == 0
    last = runs / "torchrun-last"
    back = [f"ckpt_path={middle / 'checkpoints' / 'step000008.ckpt'}", *row_log(last)]
    assert_all_ended(torchrun_agents([*TWO_NODES, *back], tmp_path, cache, "last"))
    steps, rows = one_process(())
    for folder, trained in ((middle, range(5, 11)), (last, range(9, 11))):
        assert rows_by_step(folder / "rows") == {step: rows[step] for step in trained}
        losses = {step: metrics["train/loss"] for step, metrics in logged(folder).items() if step in trained}
        assert losses == {step: pytest.approx(steps[step]["train/loss"], rel=1e-5) for step in trained}


def test_srun_tasks_on_two_nodes_train_as_one_process(one_process, tmp_path, tmp_path_factory):
    cache = tmp_path_factory.getbasetemp() / "cache"
    folder = tmp_path / "run"
    ended = srun_tasks([*TWO_NODES, *row_log(folder)], folder, cache)
    assert_all_ended(ended)
    assert_one_process_s_steps(folder, one_process(()), model_parallel=1, processes=2)


def test_torchrun_without_a_run_id_is_refused_before_the_rendezvous(tmp_path, tmp_path_factory):
    """Each process would name its own folder: one line, exit 2, on both nodes, nothing written."""
    ended = torchrun_agents(TWO_NODES, tmp_path, tmp_path_factory.getbasetemp() / "cache", run_id=None)
    assert [code for code, _ in ended] == [1, 1]  # the agents report their process's exit 2
    assert any("error: torchrun started 2 processes without a run id" in output for _, output in ended)
    assert not (tmp_path / "outputs").exists()


def test_a_run_folder_the_nodes_do_not_share_is_refused_on_every_node(tmp_path, tmp_path_factory):
    """Each node given a folder of its own (as a node-local disk would be): one line naming the
    ranks that do not see rank 0's folder, and every process ends with exit 2."""
    cache = tmp_path_factory.getbasetemp() / "cache"
    own = ([f"hydra.run.dir={tmp_path / 'node0'}"], [f"hydra.run.dir={tmp_path / 'node1'}"])
    ended = torchrun_agents(TWO_NODES, tmp_path, cache, per_node=own)
    assert [code for code, _ in ended] == [1, 1], [output[-3000:] for _, output in ended]
    errors = [line for _, output in ended for line in output.splitlines() if line.startswith("error: ")]
    assert errors == [
        f"error: the run folder {tmp_path / 'node0'} is not shared by the nodes: rank(s) [1] do not see what rank 0"
        " wrote there, and each rank writes its checkpoint shard into it; give hydra.run.dir a folder on a file"
        " system every node mounts (the same path on each)."
    ]


SRUN = {"SLURM_NTASKS": "8", "SLURM_PROCID": "0", "SLURM_JOB_NAME": "train", "SLURM_TASKS_PER_NODE": "4(x2)"}
TORCHRUN = {"RANK": "0", "GROUP_RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "8"}


@pytest.mark.parametrize(
    ("env", "overrides", "message"),
    [
        (
            TORCHRUN,
            ["trainer.devices=4", "trainer.num_nodes=1"],
            "trainer.devices=4 x trainer.num_nodes=1 is 4 processes, but torchrun started 8: set trainer.num_nodes=2"
            " trainer.devices=4 (processes per node).",
        ),
        (
            SRUN,
            ["trainer.devices=2", "trainer.num_nodes=4"],
            "trainer.devices=2, but srun started 4 processes on this node: set trainer.num_nodes=2 trainer.devices=4",
        ),
    ],
)
def test_a_config_that_disagrees_with_the_launch_is_one_line(env, overrides, message, tmp_path, monkeypatch):
    for key in ("RANK", "SLURM_NTASKS", "SLURM_PROCID", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    run = [*TINY, "strategy=fsdp2", "trainer.accelerator=cpu", "batch.global_batch_size=16", *overrides]
    settings = read_settings(compose_config(run, tmp_path))
    with pytest.raises(ConfigError) as error:
        settings.trainer.check_services(settings.run)
    assert message in str(error.value)


def test_a_layout_whose_models_straddle_nodes_is_one_line(tmp_path):
    """T = 2 over 2 nodes of 3 processes: the model on ranks 2-3 would span both nodes, the others not."""
    run = [*TINY, "strategy=fsdp2", "trainer.accelerator=cpu", "batch.global_batch_size=12"]
    nodes = ["trainer.num_nodes=2", "trainer.devices=3", "strategy.tensor_parallel_size=2"]
    with pytest.raises(ConfigError) as error:
        read_settings(compose_config([*run, *nodes], tmp_path))
    assert str(error.value).startswith(
        "strategy.tensor_parallel_size=2 x strategy.pipeline_parallel_size=1 = 2 ranks per model, but each of the"
        " 2 nodes runs 3 (trainer.devices): some models would straddle two nodes"
    )
    across = ["trainer.num_nodes=2", "trainer.devices=1", "strategy.tensor_parallel_size=2"]  # spans whole nodes
    read_settings(compose_config([*run, *across, "batch.global_batch_size=8"], tmp_path))


def test_the_launchers_are_told_apart_from_lightning_s_own_processes():
    assert external_launch({}) is None
    assert external_launch({"LOCAL_RANK": "1", "WORLD_SIZE": "2", "NODE_RANK": "0"}) is None  # Lightning's child
    assert external_launch({**TORCHRUN, "TORCHELASTIC_RUN_ID": "none"}).run_id is None  # torchrun's default id
    launched = external_launch({**SRUN, "SLURM_JOB_ID": "77"})
    assert (launched.launcher, launched.world_size, launched.local_world_size, launched.run_id) == ("srun", 8, 4, "77")
    assert external_launch({**SRUN, "SLURM_JOB_NAME": "bash"}) is None  # an interactive allocation's shell


def test_every_process_of_a_launch_is_given_one_run_folder(monkeypatch):
    for key, value in {**SRUN, "SLURM_JOB_ID": "77"}.items():
        monkeypatch.setenv(key, value)
    for key in TORCHRUN:
        monkeypatch.delenv(key, raising=False)
    assert shared_run_folder(["trainer.devices=4"]) == [
        "hydra.run.dir=${paths.output_dir}/runs/${experiment_name}/srun-77"
    ]
    assert shared_run_folder(["hydra.run.dir=/shared/run"]) == []  # the user named it
    assert shared_run_folder(["-m", "seed=1,2"]) == []  # a sweep's jobs have their own folders


def test_the_slurm_launcher_renders_one_job_of_two_nodes_by_four_tasks(tmp_path, monkeypatch):
    """`hydra/launcher=slurm` with trainer.num_nodes=2 and trainer.devices=4, rendered by submitit
    into the sbatch script a cluster would receive (a stand-in `srun` on the PATH: submitit
    refuses to build a SLURM executor without one; nothing is submitted)."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    import submitit
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "srun").write_text("#!/bin/sh\n")
    (tmp_path / "bin" / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    launch = ["-m", "hydra/launcher=slurm", "hydra.launcher.partition=gpu", "trainer=gpu", "strategy=fsdp2"]
    overrides = [*launch[1:], "trainer.devices=4", "trainer.num_nodes=2", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
    params = OmegaConf.to_container(cfg.hydra.launcher, resolve=False)
    params = {key: OmegaConf.select(cfg, f"hydra.launcher.{key}") for key in params if key != "_target_"}
    params["name"] = "train"  # ${hydra.job.name}, known only inside a run
    # As the launcher plugin builds its executor: max_num_timeout at init, the rest as parameters.
    executor = submitit.AutoExecutor(
        folder=tmp_path / "sweep" / ".submitit", cluster="slurm", slurm_max_num_timeout=params.pop("max_num_timeout")
    )
    shared = {"timeout_min", "cpus_per_task", "gpus_per_node", "tasks_per_node", "mem_gb", "nodes", "name"}
    del params["submitit_folder"]
    executor.update_parameters(**{key if key in shared else f"slurm_{key}": value for key, value in params.items()})
    script = executor._executor._make_submission_file_text("python -u -m submitit.core._submit FOLDER", "uid")
    for line in ("--nodes=2", "--ntasks-per-node=4", "--gpus-per-node=4", "--time=240", "--partition=gpu"):
        assert f"#SBATCH {line}\n" in script, script
    assert "\nsrun --unbuffered" in script  # srun starts the 8 tasks; Lightning reads their SLURM variables


def test_diloco_groups_on_their_own_addresses_train_one_model(tmp_path, tmp_path_factory):
    """Fault-tolerant DiLoCo with each group on a host of its own, simulated by loopback
    addresses: group 0 binds and advertises 127.0.0.2, group 1 127.0.0.3 (the docs' cross-host
    setting, `technique.diloco.torchft.host`); both end on the same weights."""
    cache = tmp_path_factory.getbasetemp() / "cache"
    run = fault_run(2, 16)
    with Lighthouse(min_replicas=2) as lighthouse:
        groups = [
            start_group(
                lighthouse, g, tmp_path / f"g{g}", cache, [*run, f"technique.diloco.torchft.host=127.0.0.{g + 2}"]
            )
            for g in (0, 1)
        ]
        codes = [group.wait(timeout=TIMEOUT) for group in groups]
    assert codes == [0, 0], [log_of(tmp_path / f"g{g}")[-3000:] for g in (0, 1)]
    weights = [final_weights(tmp_path / f"g{g}" / "checkpoints" / "last.ckpt") for g in (0, 1)]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][key], weights[1][key]) for key in weights[0])


def test_a_study_runs_and_resumes_through_submitit(tmp_path, tmp_path_factory):
    """A study's jobs submitted with submitit's local executor (the SLURM launcher's code path
    without SLURM) finish; the same command again skips the finished one and resumes the other
    from its checkpoint."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    folder = tmp_path / "study"
    study = ["-m", "+sweep=seesaw", "hydra/launcher=submitit_local", f"hydra.sweep.dir={folder}", *TINY_MODEL]
    study += [f"paths.cache_dir={tmp_path_factory.getbasetemp() / 'cache'}", "study.seeds=[1]", "token_budget=4096"]

    def run() -> str:
        result = subprocess.run([sys.executable, str(REPO / "train.py"), *study], cwd=REPO, env=ENV, timeout=TIMEOUT)
        assert result.returncode == 0
        return "".join(path.read_text() for path in sorted(folder.glob(".submitit/*/*_log.*")))

    run()
    assert (folder / "0" / "finished.yaml").is_file() and (folder / "1" / "finished.yaml").is_file()
    (folder / "1" / "finished.yaml").unlink()  # as if job 1 had been preempted after its last checkpoint
    logs = run()
    assert "skipped job 0: finished in an earlier run" in logs
    assert f"resuming job 1 from {folder / '1' / 'checkpoints' / 'last.ckpt'}" in logs
    assert (folder / "1" / "finished.yaml").is_file()


@pytest.mark.parametrize(
    ("signal_to_node_1", "because"), [("SIGKILL", "closed its connection"), ("SIGSTOP", "did not answer")]
)
def test_a_node_lost_mid_run_ends_the_other_in_one_line(signal_to_node_1, because, tmp_path, tmp_path_factory):
    """Node 1 killed (its sockets close) or frozen (silence) mid-run: node 0, which hosts the
    rendezvous as node 0 does on a cluster, ends within collective_timeout_s with one line
    naming the lost peer and exit code 4, not a traceback and not a hang."""
    timeout_s = 10
    endpoint, cache = f"127.0.0.1:{free_port()}", tmp_path_factory.getbasetemp() / "cache"
    paced = ["+callbacks.pace._target_=benchmarks.pace.Pace", "+callbacks.pace.seconds=0.2"]
    arguments = [*TWO_NODES, "trainer.max_steps=500", "callbacks.progress_bar.line_interval_s=1", *paced]
    arguments += [f"collective_timeout_s={timeout_s}"]
    logs = [tmp_path / "node0.log", tmp_path / "node1.log"]
    agents = [
        subprocess.Popen(
            agent_command(endpoint, node, "lost", tmp_path, cache, arguments),
            cwd=REPO,
            env=ENV,
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
        )
        for node, log in enumerate(logs)
    ]
    try:
        deadline = time.monotonic() + TIMEOUT
        while "| loss=" not in logs[0].read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        children = subprocess.run(["pgrep", "-P", str(agents[1].pid)], capture_output=True, text=True).stdout
        for pid in [agents[1].pid, *map(int, children.split())]:  # node 1: its agent and its process
            os.kill(pid, getattr(signal, signal_to_node_1))
        lost_at = time.monotonic()
        agents[0].wait(timeout=timeout_s + 30)
        ended_after = time.monotonic() - lost_at
    finally:
        for agent in agents:
            subprocess.run(["pkill", "-9", "-P", str(agent.pid)])
            agent.kill()
    output = logs[0].read_text()
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and because in errors[0], output[-3000:]
    assert errors[0].startswith("error: rank 0 of 2 (node 0) lost a peer at step ")
    assert "exitcode  : 4" in output and "[rank0]: Traceback" not in output
    assert ended_after < timeout_s + 15


def test_an_endpoint_nobody_listens_on_ends_within_its_read_timeout(tmp_path, tmp_path_factory):
    """torchrun's agent, not this framework, meets it, before any process starts: the documented
    limit is its traceback, whose last line names the endpoint, within read_timeout, not a hang."""
    port, read_timeout = free_port(), 3
    command = agent_command(
        f"127.0.0.1:{port}",
        1,
        "nobody",
        tmp_path,
        tmp_path_factory.getbasetemp() / "cache",
        TWO_NODES,
        conf=f",read_timeout={read_timeout}",
    )
    started = time.monotonic()
    result = subprocess.run(command, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=TIMEOUT)
    ended_after = time.monotonic() - started
    named = f"DistNetworkError: The client socket has timed out after {read_timeout}000ms while trying to connect to"
    assert result.returncode == 1 and f"{named} (127.0.0.1, {port})" in result.stderr, result.stderr[-3000:]
    assert "RendezvousConnectionError" in result.stderr.strip().splitlines()[-1]
    assert ended_after < read_timeout + 15 and not (tmp_path / "outputs").exists()


def test_a_collective_timeout_that_is_not_positive_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"^collective_timeout_s=0.0 must be > 0"):
        read_settings(compose_config([*TINY, "collective_timeout_s=0"], tmp_path))
